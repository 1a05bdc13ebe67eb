"""List, then watch from the list's resourceVersion: the informer loop, for the few objects
the operator and the activator follow outside kopf (the activator's replicas; workloads and
their endpoints in the activator). Blocking: each runs in a thread of its own."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import Any

from kubernetes import watch

log = logging.getLogger(__name__)

WATCH_SECONDS = 300  # each watch request's length; the watch then resumes where it was

Obj = dict[str, Any]


def follow(
    what: str,
    list_fn: Callable[..., Any],
    *args: Any,
    listed: Callable[[list[Obj]], None],
    changed: Callable[[str, Obj], None],
    stop: threading.Event,
    **kwargs: Any,
) -> None:
    """`listed` gets every object at each list; `changed` each event after it (ADDED,
    MODIFIED, DELETED), until `stop` is set. A watch that expires or fails lists again (after
    a second, for a failure), so `listed` is always the whole truth."""
    while not stop.is_set():
        try:
            response = list_fn(*args, _preload_content=False, **kwargs)
            body = json.loads(response.data)
            listed(body.get("items") or [])
            version = body["metadata"]["resourceVersion"]
            while not stop.is_set():
                for event in watch.Watch().stream(
                    list_fn,
                    *args,
                    resource_version=version,
                    timeout_seconds=WATCH_SECONDS,
                    allow_watch_bookmarks=True,
                    deserialize=False,
                    # a quiet watch sends nothing for minutes: no read timeout short of its end
                    _request_timeout=(10, WATCH_SECONDS + 30),
                    **kwargs,
                ):
                    obj = event["object"]
                    version = obj["metadata"]["resourceVersion"]
                    if event["type"] != "BOOKMARK":
                        changed(event["type"], obj)
                    if stop.is_set():
                        return
        except Exception as exc:  # expired (410), the API server gone or refusing
            log.warning("watching %s: %s; listing again", what, exc)
            stop.wait(1.0)


class Store:
    """The objects a watch shows, by namespace and name, kept as `follow` hands them over:
    safe to read from any thread; `then` is called after every change (in the watch's
    thread)."""

    def __init__(self, then: Callable[[], None] = lambda: None) -> None:
        self._objects: dict[tuple[str, str], Obj] = {}
        self._lock = threading.Lock()
        self._then = then

    @staticmethod
    def _key(obj: Obj) -> tuple[str, str]:
        meta = obj.get("metadata") or {}
        return meta.get("namespace", ""), meta.get("name", "")

    def listed(self, items: list[Obj]) -> None:
        with self._lock:
            self._objects = {self._key(o): o for o in items}
        self._then()

    def changed(self, kind: str, obj: Obj) -> None:
        with self._lock:
            if kind == "DELETED":
                self._objects.pop(self._key(obj), None)
            else:
                self._objects[self._key(obj)] = obj
        self._then()

    def objects(self) -> list[Obj]:
        with self._lock:
            return list(self._objects.values())


def start(target: Callable[[], None], name: str) -> threading.Thread:
    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    return thread
