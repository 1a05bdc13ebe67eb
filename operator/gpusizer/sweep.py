"""Pods kopf's cache still holds after they were deleted, left out of every decision.

kopf lists again when a watch breaks (an API server restart, an expired resourceVersion) but
never drops what the new list lacks: a pod deleted while the watch was down stays in its
indexes for the life of the process. In the soak one such pod counted as ready without
samples and held a workload's replicas for a quarter of an hour (bench/README.md, "Soak").
Every SWEEP_SECONDS the namespaces the cache holds pods in are listed (metadata only, in
pages), and the cached pods the API server no longer has are `gone`: `ClusterView` skips them.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from gpusizer.api.v1alpha1 import GROUP, PLURAL, VERSION
from gpusizer.kube import UNANSWERED, SaidOnce
from gpusizer.report import metrics
from gpusizer.signals.pods import PodInfo

log = logging.getLogger(__name__)

SWEEP_SECONDS = 60.0
PAGE = 500  # pods per list request: a namespace of thousands is not one large response
METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"

Lister = Callable[[Iterable[str]], set[str]]  # namespaces -> the uids of the objects they hold


def pod_uids(client: k8s.ApiClient, namespaces: Iterable[str], page_size: int = PAGE) -> set[str]:
    """Blocking: the uids of the pods in `namespaces`, as the API server has them now."""
    return listed_uids(k8s.CoreV1Api(client).list_namespaced_pod, namespaces, page_size)


def workload_uids(
    client: k8s.ApiClient, namespaces: Iterable[str], page_size: int = PAGE
) -> set[str]:
    """Blocking: the uids of the WorkloadSizings in `namespaces`, as the API server has them
    now (startup.Runtime.confirm_fleet)."""
    lister = functools.partial(
        k8s.CustomObjectsApi(client).list_namespaced_custom_object,
        group=GROUP,
        version=VERSION,
        plural=PLURAL,
    )
    return listed_uids(lister, namespaces, page_size)


def listed_uids(
    list_namespaced: Callable[..., Any], namespaces: Iterable[str], page_size: int
) -> set[str]:
    """Every page of each namespace's list, metadata only, read for its items' uids."""
    uids: set[str] = set()
    for namespace in namespaces:
        token: str | None = None
        while True:
            response = list_namespaced(
                namespace=namespace,
                limit=page_size,
                _continue=token,
                _preload_content=False,
                _headers={"Accept": METADATA_LIST},
            )
            page = json.loads(response.data)
            # a namespace with none: the API server's metadata-only list says "items": null
            items = page["items"] or ()
            uids.update(str((item.get("metadata") or {}).get("uid")) for item in items)
            token = (page.get("metadata") or {}).get("continue") or None
            if not token:
                break
    return uids


@dataclass
class PodSweep:
    """`gone`: the uids of the cached pods the API server no longer has, read live by every
    turn's `ClusterView`."""

    gone: set[str] = field(default_factory=set)

    def found(self, cached: Mapping[str, PodInfo], listed: set[str]) -> None:
        """`cached` (uid -> pod) was taken before the list began: a pod it holds that the
        list lacks was deleted, and one created since is in neither."""
        missed = {uid: pod for uid, pod in cached.items() if uid not in listed}
        new = sorted(f"{p.namespace}/{p.name}" for uid, p in missed.items() if uid not in self.gone)
        if new:
            log.warning(
                "%d pod(s) deleted while a watch was down are still in the watch's cache; "
                "left out of every decision: %s",
                len(new),
                ", ".join(new),
            )
        self.gone.clear()
        self.gone.update(missed)
        metrics.PODS_MISSED_DELETIONS.set(len(missed))

    async def run(
        self,
        cache: Mapping[str, Iterable[PodInfo]],
        lister: Lister,
        every: float = SWEEP_SECONDS,
    ) -> None:
        said = SaidOnce(log, "listing pods to find those the watch missed deleting")
        while True:
            await asyncio.sleep(every)
            # taken in the event loop, which alone changes kopf's indexes
            cached = {p.uid: p for pods in cache.values() for p in pods}
            namespaces = sorted(cache)
            try:
                listed = await asyncio.to_thread(lister, namespaces)
            except (ApiException, *UNANSWERED, ValueError, KeyError) as exc:
                said.failed(exc)
                continue
            except Exception:  # a bug: said, and the sweep goes on
                log.exception("the pod sweep failed; it runs again in %.0fs", every)
                continue
            said.succeeded()
            self.found(cached, listed)
