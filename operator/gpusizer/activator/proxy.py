"""The activator's HTTP side: one listener per workload port (what the operator's EndpointSlice
names), one shared port routed by Host, and the forwarding of each request to a ready replica,
its response streamed back chunk by chunk.

Requests and responses pass through unchanged but for hop-by-hop headers, and a request body
is read whole before it is held (bounded by `max_body_bytes`). A client that disconnects
cancels its handler (aiohttp's handler_cancellation): held, it leaves the queue; forwarded, the
upstream connection is closed, so the replica stops generating for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from gpusizer.activator import metrics
from gpusizer.activator.holding import RETRY_DRAINING_SECONDS, Refused, Workload
from gpusizer.activator.registry import Registry

log = logging.getLogger(__name__)

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
# aiohttp's client adds these when a request lacks them: a request passes through unchanged
NOT_ADDED = ("User-Agent", "Accept", "Accept-Encoding", "Content-Type")
ANSWER_SECONDS = 2.0  # at the end of a drain, for the requests refused to be answered
# a replica that refuses the connection is tried again this many times in all, the waits
# doubling from the backoff (0.05 + 0.1 + ... + 0.8 s)
CONNECT_ATTEMPTS = 6
CONNECT_BACKOFF_SECONDS = 0.05


@dataclass(frozen=True)
class ProxySettings:
    max_body_bytes: int = 4 * 1024 * 1024
    header_timeout_seconds: float = 10.0  # for a client's first request line and headers
    keepalive_seconds: float = 75.0  # an idle kept-alive client connection, then closed
    connect_timeout_seconds: float = 5.0  # to a replica


def end_to_end(headers: Mapping[str, str], drop: tuple[str, ...] = ()) -> CIMultiDict[str]:
    """The headers that pass a proxy: not the hop-by-hop ones, nor those `Connection` names."""
    named = {
        token.strip().lower()
        for key, value in headers.items()
        if key.lower() == "connection"
        for token in value.split(",")
    }
    dropped = HOP_BY_HOP | named | {d.lower() for d in drop}
    return CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in dropped)


def answer(status: int, why: str, kind: str, retry_after: int | None = None) -> web.Response:
    """The activator's own answer, in the shape of an OpenAI API error."""
    body = {"error": {"message": f"gpusizer activator: {why}", "type": kind, "code": status}}
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    return web.json_response(body, status=status, headers=headers)


class HeaderDeadline(asyncio.Protocol):
    """aiohttp's connection protocol, with a deadline on the first request's headers: a
    client that never finishes them is answered 408 and disconnected, instead of holding a
    connection for ever (later requests on the connection are bounded by the keep-alive
    timeout)."""

    def __init__(self, inner: asyncio.Protocol, seconds: float) -> None:
        self._inner = inner
        self._seconds = seconds
        self._tail = b""
        self._timer: asyncio.TimerHandle | None = None
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._timer = asyncio.get_running_loop().call_later(self._seconds, self._expired)
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._timer is not None:
            seen = self._tail + data
            if b"\r\n\r\n" in seen:
                self._timer.cancel()
                self._timer = None
            self._tail = seen[-3:]
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()

    def _expired(self) -> None:
        self._timer = None
        metrics.REFUSED.labels(reason="header_timeout").inc()
        why = f"gpusizer activator: no complete request headers within {self._seconds:g} s\n"
        assert self._transport is not None
        self._transport.write(
            b"HTTP/1.1 408 Request Timeout\r\nContent-Type: text/plain; charset=utf-8\r\n"
            b"Connection: close\r\nContent-Length: "
            + str(len(why)).encode()
            + b"\r\n\r\n"
            + why.encode()
        )
        self._transport.close()


class Proxy:
    def __init__(
        self,
        registry: Registry,
        settings: ProxySettings | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.registry = registry
        self.settings = settings or ProxySettings()
        self._clock = clock
        self._web = web.Server(
            self._handle,
            handler_cancellation=True,
            keepalive_timeout=self.settings.keepalive_seconds,
            access_log=None,
        )
        self._host = "0.0.0.0"
        self._shared: int | None = None
        self._listeners: dict[int, asyncio.Server] = {}
        self._session: aiohttp.ClientSession | None = None
        self.draining = False
        self.in_flight = 0  # workload requests being held, answered or forwarded
        self.forwarding = 0  # of which forwarded to a replica
        self.idle = asyncio.Event()  # set while in_flight is 0
        self.idle.set()
        self._only_forwarding = asyncio.Event()  # set while every request is being forwarded
        self._only_forwarding.set()

    def _count(self, in_flight: int = 0, forwarding: int = 0) -> None:
        self.in_flight += in_flight
        self.forwarding += forwarding
        for event, state in (
            (self.idle, self.in_flight == 0),
            (self._only_forwarding, self.in_flight == self.forwarding),
        ):
            if state:
                event.set()
            else:
                event.clear()

    async def start(self, host: str, shared_port: int | None) -> None:
        self._host, self._shared = host, shared_port
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, force_close=False),
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(
                total=None, connect=self.settings.connect_timeout_seconds
            ),
            skip_auto_headers=NOT_ADDED,
        )
        if shared_port is not None:
            await self._open(shared_port)

    def listened(self) -> frozenset[int]:
        return frozenset(self._listeners)

    async def listen(self, ports: frozenset[int]) -> None:
        """Listens on exactly these workload ports (and the shared one)."""
        for port in ports - self._listeners.keys():
            await self._open(port)
        for port in set(self._listeners) - ports - {self._shared}:
            self._listeners.pop(port).close()

    async def _open(self, port: int) -> None:
        try:
            self._listeners[port] = await asyncio.get_running_loop().create_server(
                lambda: HeaderDeadline(self._web(), self.settings.header_timeout_seconds),
                self._host,
                port,
                reuse_address=True,
            )
        except OSError as exc:
            log.error("cannot listen on %s:%d: %s", self._host, port, exc)

    async def stop(self, grace_seconds: float = 1.0) -> None:
        for server in self._listeners.values():
            server.close()
        self._listeners.clear()
        await self._web.shutdown(grace_seconds)
        if self._session is not None:
            await self._session.close()

    # --- a request --------------------------------------------------------------------------

    def _workload(self, request: web.BaseRequest) -> tuple[Workload | None, str]:
        assert request.transport is not None
        port = int(request.transport.get_extra_info("sockname")[1])
        if port == self._shared:
            return self.registry.by_host(request.host), f"no workload behind Host {request.host!r}"
        return self.registry.by_port(port), f"no workload on port {port}"

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        arrived = self._clock()
        workload, missing = self._workload(request)
        if workload is None:
            metrics.REFUSED.labels(reason="not_found").inc()
            return answer(404, f"{missing}: no WorkloadSizing routes it here", "not_found")
        route = workload.route
        if self.draining:
            metrics.REQUESTS.labels(route.namespace, route.name, "draining").inc()
            return answer(
                503,
                "this activator replica is shutting down: another one takes the request",
                "draining",
                RETRY_DRAINING_SECONDS,
            )
        self._count(in_flight=1)
        try:
            return await self._serve(request, workload, arrived)
        except asyncio.CancelledError:
            metrics.REQUESTS.labels(route.namespace, route.name, "client_gone").inc()
            raise
        finally:
            self._count(in_flight=-1)

    async def _serve(
        self, request: web.BaseRequest, workload: Workload, arrived: float
    ) -> web.StreamResponse:
        route = workload.route
        body = await self._body(request)
        if body is None:
            metrics.REFUSED.labels(reason="too_large").inc()
            response = answer(
                413,
                f"the request body is over the activator's limit of "
                f"{self.settings.max_body_bytes} bytes",
                "request_too_large",
            )
            response.force_close()  # the rest of the body is not read
            return response
        backend, outcome = workload.backend(), "proxied"
        if backend is None:
            try:
                backend, outcome = await workload.hold(arrived), "released"
            except Refused as refused:
                return _refused(workload, refused)
            finally:
                waited = self._clock() - arrived
                metrics.HOLD_SECONDS.labels(route.namespace, route.name).observe(waited)
        return await self._forward(request, body, workload, backend, outcome, arrived)

    async def _body(self, request: web.BaseRequest) -> bytes | None:
        """The whole body, or None when it is over the limit (told by Content-Length before
        anything is read, else as soon as it is)."""
        limit = self.settings.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            return None
        body = bytearray()
        async for chunk in request.content.iter_any():
            body += chunk
            if len(body) > limit:
                return None
        return bytes(body)

    async def _forward(
        self,
        request: web.BaseRequest,
        body: bytes,
        workload: Workload,
        backend: str,
        outcome: str,
        arrived: float,
    ) -> web.StreamResponse:
        """To `backend`, or on to the next ready replica when it cannot be reached (nothing
        was sent then); the response streamed back as it comes."""
        self._count(forwarding=1)
        try:
            assert self._session is not None
            route = workload.route
            headers = end_to_end(request.headers, drop=("Content-Length",))
            tried, prepared = 0, False
            while True:
                try:
                    async with self._session.request(
                        request.method,
                        f"http://{backend}{request.raw_path}",
                        headers=headers,
                        data=body,
                        allow_redirects=False,
                    ) as upstream:
                        response = web.StreamResponse(
                            status=upstream.status,
                            reason=upstream.reason,
                            headers=end_to_end(upstream.headers, drop=("Content-Length",)),
                        )
                        if upstream.content_length is not None:
                            response.content_length = upstream.content_length
                        await response.prepare(request)
                        prepared = True
                        async for chunk in upstream.content.iter_any():
                            await response.write(chunk)
                        await response.write_eof()
                except aiohttp.ClientConnectorError as exc:
                    # nothing was sent: a replica just marked ready may not listen yet, or one
                    # just went; the request waits (within its hold timeout) and tries again
                    tried += 1
                    if tried >= CONNECT_ATTEMPTS:
                        return self._bad_gateway(route.namespace, route.name, backend, exc)
                    await asyncio.sleep(CONNECT_BACKOFF_SECONDS * 2 ** (tried - 1))
                    try:
                        backend = workload.backend() or await workload.hold(arrived)
                    except Refused as refused:
                        return _refused(workload, refused)
                    continue
                except (aiohttp.ClientError, TimeoutError) as exc:
                    if prepared:
                        metrics.REQUESTS.labels(route.namespace, route.name, "bad_gateway").inc()
                        raise  # the response had started: the client sees the connection end
                    return self._bad_gateway(route.namespace, route.name, backend, exc)
                metrics.REQUESTS.labels(route.namespace, route.name, outcome).inc()
                return response
        finally:
            self._count(forwarding=-1)

    @staticmethod
    def _bad_gateway(namespace: str, name: str, backend: str, exc: Exception) -> web.Response:
        metrics.REQUESTS.labels(namespace, name, "bad_gateway").inc()
        return answer(502, f"{namespace}/{name}'s replica {backend}: {exc}", "bad_gateway")

    # --- stopping -------------------------------------------------------------------------

    async def drain(self, deadline: float) -> None:
        """SIGTERM: new requests are refused (another replica takes them); those held wait for
        a replica until `deadline` (wall clock), then are answered 503; those forwarded may
        finish until then."""
        self.draining = True
        remaining = deadline - self._clock()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(0.0, remaining)):
                await self.idle.wait()
        for workload in list(self.registry.workloads.values()):
            workload.stop(
                f"this activator replica stopped before {workload.route.namespace}/"
                f"{workload.route.name} had a ready replica: another one takes the request"
            )
        # the refused ones are answered before the connections close; forwards still
        # streaming at the deadline are cut
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(ANSWER_SECONDS):
                await self._only_forwarding.wait()


def _refused(workload: Workload, refused: Refused) -> web.Response:
    metrics.REQUESTS.labels(workload.route.namespace, workload.route.name, refused.outcome).inc()
    return answer(refused.status, refused.why, refused.outcome, refused.retry_after)
