"""The activator, in process, on loopback: requests held while a workload has no ready
replica and forwarded in arrival order once it has one, streamed through as they come; the
bounds; the bad input; the drain. The watches are fed by hand, the push goes to a list."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from gpusizer.activator import metrics as activator_metrics
from gpusizer.activator.main import Activator, ActivatorSettings
from gpusizer.activator.proxy import ProxySettings
from gpusizer.activator.pusher import Pusher
from gpusizer.activator.registry import Registry, host_key
from gpusizer.api.annotations import HeldRecord, held_key
from prometheus_client import generate_latest

from tests.support import free_port

NS, NAME = "llm", "chat"
LOOPBACK = "127.0.0.1"


def sizing(
    port: int,
    *,
    max_pending: int = 1000,
    hold: int = 600,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A WorkloadSizing that uses the activator, with the port the operator gave it."""
    return {
        "metadata": {"namespace": NS, "name": NAME, "annotations": annotations or {}},
        "spec": {
            "targetRef": {"name": NAME},
            "replicas": {"min": 0, "max": 2, "targetGPUUtilization": 70},
            "scaleToZero": {
                "enabled": True,
                "activator": {
                    "enabled": True,
                    "maxPendingRequests": max_pending,
                    "holdTimeoutSeconds": hold,
                },
            },
        },
        "status": {"activator": {"port": port, "servicePort": "http"}},
    }


def pod_slice(port: int, ready: bool = True, address: str = LOOPBACK) -> dict[str, Any]:
    """The EndpointSlice the endpointslice controller keeps for the Service's pods."""
    return {
        "metadata": {
            "namespace": NS,
            "name": f"{NAME}-pods",
            "labels": {"kubernetes.io/service-name": NAME},
        },
        "ports": [{"name": "metrics", "port": 1}, {"name": "http", "port": port}],
        "endpoints": [{"addresses": [address], "conditions": {"ready": ready}}],
    }


@dataclass
class Backend:
    """A replica's server: records each request's id as it arrives; a streamed answer sends
    one chunk, then waits for `go` before the rest."""

    port: int = field(default_factory=free_port)
    arrived: list[str] = field(default_factory=list)
    go: asyncio.Event = field(default_factory=asyncio.Event)
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    runner: web.ServerRunner | None = None

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        self.arrived.append(request.headers.get("X-Request-Id", ""))
        body = json.loads(await request.read())
        if not body.get("stream"):
            return web.json_response({"echo": body["prompt"], "path": request.path})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            await response.write(b'data: {"text": "first"}\n\n')
            await self.go.wait()
            await response.write(b'data: {"text": "second"}\n\ndata: [DONE]\n\n')
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        await response.write_eof()
        return response

    async def start(self) -> None:
        self.runner = web.ServerRunner(web.Server(self.handle, handler_cancellation=True))
        await self.runner.setup()
        await web.TCPSite(self.runner, LOOPBACK, self.port).start()


@dataclass
class Harness:
    activator: Activator
    backend: Backend
    port: int  # the workload's activator port
    pushed: list[tuple[str, str, dict[str, str | None]]]
    session: aiohttp.ClientSession

    @property
    def workload(self) -> Any:
        return self.activator.registry.workloads[(NS, NAME)]

    def url(self, path: str = "/v1/completions", port: int | None = None) -> str:
        return f"http://{LOOPBACK}:{port or self.port}{path}"

    async def post(self, rid: str, stream: bool = False, **kw: Any) -> tuple[int, str, Any]:
        body = {"model": "m", "prompt": f"hello {rid}", "stream": stream}
        async with self.session.post(
            self.url(), json=body, headers={"X-Request-Id": rid}, **kw
        ) as response:
            return response.status, await response.text(), response.headers

    def replica_ready(self, ready: bool = True) -> None:
        self.activator.registry.slice_changed("MODIFIED", pod_slice(self.backend.port, ready))

    async def until(self, check: Callable[[], bool], what: str) -> None:
        """Polls the activator's in-process state (held, listening, draining), which moves
        on the loop's own passes: a condition with a deadline, not a timed wait."""
        try:
            async with asyncio.timeout(10):
                while not check():  # noqa: ASYNC110
                    await asyncio.sleep(0.005)
        except TimeoutError:
            raise AssertionError(f"timed out waiting for {what}") from None


async def held(harness: Harness, count: int) -> None:
    await harness.until(lambda: harness.workload.pending == count, f"{count} held")


@contextlib.asynccontextmanager
async def running(
    *, max_pending: int = 1000, hold: int = 600, drain: float = 0.0, header_timeout: float = 10
) -> AsyncIterator[Harness]:
    pushed: list[tuple[str, str, dict[str, str | None]]] = []

    async def patch(namespace: str, name: str, annotations: dict[str, str | None]) -> None:
        pushed.append((namespace, name, annotations))

    settings = ActivatorSettings(
        replica="activator-0",
        address=LOOPBACK,
        shared_port=free_port(),
        drain_seconds=drain,
        proxy=ProxySettings(max_body_bytes=1024, header_timeout_seconds=header_timeout),
    )
    activator = Activator(settings, patch)
    await activator.start()
    port = free_port()
    activator.registry.workloads_listed([sizing(port, max_pending=max_pending, hold=hold)])
    activator.registry.slices_listed([])
    backend = Backend()
    await backend.start()
    session = aiohttp.ClientSession()
    harness = Harness(activator, backend, port, pushed, session)
    try:
        await harness.until(lambda: port in activator.proxy.listened(), "the workload's port")
        assert activator.ready()
        yield harness
    finally:
        backend.go.set()
        await session.close()  # its kept-alive connections would hold up the stop
        await activator.drain_and_stop()
        assert backend.runner is not None
        await backend.runner.cleanup()


async def gather_in_order(calls: list[Callable[[], Awaitable[Any]]], harness: Harness) -> list[Any]:
    """Starts each call once the one before it is held: the arrival order is the list's."""
    tasks = []
    for i, call in enumerate(calls):
        tasks.append(asyncio.ensure_future(call()))
        await held(harness, i + 1)
    return tasks


async def test_requests_held_at_zero_go_out_in_arrival_order_once_a_replica_is_ready() -> None:
    async with running() as harness:
        ids = [f"r{i}" for i in range(8)]
        tasks = await gather_in_order([lambda r=r: harness.post(r) for r in ids], harness)
        assert harness.backend.arrived == []
        harness.replica_ready()
        answers = await asyncio.gather(*tasks)
        assert [(s, json.loads(t)["echo"]) for s, t, _ in answers] == [
            (200, f"hello {r}") for r in ids
        ]
        assert harness.backend.arrived == ids
        assert harness.workload.pending == 0


async def test_the_first_request_held_is_pushed_at_once_and_the_last_one_leaving_too() -> None:
    async with running() as harness:
        started = time.time()
        task = asyncio.ensure_future(harness.post("r0"))
        await harness.until(lambda: len(harness.pushed) == 1, "the first push")
        namespace, name, annotations = harness.pushed[0]
        record = HeldRecord.model_validate_json(annotations[held_key("activator-0")] or "")
        assert (namespace, name, record.pending) == (NS, NAME, 1)
        assert time.time() - started < 5
        harness.replica_ready()
        assert (await task)[0] == 200
        await harness.until(lambda: len(harness.pushed) == 2, "the push that nothing is held")
        assert harness.pushed[1][2] == {held_key("activator-0"): None}


async def test_a_streamed_response_passes_through_as_it_comes() -> None:
    async with running() as harness:
        harness.replica_ready()
        body = {"model": "m", "prompt": "hi", "stream": True}
        async with harness.session.post(harness.url(), json=body) as response:
            assert response.status == 200
            assert response.headers["Content-Type"] == "text/event-stream"
            first = await response.content.readuntil(b"\n\n")
            assert first == b'data: {"text": "first"}\n\n', "sent before the replica finished"
            harness.backend.go.set()
            rest = await response.content.read()
        assert rest == b'data: {"text": "second"}\n\ndata: [DONE]\n\n'


async def test_a_client_that_disconnects_is_disconnected_upstream() -> None:
    async with running() as harness:
        harness.replica_ready()
        body = {"model": "m", "prompt": "hi", "stream": True}
        response = await harness.session.post(harness.url(), json=body)
        await response.content.readuntil(b"\n\n")
        response.close()  # the client goes mid-stream
        async with asyncio.timeout(10):
            await harness.backend.cancelled.wait()


async def test_a_client_that_disconnects_while_held_leaves_the_queue() -> None:
    async with running() as harness:
        task = asyncio.ensure_future(harness.post("r0"))
        await held(harness, 1)
        task.cancel()
        await held(harness, 0)


async def test_past_max_pending_requests_the_next_one_is_refused_at_once() -> None:
    async with running(max_pending=3) as harness:
        tasks = await gather_in_order([lambda r=r: harness.post(r) for r in "abc"], harness)
        started = time.monotonic()
        status, text, headers = await harness.post("d")
        assert time.monotonic() - started < 2, "at once, not after a hold"
        assert status == 503 and headers["Retry-After"] == "10"
        message = json.loads(text)["error"]["message"]
        assert "already holds 3 requests" in message and "maxPendingRequests 3" in message
        harness.replica_ready()
        assert [a[0] for a in await asyncio.gather(*tasks)] == [200, 200, 200]


async def test_past_hold_timeout_seconds_a_held_request_gets_504() -> None:
    async with running(hold=1) as harness:
        started = time.monotonic()
        status, text, headers = await harness.post("r0")
        waited = time.monotonic() - started
        assert status == 504 and headers["Retry-After"] == "30"
        assert "holdTimeoutSeconds (1 s)" in json.loads(text)["error"]["message"]
        assert 0.9 <= waited < 5
        assert harness.workload.pending == 0


async def test_a_workload_deleted_while_requests_are_held_answers_them_at_once() -> None:
    async with running() as harness:
        task = asyncio.ensure_future(harness.post("r0"))
        await held(harness, 1)
        harness.activator.registry.workload_changed("DELETED", sizing(harness.port))
        status, text, _ = await asyncio.wait_for(task, timeout=5)
        assert status == 503
        message = json.loads(text)["error"]["message"]
        assert "WorkloadSizing llm/chat was deleted while this request was held" in message


async def test_a_host_no_workload_routes_here_is_404_naming_it() -> None:
    async with running() as harness:
        shared = harness.activator.settings.shared_port
        async with harness.session.get(
            harness.url("/v1/models", shared), headers={"Host": "other.llm.svc:80"}
        ) as response:
            assert response.status == 404
            assert "no workload behind Host 'other.llm.svc:80'" in await response.text()
        harness.replica_ready()
        async with harness.session.post(
            harness.url(port=shared),
            json={"prompt": "x"},
            headers={"Host": "chat.llm.svc.cluster.local"},
        ) as response:
            assert response.status == 200, "the workload's own Service, by Host"


async def test_a_body_over_the_limit_is_413_before_it_is_held() -> None:
    async with running() as harness:
        big = {"prompt": "x" * 2000}
        async with harness.session.post(harness.url(), json=big) as response:
            assert response.status == 413
            assert "over the activator's limit of 1024 bytes" in await response.text()

        async def chunks() -> AsyncIterator[bytes]:
            for _ in range(40):
                yield b"y" * 100

        async with harness.session.post(harness.url(), data=chunks()) as response:
            assert response.status == 413, "a chunked body without a length, too"
        assert harness.workload.pending == 0


async def raw_exchange(port: int, data: bytes, wait: float = 10) -> bytes:
    reader, writer = await asyncio.open_connection(LOOPBACK, port)
    writer.write(data)
    await writer.drain()
    async with asyncio.timeout(wait):
        answer = await reader.read()
    writer.close()
    return answer


async def test_malformed_http_is_400() -> None:
    async with running() as harness:
        answer = await raw_exchange(harness.port, b"NOT HTTP AT ALL\r\n\r\n")
        status, _, text = answer.partition(b"\r\n\r\n")
        assert b" 400 Bad Request" in status.split(b"\r\n")[0]
        assert b"Invalid method encountered" in text, "the answer says what is wrong"
        assert harness.workload.pending == 0


async def test_a_client_that_never_finishes_its_headers_is_408_at_the_deadline() -> None:
    async with running(header_timeout=0.5) as harness:
        started = time.monotonic()
        answer = await raw_exchange(harness.port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n")
        assert b"no complete request headers within 0.5 s" in answer
        assert 0.4 <= time.monotonic() - started < 5


async def test_on_sigterm_held_requests_are_forwarded_if_a_replica_comes_in_time() -> None:
    async with running(drain=10) as harness:
        task = asyncio.ensure_future(harness.post("r0"))
        await held(harness, 1)
        drained = asyncio.ensure_future(harness.activator.proxy.drain(time.time() + 10))
        await harness.until(lambda: harness.activator.proxy.draining, "draining")
        assert not harness.activator.ready()
        status, text, headers = await harness.post("late")
        assert status == 503 and headers["Retry-After"] == "1", "new ones go to another replica"
        assert "shutting down" in json.loads(text)["error"]["message"]
        harness.replica_ready()
        assert (await task)[0] == 200
        await asyncio.wait_for(drained, timeout=5)


async def test_on_sigterm_held_requests_without_a_replica_get_503_at_the_deadline() -> None:
    async with running() as harness:
        task = asyncio.ensure_future(harness.post("r0"))
        await held(harness, 1)
        await harness.activator.proxy.drain(time.time() + 0.5)
        status, text, headers = await asyncio.wait_for(task, timeout=5)
        assert status == 503 and headers["Retry-After"] == "1"
        assert "stopped before llm/chat had a ready replica" in text


async def test_a_replica_marked_ready_before_it_listens_gets_the_request_once_it_does() -> None:
    async with running() as harness:
        late = Backend()
        harness.activator.registry.slice_changed("MODIFIED", pod_slice(late.port))
        task = asyncio.ensure_future(harness.post("r0"))
        await asyncio.sleep(0.1)  # the first attempts find nobody listening
        await late.start()
        status, text, _ = await asyncio.wait_for(task, timeout=10)
        assert (status, json.loads(text)["echo"]) == (200, "hello r0")
        assert late.arrived == ["r0"], "sent once: the refused attempts sent nothing"
        assert late.runner is not None
        await late.runner.cleanup()


async def test_a_replica_that_cannot_be_reached_is_502_naming_it() -> None:
    async with running() as harness:
        harness.activator.registry.slice_changed("MODIFIED", pod_slice(free_port()))
        status, text, _ = await harness.post("r0")
        assert status == 502 and "llm/chat's replica 127.0.0.1:" in text


@pytest.mark.parametrize(
    ("host", "key"),
    [
        ("chat.llm", ("llm", "chat")),
        ("chat.llm:8080", ("llm", "chat")),
        ("chat.llm.svc", ("llm", "chat")),
        ("Chat.LLM.svc.cluster.local.", ("llm", "chat")),
        ("chat", None),
        ("chat.llm.example.com", None),
        ("10.0.0.7:8080", None),
    ],
)
def test_a_host_names_a_service_as_cluster_dns_does(host: str, key: Any) -> None:
    assert host_key(host) == key


# --- the push: at once on the first and the last, at most once a second between, refreshed ---


async def test_the_push_is_immediate_at_the_edges_coalesced_between_and_refreshed() -> None:
    sent: list[tuple[float, int | None]] = []
    got = asyncio.Event()

    async def patch(namespace: str, name: str, annotations: dict[str, str | None]) -> None:
        value = annotations[held_key("a-0")]
        sent.append(
            (
                time.monotonic(),
                None if value is None else HeldRecord.model_validate_json(value).pending,
            )
        )
        got.set()

    async def next_push() -> tuple[float, int | None]:
        got.clear()
        async with asyncio.timeout(10):
            await got.wait()
        return sent[-1]

    pusher = Pusher("a-0", patch, min_interval=0.3, refresh=0.6)
    key = (NS, NAME)
    started = time.monotonic()
    pusher.held(key, 1, time.time())
    at, pending = await next_push()
    assert pending == 1 and at - started < 0.2, "the first request is pushed at once"
    for count in (2, 3, 4):
        pusher.held(key, count, time.time())
    at, pending = await next_push()
    assert pending == 4 and at - sent[0][0] >= 0.29, "the moves between, once per interval"
    at, pending = await next_push()
    assert pending == 4 and at - sent[1][0] >= 0.59, "refreshed while held: alive"
    pusher.held(key, 0, None)
    at, pending = await next_push()
    assert pending is None and at - sent[2][0] < 0.3, "the last one leaving, at once"
    assert len(sent) == 4


async def test_records_of_replicas_gone_are_swept_once() -> None:
    swept: list[dict[str, str | None]] = []

    async def patch(namespace: str, name: str, annotations: dict[str, str | None]) -> None:
        swept.append(annotations)

    pusher = Pusher("a-0", patch)
    pusher.sweep((NS, NAME), (held_key("a-1"), held_key("a-0")))
    pusher.sweep((NS, NAME), (held_key("a-1"),))
    await asyncio.sleep(0)  # the sweep runs as a task of its own
    await asyncio.sleep(0)
    assert swept == [{held_key("a-1"): None}], "its own record is never swept, nor one twice"


def test_a_stale_record_on_a_workload_is_swept_when_the_watch_shows_it() -> None:
    stale = HeldRecord(pending=4, since="2026-01-01T00:00:00.000Z", at="2026-01-01T00:00:00.000Z")
    asked: list[tuple[tuple[str, str], tuple[str, ...]]] = []
    registry = Registry(lambda _: None, lambda _: None, lambda k, keys: asked.append((k, keys)))
    registry.workload_changed(
        "ADDED", sizing(20000, annotations={held_key("a-1"): stale.annotation()})
    )
    assert asked == [((NS, NAME), (held_key("a-1"),))]


def test_backends_are_the_ready_endpoints_at_the_port_the_operator_named() -> None:
    served: list[tuple[str, ...]] = []
    registry = Registry(lambda w: served.append(w.backends), lambda _: None)
    registry.workloads_listed([sizing(20000)])
    registry.slices_listed(
        [
            pod_slice(8000),
            {
                **pod_slice(8000, ready=False),
                "metadata": {
                    "namespace": NS,
                    "name": "chat-2",
                    "labels": {"kubernetes.io/service-name": NAME},
                },
            },
        ]
    )
    workload = registry.workloads[(NS, NAME)]
    assert workload.backends == ("127.0.0.1:8000",), "port http, not metrics; ready ones only"
    assert registry.by_port(20000) is workload and registry.by_host("chat.llm") is workload
    registry.workload_changed("MODIFIED", {**sizing(20001)})
    assert registry.ports() == {20001} and registry.by_port(20000) is None


# --- memory: flat over 10,000 requests held and released ------------------------------------


def rss_bytes() -> int:
    for line in open("/proc/self/status").read().splitlines():  # noqa: SIM115
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


async def test_memory_stays_flat_over_requests_held_and_released() -> None:
    """Rounds of 100 requests held at zero, then released to a replica that comes and goes:
    what a request left behind would grow the process by rounds x 100 x its size. The client
    and the replica run in this process too, so the bound is conservative. (The activator
    process itself over 10,000: bench/activator.py, bench/README.md.)"""
    async with running() as harness:
        connector = aiohttp.TCPConnector(limit=100)
        async with aiohttp.ClientSession(connector=connector) as client:

            async def post(i: int) -> int:
                body = {"model": "m", "prompt": f"r{i}"}
                async with client.post(harness.url(), json=body) as response:
                    await response.read()
                    return response.status

            async def round_of(n: int) -> None:
                tasks = [asyncio.ensure_future(post(i)) for i in range(n)]
                await held(harness, n)
                harness.replica_ready()
                assert set(await asyncio.gather(*tasks)) == {200}
                harness.replica_ready(False)

            for _ in range(5):  # warm-up: the pools, caches and buffers reach their size
                await round_of(100)
            before = rss_bytes()
            for _ in range(20):
                await round_of(100)
            grown = rss_bytes() - before
    # a leak of 1 KiB a request would be 2 MiB here
    assert grown < 1024 * 1024, f"grew {grown / 1024:.0f} KiB over 2,000 requests"


async def test_a_workload_the_activator_no_longer_serves_keeps_no_series() -> None:
    async with running() as harness:
        harness.replica_ready()
        assert (await harness.post("r0"))[0] == 200
        exposition = generate_latest(activator_metrics.REGISTRY).decode()
        assert f'namespace="{NS}",outcome="proxied",workload="{NAME}"' in exposition
        harness.activator.registry.workload_changed("DELETED", sizing(harness.port))
        exposition = generate_latest(activator_metrics.REGISTRY).decode()
        assert f'workload="{NAME}"' not in exposition
