"""The inference server of every Ready emulated pod: an OpenAI-compatible HTTP endpoint at the
pod's own IP and port (kwok gives pods loopback IPs, so they are reachable on this host).

`/v1/completions` and `/v1/chat/completions`, streamed (server-sent events, as vLLM sends
them) or not, `/v1/models` and `/health`. The answer is the prompt's words, cycled to
`max_tokens` tokens, one every `token-seconds` (annotation `gpusim.gpusizer.io/token-seconds`,
default 0.02 s): a request's latency is max_tokens x token-seconds. Every request served is
counted per workload and per `X-Request-Id`, so a test can tell a request served twice.

Runs its own event loop in a thread; `update()` is called after every tick with the pods that
are Ready, and opens or closes their listeners.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from e2e.gpusim.cluster import WorkloadKey

log = logging.getLogger(__name__)

TOKEN_SECONDS = "gpusim.gpusizer.io/token-seconds"
DEFAULT_TOKEN_SECONDS = 0.02
DEFAULT_MAX_TOKENS = 16


@dataclass(frozen=True)
class ServingPod:
    """A Ready pod's server: where it listens and how it answers."""

    uid: str
    address: str
    port: int
    workload: WorkloadKey
    model: str
    token_seconds: float
    running_since: float = 0.0
    """When its container started: of two pods at one address, the later one serves."""


def one_per_address(pods: Iterable[ServingPod]) -> dict[str, ServingPod]:
    """uid -> pod, keeping at each address the pod that started last. kwok hands a deleted
    pod's IP to a new pod, possibly before the emulator has seen the deletion: the old pod's
    listener would hold the address and answer, counted, for the wrong workload."""
    newest: dict[tuple[str, int], ServingPod] = {}
    for pod in pods:
        known = newest.get((pod.address, pod.port))
        if known is None or pod.running_since > known.running_since:
            newest[(pod.address, pod.port)] = pod
    return {pod.uid: pod for pod in newest.values()}


def answer_tokens(prompt: str, max_tokens: int) -> list[str]:
    """What the emulated model says: the prompt's words, cycled to max_tokens tokens."""
    words = prompt.split() or ["token"]
    return [f" {words[i % len(words)]}" for i in range(max_tokens)]


def prompt_of(body: dict[str, Any], chat: bool) -> str:
    if not chat:
        prompt = body.get("prompt", "")
        return " ".join(prompt) if isinstance(prompt, list) else str(prompt)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not isinstance(messages[-1], dict):
        raise ValueError("messages: required, a non-empty list of {role, content}")
    return str(messages[-1].get("content", ""))


class Served:
    """What the endpoints served, per workload: requests, and how often each request id."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: collections.Counter[WorkloadKey] = collections.Counter()
        self.ids: dict[WorkloadKey, collections.Counter[str]] = {}

    def count(self, workload: WorkloadKey, request_id: str | None) -> None:
        with self._lock:
            self.requests[workload] += 1
            if request_id:
                self.ids.setdefault(workload, collections.Counter())[request_id] += 1

    def describe(self, workload: WorkloadKey) -> dict[str, Any]:
        with self._lock:
            ids = self.ids.get(workload, collections.Counter())
            return {
                "httpRequests": self.requests[workload],
                "httpDuplicates": sorted(i for i, n in ids.items() if n > 1),
            }

    def forget(self, namespace: str) -> None:
        with self._lock:
            for key in [k for k in self.requests if k[0] == namespace]:
                del self.requests[key]
            for key in [k for k in self.ids if k[0] == namespace]:
                del self.ids[key]


class OpenAIEndpoints:
    def __init__(self, served: Served) -> None:
        self.served = served
        self._loop = asyncio.new_event_loop()
        self._servers: dict[str, tuple[ServingPod, asyncio.Server]] = {}
        self._web = web.Server(
            self._handle, handler_cancellation=True, access_log=None, loop=self._loop
        )
        self._thread = threading.Thread(target=self._loop.run_forever, name="openai", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def update(self, pods: Iterable[ServingPod]) -> None:
        """The pods that serve now: listeners open for new ones, close for those gone."""
        asyncio.run_coroutine_threadsafe(self._sync(list(pods)), self._loop).result(timeout=30)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)

    async def _stop(self) -> None:
        await self._sync([])
        await self._web.shutdown(1.0)

    async def _sync(self, pods: Sequence[ServingPod]) -> None:
        wanted = one_per_address(pods)
        for uid in list(self._servers):
            pod, server = self._servers[uid]
            if wanted.get(uid) != pod:
                server.close()
                del self._servers[uid]
        for uid, pod in wanted.items():
            if uid in self._servers:
                continue
            try:
                server = await self._loop.create_server(
                    self._web, pod.address, pod.port, reuse_address=True
                )
            except OSError as exc:
                log.warning("pod %s: cannot serve on %s:%d: %s", uid, pod.address, pod.port, exc)
                continue
            self._servers[uid] = (pod, server)

    def _pod(self, request: web.BaseRequest) -> ServingPod | None:
        assert request.transport is not None
        address, port = request.transport.get_extra_info("sockname")[:2]
        for pod, _ in self._servers.values():
            if (pod.address, pod.port) == (address, port):
                return pod
        return None

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        pod = self._pod(request)
        if pod is None:
            return web.json_response({"error": {"message": "no pod here"}}, status=503)
        if request.path == "/health":
            return web.Response(text="")
        if request.path == "/v1/models":
            return web.json_response(
                {"object": "list", "data": [{"id": pod.model, "object": "model"}]}
            )
        chat = request.path == "/v1/chat/completions"
        if request.path != "/v1/completions" and not chat:
            return _error(404, f"no such path {request.path}")
        if request.method != "POST":
            return _error(405, f"{request.method} {request.path}: use POST")
        try:
            body = json.loads(await request.read())
            if not isinstance(body, dict):
                raise ValueError("the body must be a JSON object")
            prompt = prompt_of(body, chat)
            max_tokens = int(body.get("max_tokens") or DEFAULT_MAX_TOKENS)
            if not 1 <= max_tokens <= 4096:
                raise ValueError("max_tokens: must be within 1..4096")
        except ValueError as exc:
            return _error(400, str(exc))
        tokens = answer_tokens(prompt, max_tokens)
        request_id = request.headers.get("X-Request-Id")
        if body.get("stream"):
            stream = await self._stream(request, pod, tokens, chat)
            # counted before the end goes out: a client that has read it finds it counted
            self.served.count(pod.workload, request_id)
            await stream.write_eof()
            return stream
        await asyncio.sleep(pod.token_seconds * len(tokens))
        self.served.count(pod.workload, request_id)
        return web.json_response(_completion(pod.model, tokens, chat, len(prompt)))

    async def _stream(
        self, request: web.BaseRequest, pod: ServingPod, tokens: list[str], chat: bool
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        ident = f"cmpl-{uuid.uuid4().hex}"
        for i, token in enumerate(tokens):
            await asyncio.sleep(pod.token_seconds)
            last = i == len(tokens) - 1
            chunk = _chunk(ident, pod.model, token, chat, "length" if last else None)
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        return response


def _error(status: int, message: str) -> web.Response:
    return web.json_response(
        {"error": {"message": message, "type": "BadRequestError", "code": status}}, status=status
    )


def _completion(model: str, tokens: list[str], chat: bool, prompt_chars: int) -> dict[str, Any]:
    text = "".join(tokens)
    usage = {
        "prompt_tokens": max(1, prompt_chars // 4),
        "completion_tokens": len(tokens),
        "total_tokens": max(1, prompt_chars // 4) + len(tokens),
    }
    if chat:
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "finish_reason": "length",
        }
        kind = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "finish_reason": "length"}
        kind = "text_completion"
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": kind,
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": usage,
    }


def _chunk(ident: str, model: str, token: str, chat: bool, finish: str | None) -> dict[str, Any]:
    if chat:
        choice: dict[str, Any] = {"index": 0, "delta": {"content": token}, "finish_reason": finish}
        kind = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": token, "finish_reason": finish}
        kind = "text_completion"
    return {
        "id": ident,
        "object": kind,
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
    }
