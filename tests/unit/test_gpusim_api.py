"""The emulator's HTTP control API and /metrics, served for real on a free port."""

from __future__ import annotations

import json
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gpusizer.catalog import load_catalog

from e2e.gpusim.exposition import ExporterOptions
from e2e.gpusim.model import ModelConfig
from e2e.gpusim.server import GpusimServer
from e2e.gpusim.sim import Simulator
from e2e.gpusim.testing import FakeClusterSource, gpu_node, gpu_pod


class Harness:
    def __init__(self) -> None:
        catalog = load_catalog()
        self.source = FakeClusterSource()
        self.source.nodes["gpu-a"] = gpu_node(catalog, "gpu-a", "h100-80gb", 2, "all-3g.40gb")
        self.source.add_pod(gpu_pod("chat-1", "gpu-a", "nvidia.com/mig-3g.40gb", running_since=0.0))
        self.now = 0.0
        self.sim = Simulator(
            self.source, catalog, ModelConfig(startup_seconds=5), clock=lambda: self.now
        )
        self.sim.step()
        self.server = GpusimServer(("127.0.0.1", 0), self.sim, ExporterOptions())
        self.server.serve_in_thread()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def advance(self, seconds: int) -> None:
        for _ in range(seconds):
            self.now += 1
            self.sim.step()

    def call(
        self, method: str, path: str, body: Any = None, raw: bytes | None = None
    ) -> tuple[int, Any]:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        request = urllib.request.Request(self.url + path, data=data, method=method)
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                payload = response.read()
                status = response.status
        except urllib.error.HTTPError as err:
            payload, status = err.read(), err.code
        try:
            return status, json.loads(payload)
        except json.JSONDecodeError:
            return status, payload.decode()


@pytest.fixture
def api() -> Iterator[Harness]:
    harness = Harness()
    yield harness
    harness.server.shutdown()
    harness.server.server_close()


def test_healthz_and_metrics(api: Harness) -> None:
    assert api.call("GET", "/healthz") == (200, "ok\n")
    api.advance(1)
    status, text = api.call("GET", "/metrics")
    assert status == 200
    assert 'GPU_I_PROFILE="3g.40gb"' in text and "DCGM_FI_DEV_GPU_UTIL" not in text.replace(
        "# HELP DCGM_FI_DEV_GPU_UTIL", ""
    ).replace("# TYPE DCGM_FI_DEV_GPU_UTIL", "")


def test_each_node_and_the_gateway_have_their_own_metrics(api: Harness) -> None:
    api.call("PUT", "/v1/workloads/llm/chat/load", {"requestsPerSecond": 2.0})
    api.advance(6)
    status, node = api.call("GET", "/metrics/nodes/gpu-a")
    assert status == 200 and 'Hostname="gpu-a"' in node
    assert 'vllm:num_requests_waiting{namespace="llm",pod="chat-1"' in node
    assert "gateway_pending_requests" not in node
    status, gateway = api.call("GET", "/metrics/gateway")
    assert status == 200 and 'gateway_pending_requests{namespace="llm",service="chat"}' in gateway
    assert "DCGM" not in gateway
    assert api.call("GET", "/metrics/nodes/gpu-z") == (404, {"error": "no GPU node 'gpu-z'"})


def test_metrics_follow_ticks(api: Harness) -> None:
    _, before = api.call("GET", "/metrics")
    assert api.call("GET", "/metrics")[1] == before
    api.call("PUT", "/v1/workloads/llm/chat/load", {"requestsPerSecond": 2.0})
    api.advance(6)
    _, after = api.call("GET", "/metrics")
    assert after != before and "vllm:num_requests_running{" in after


def test_scrape_does_not_wait_for_a_tick_in_progress(api: Harness) -> None:
    """Prometheus gives up after its scrape timeout; a slow tick must not make it."""
    _, before = api.call("GET", "/metrics")
    ticking, finish = threading.Event(), threading.Event()

    def stuck_clock() -> float:  # read by the tick while it holds the simulator's lock
        ticking.set()
        finish.wait(30)
        return api.now

    api.sim.clock = stuck_clock
    tick = threading.Thread(target=api.sim.step)
    tick.start()
    try:
        assert ticking.wait(30)
        assert api.call("GET", "/metrics") == (200, before)
    finally:
        finish.set()
        tick.join()


def test_set_load_and_describe(api: Harness) -> None:
    status, body = api.call("PUT", "/v1/workloads/llm/chat/load", {"requestsPerSecond": 2.0})
    assert status == 200 and body["requestsPerSecond"] == 2.0
    api.advance(3)
    status, body = api.call("GET", "/v1/workloads/llm/chat")
    assert status == 200
    assert body["gatewayPending"] == pytest.approx(6.0)  # not ready yet: held at the gateway
    [pod] = body["pods"]
    assert pod["ready"] is False and pod["slice"] == "mig-3g.40gb" and pod["node"] == "gpu-a"
    api.advance(3)
    status, body = api.call("GET", "/v1/workloads/llm/chat")
    [pod] = body["pods"]
    assert pod["ready"] is True and body["gatewayPending"] == 0
    assert 0 < pod["utilization"] <= 1 and pod["memoryMiB"] == 16384
    assert set(pod) >= {"node", "slice", "ready", "utilization", "queue", "memoryMiB"}
    assert api.source.readied == ["chat-1"]


def test_forgetting_a_namespace_drops_its_demand_and_backlog(api: Harness) -> None:
    api.call("PUT", "/v1/workloads/llm/chat/load", {"requestsPerSecond": 2.0})
    api.call("PUT", "/v1/workloads/other/chat/load", {"requestsPerSecond": 1.0})
    api.advance(3)  # not ready yet: 6 requests wait at the gateway
    assert api.call("GET", "/v1/workloads/llm/chat")[1]["gatewayPending"] == pytest.approx(6.0)
    assert api.call("DELETE", "/v1/workloads/llm") == (200, {"forgotten": ["chat"]})
    api.advance(3)
    body = api.call("GET", "/v1/workloads/llm/chat")[1]
    assert body["requestsPerSecond"] == 0 and body["gatewayPending"] == 0
    assert api.call("GET", "/v1/workloads/other/chat")[1]["requestsPerSecond"] == 1.0
    assert api.call("DELETE", "/v1/workloads/llm/chat")[0] == 404


def test_restarting_a_pods_server(api: Harness) -> None:
    api.call("PUT", "/v1/workloads/llm/chat/load", {"requestsPerSecond": 2.0})
    api.advance(8)
    assert api.call("POST", "/v1/pods/llm/chat-1/restart") == (200, {"restarted": "llm/chat-1"})
    [pod] = api.source.pods.values()
    assert pod.restart_count == 1 and not pod.ready
    api.advance(1)
    [described] = api.call("GET", "/v1/workloads/llm/chat")[1]["pods"]
    assert described["ready"] is False
    assert "vllm:request_success_total" not in api.call("GET", "/metrics")[1]
    status, body = api.call("POST", "/v1/pods/llm/nobody/restart")
    assert status == 404 and body == {"error": "no emulated pod llm/nobody"}


def test_replay(api: Harness, tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("timestamp_s,requests\n0,100\n10,0\n")
    status, body = api.call(
        "POST", "/v1/workloads/llm/chat/replay", {"trace": str(trace), "speedup": 10}
    )
    assert status == 200 and body["replay"] is True and body["replaySeconds"] == pytest.approx(2.0)
    assert body["requestsPerSecond"] == pytest.approx(100.0)
    api.advance(3)
    status, body = api.call("GET", "/v1/workloads/llm/chat")
    assert body["requestsPerSecond"] == 0 and body["replay"] is False  # the trace has ended
    assert body["gatewayPending"] == pytest.approx(100.0)


def test_replay_shifted_and_looped(api: Harness, tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("timestamp_s,requests\n0,100\n10,0\n")
    status, body = api.call(
        "POST",
        "/v1/workloads/llm/chat/replay",
        {"trace": str(trace), "speedup": 10, "offsetSeconds": 10, "loop": True},
    )
    assert status == 200 and body["replaySeconds"] == pytest.approx(1.0)
    assert body["requestsPerSecond"] == 0  # the idle bin first
    api.advance(1)
    status, body = api.call("GET", "/v1/workloads/llm/chat")
    assert body["requestsPerSecond"] == pytest.approx(100.0) and body["replay"] is True
    api.advance(5)
    assert api.call("GET", "/v1/workloads/llm/chat")[1]["replay"] is True  # it loops


def test_a_namespace_is_described_whole(api: Harness) -> None:
    api.call("PUT", "/v1/workloads/llm/other/load", {"requestsPerSecond": 3})
    status, body = api.call("GET", "/v1/workloads/llm")
    assert status == 200
    assert [(w["name"], w["requestsPerSecond"]) for w in body] == [("chat", 0.0), ("other", 3.0)]
    assert [p["name"] for p in body[0]["pods"]] == ["chat-1"]
    assert api.call("GET", "/v1/workloads/elsewhere") == (200, [])


def test_a_node_exporter_goes_down_and_up(api: Harness) -> None:
    assert api.call("GET", "/metrics/nodes/gpu-a")[0] == 200
    assert api.call("PUT", "/v1/nodes/gpu-a/scrape", {"up": False}) == (
        200,
        {"node": "gpu-a", "up": False},
    )
    status, answer = api.call("GET", "/metrics/nodes/gpu-a")
    assert status == 503 and "gpu-a" in answer["error"]
    assert api.call("PUT", "/v1/nodes/gpu-a/scrape", {"up": True})[0] == 200
    assert api.call("GET", "/metrics/nodes/gpu-a")[0] == 200
    status, answer = api.call("PUT", "/v1/nodes/gpu-a/scrape", {"up": "no"})
    assert status == 400 and answer["error"].startswith("up:")


@pytest.mark.parametrize(
    ("method", "path", "body", "field"),
    [
        ("PUT", "/v1/workloads/llm/chat/load", {}, "requestsPerSecond"),
        ("PUT", "/v1/workloads/llm/chat/load", {"requestsPerSecond": "lots"}, "requestsPerSecond"),
        ("PUT", "/v1/workloads/llm/chat/load", {"requestsPerSecond": -1}, "requestsPerSecond"),
        ("PUT", "/v1/workloads/llm/chat/load", [1], "body"),
        ("POST", "/v1/workloads/llm/chat/replay", {"speedup": 2}, "trace"),
        ("POST", "/v1/workloads/llm/chat/replay", {"trace": "/nonexistent.csv"}, "trace"),
        (
            "POST",
            "/v1/workloads/llm/chat/replay",
            {"trace": "/etc/hostname", "speedup": 0},
            "speedup",
        ),
        (
            "POST",
            "/v1/workloads/llm/chat/replay",
            {"trace": "/etc/hostname", "offsetSeconds": -1},
            "offsetSeconds",
        ),
        ("POST", "/v1/workloads/llm/chat/replay", {"trace": "/x", "loop": 1}, "loop"),
    ],
)
def test_bad_requests_name_the_field(
    api: Harness, method: str, path: str, body: Any, field: str
) -> None:
    status, answer = api.call(method, path, body)
    assert status == 400
    assert answer["error"].startswith(field + ":")


def test_not_json_and_unknown_paths(api: Harness) -> None:
    status, answer = api.call("PUT", "/v1/workloads/llm/chat/load", raw=b"{nope")
    assert status == 400 and answer["error"].startswith("body:")
    assert api.call("GET", "/v1/nothing")[0] == 404
    assert api.call("PUT", "/v1/workloads/llm/chat/replay", {})[0] == 404


def test_a_burst_of_connections_is_queued_not_refused() -> None:
    """Prometheus scrapes every GPU node's target in bursts: connections the server has not yet
    accepted wait in the listen queue instead of failing."""
    catalog = load_catalog()
    sim = Simulator(FakeClusterSource(), catalog, ModelConfig(), clock=lambda: 0.0)
    server = GpusimServer(("127.0.0.1", 0), sim, ExporterOptions())  # listening, not accepting
    clients: list[socket.socket] = []
    try:
        for _ in range(256):
            clients.append(socket.create_connection(server.server_address, timeout=0.5))
    finally:
        for client in clients:
            client.close()
        server.server_close()
    assert len(clients) == 256
