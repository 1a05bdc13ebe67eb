"""A load generator that reaches a Service as kube-proxy routes it, and checks every answer.

kube-proxy keys a Service's EndpointSlices by its `kubernetes.io/service-name` label and
merges the endpoints of all of them, whoever manages them (`ready` unset counts as ready), at
the port whose name is the Service port's (reference/real-components.md section 4). This
does the same from a watch of the slices, and picks a ready endpoint at random for each
connection. Every address it sends to is a pod's or the activator's, inside 127.0.0.0/8.

Each request asks the emulated OpenAI API for a completion, streamed or not, and its answer
is checked against what the emulator says for that prompt (gpusim/openai.py).
"""

from __future__ import annotations

import asyncio
import functools
import json
import random
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from gpusizer.activation import MANAGED_BY_LABEL, ready_addresses
from gpusizer.watches import Store, follow, start
from kubernetes import client as k8s

from e2e.gpusim.openai import answer_tokens

MAX_TOKENS = 8


@dataclass
class Answer:
    """One request as its client saw it."""

    rid: str
    stream: bool
    started: float  # wall clock, when it was first sent
    status: int | None = None  # of the last attempt; None when it got no HTTP answer
    ok: bool = False  # a complete, correct completion
    error: str = ""  # what went wrong, if anything
    attempts: int = 0
    endpoints: list[str] = field(default_factory=list)  # where each attempt went
    first_byte: float | None = None  # wall clock
    ended: float | None = None
    retry_after: str | None = None


class ServiceEndpoints:
    """A Service's ready endpoints, from a watch of its EndpointSlices, as kube-proxy has
    them: `pick()` one at random."""

    def __init__(
        self, api_client: k8s.ApiClient, namespace: str, service: str, port_name: str
    ) -> None:
        self._port_name = port_name
        self._slices = Store()
        self._stop = threading.Event()
        discovery = k8s.DiscoveryV1Api(api_client)
        start(
            functools.partial(
                follow,
                f"the EndpointSlices of Service {namespace}/{service}",
                discovery.list_namespaced_endpoint_slice,
                namespace,
                label_selector=f"kubernetes.io/service-name={service}",
                listed=self._slices.listed,
                changed=self._slices.changed,
                stop=self._stop,
            ),
            f"endpoints-{service}",
        )

    def ready(self) -> list[str]:
        """Every ready "address:port" of every slice, merged."""
        found = []
        for obj in self._slices.objects():
            ports = {p.get("name") or "": p.get("port") for p in obj.get("ports") or []}
            port = ports.get(self._port_name)
            if port is not None:
                found += [f"{a}:{port}" for a in ready_addresses(obj)]
        return sorted(found)

    def managers(self) -> set[str]:
        """Who manages the slices that have endpoints now."""
        return {
            (o["metadata"].get("labels") or {}).get(MANAGED_BY_LABEL, "")
            for o in self._slices.objects()
            if o.get("endpoints")
        }

    def pick(self) -> str | None:
        ready = self.ready()
        return random.choice(ready) if ready else None

    def stop(self) -> None:
        self._stop.set()


def expected_text(rid: str) -> str:
    return "".join(answer_tokens(prompt_for(rid), MAX_TOKENS))


def prompt_for(rid: str) -> str:
    return f"request {rid} says hello"


def _check(answer: Answer, body: bytes, chat: bool) -> None:
    """Whether the completion is complete and is the one asked for."""
    text = body.decode(errors="replace")
    if answer.stream:
        events = [line[6:] for line in text.split("\n\n") if line.startswith("data: ")]
        if not events or events[-1] != "[DONE]":
            answer.error = f"stream ended without [DONE] after {len(events)} events"
            return
        chunks = [json.loads(e)["choices"][0] for e in events[:-1]]
        got = "".join(c["delta"]["content"] if chat else c["text"] for c in chunks)
    else:
        choice = json.loads(text)["choices"][0]
        got = choice["message"]["content"] if chat else choice["text"]
    if got != expected_text(answer.rid):
        answer.error = f"wrong completion {got[:60]!r}"
        return
    answer.ok = True


RETRIED = (408, 429, 500, 502, 503, 504)  # as the OpenAI SDK retries


async def send(
    session: aiohttp.ClientSession,
    endpoints: ServiceEndpoints | Sequence[str],
    rid: str,
    *,
    stream: bool,
    chat: bool = False,
    retries: int = 0,
    host: str = "chat",
) -> Answer:
    """One completion request, to a ready endpoint picked as kube-proxy would (or to one of
    the addresses given), retried like the OpenAI SDK (`retries` times, after Retry-After,
    on the statuses it retries and on a connection that fails)."""
    answer = Answer(rid, stream, started=time.time())
    path = "/v1/chat/completions" if chat else "/v1/completions"
    body: dict[str, Any] = {"model": "m", "max_tokens": MAX_TOKENS, "stream": stream}
    if chat:
        body["messages"] = [{"role": "user", "content": prompt_for(rid)}]
    else:
        body["prompt"] = prompt_for(rid)
    while True:
        answer.attempts += 1
        endpoint = (
            endpoints.pick()
            if isinstance(endpoints, ServiceEndpoints)
            else random.choice(list(endpoints))
        )
        if endpoint is None:
            answer.error = "no ready endpoint: kube-proxy would reject the connection"
        else:
            answer.endpoints.append(endpoint)
            await _attempt(session, endpoint, path, body, answer, chat, host)
        if answer.ok or answer.attempts > retries:
            break
        retryable = answer.status is None or answer.status in RETRIED
        if not retryable:
            break
        await asyncio.sleep(min(float(answer.retry_after or 0.5), 5.0))
    answer.ended = time.time()
    return answer


async def _attempt(
    session: aiohttp.ClientSession,
    endpoint: str,
    path: str,
    body: Mapping[str, Any],
    answer: Answer,
    chat: bool,
    host: str,
) -> None:
    answer.status, answer.error, answer.retry_after = None, "", None
    try:
        async with session.post(
            f"http://{endpoint}{path}",
            json=body,
            headers={"X-Request-Id": answer.rid, "Host": host, "Connection": "close"},
        ) as response:
            answer.status = response.status
            answer.retry_after = response.headers.get("Retry-After")
            received = bytearray()
            async for chunk in response.content.iter_any():
                if answer.first_byte is None:
                    answer.first_byte = time.time()
                received += chunk
        if answer.status != 200:
            answer.error = (
                f"HTTP {answer.status}: {bytes(received)[:1000].decode(errors='replace')}"
            )
            return
        _check(answer, bytes(received), chat)
    except (aiohttp.ClientError, OSError, json.JSONDecodeError, KeyError) as exc:
        answer.error = f"{type(exc).__name__}: {exc}"


def summary(answers: Sequence[Answer]) -> dict[str, Any]:
    """How many were answered well, and what the others saw, by kind."""
    seen: dict[str, int] = {}
    for a in answers:
        if not a.ok:
            kind = a.error.split(":", 1)[0] if a.error else f"HTTP {a.status}"
            seen[kind] = seen.get(kind, 0) + 1
    return {"requests": len(answers), "ok": sum(a.ok for a in answers), "failed": seen}
