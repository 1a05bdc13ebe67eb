"""The emulator's pure load model, traces and device assignment (no HTTP, no cluster)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from gpusizer.catalog import Catalog, load_catalog

from e2e.gpusim.cluster import PRODUCT_LABEL
from e2e.gpusim.devices import Allocator, NodeDevices
from e2e.gpusim.exposition import PodServerReading
from e2e.gpusim.model import LoadModel, ModelConfig, Replica
from e2e.gpusim.openai import TOKEN_SECONDS
from e2e.gpusim.sim import Simulator
from e2e.gpusim.telemetry import DeviceReading
from e2e.gpusim.testing import FakeClusterSource, gpu_node, gpu_pod
from e2e.gpusim.traces import ConstantRate, TraceRate, load_trace

H100 = "NVIDIA-H100-80GB-HBM3"
CHAT = ("llm", "chat")


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog()


def replica(catalog: Catalog, name: str, resource: str = "nvidia.com/gpu", **kw: object) -> Replica:
    pod = gpu_pod(name, "gpu-a", resource, **kw)  # type: ignore[arg-type]
    return Replica(pod=pod, slice=catalog.slice_for(resource, H100))


def test_queue_grows_above_capacity_and_drains_below(catalog: Catalog) -> None:
    model = LoadModel(ModelConfig(capacity_rps=10, startup_seconds=0))
    replicas = [replica(catalog, "a"), replica(catalog, "b")]
    model.set_rate(CHAT, ConstantRate(30))
    model.tick(0, replicas)
    model.tick(10, replicas)  # 300 arrive, 200 served
    state = model.workload(CHAT)
    assert state.queue == pytest.approx(100)
    assert model.replicas["uid-llm-a"].utilisation == pytest.approx(1.0)
    assert model.replicas["uid-llm-a"].waiting == pytest.approx(50)  # split across ready pods
    model.set_rate(CHAT, ConstantRate(5))
    model.tick(20, replicas)  # 100 + 50 arrive, up to 200 served
    assert state.queue == pytest.approx(0)
    assert model.replicas["uid-llm-a"].utilisation == pytest.approx(150 / 200)
    assert model.replicas["uid-llm-a"].success_total == pytest.approx(175)
    assert state.gateway_pending == 0


def test_capacity_follows_the_slice_throughput(catalog: Catalog) -> None:
    model = LoadModel(ModelConfig(capacity_rps=10, startup_seconds=0))
    small = replica(
        catalog,
        "small",
        "nvidia.com/mig-1g.10gb",
        annotations={"gpusim.gpusizer.io/memory-mib": "4000"},
    )
    big = replica(catalog, "big", annotations={"gpusim.gpusizer.io/capacity-rps": "20"})
    model.tick(0, [small, big])
    assert small.slice is not None
    assert model.replicas["uid-llm-small"].capacity_rps == pytest.approx(
        10 * small.slice.relative_throughput
    )
    assert model.replicas["uid-llm-big"].capacity_rps == pytest.approx(20)
    model.set_rate(CHAT, ConstantRate(10))
    model.tick(1, [small, big])
    # both ready pods run at the same utilisation: load splits by capacity
    assert model.replicas["uid-llm-small"].utilisation == pytest.approx(
        model.replicas["uid-llm-big"].utilisation
    )


def test_a_replicas_figures_follow_its_pods_annotations_when_they_change(
    catalog: Catalog,
) -> None:
    model = LoadModel(ModelConfig(capacity_rps=10, startup_seconds=0))
    before = replica(catalog, "a", annotations={"gpusim.gpusizer.io/capacity-rps": "20"})
    model.tick(0, [before])
    model.tick(1, [before])
    assert model.replicas["uid-llm-a"].capacity_rps == pytest.approx(20)
    after = dataclasses.replace(
        before,
        pod=dataclasses.replace(
            before.pod,
            annotations={
                "gpusim.gpusizer.io/capacity-rps": "5",
                "gpusim.gpusizer.io/memory-mib": "90000",  # more than an H100 holds
            },
        ),
    )
    model.tick(2, [after])
    state = model.replicas["uid-llm-a"]
    assert state.capacity_rps == pytest.approx(5)
    assert state.memory_need_mib == 90000 and state.oom


def test_startup_delay_then_ready(catalog: Catalog) -> None:
    model = LoadModel(ModelConfig(startup_seconds=5))
    pod = replica(
        catalog, "a", running_since=100.0, annotations={"gpusim.gpusizer.io/startup-seconds": "30"}
    )
    pending = replica(catalog, "p", running_since=None)
    assert model.tick(120, [pod, pending]).mark_ready == []
    assert not model.replicas["uid-llm-a"].ready
    result = model.tick(130, [pod, pending])
    assert [p.name for p in result.mark_ready] == ["a"]
    assert not model.replicas["uid-llm-p"].ready


def test_gateway_holds_requests_without_ready_replica(catalog: Catalog) -> None:
    model = LoadModel(ModelConfig(capacity_rps=10, startup_seconds=10))
    model.set_rate(CHAT, ConstantRate(2))
    model.tick(0, [])
    model.tick(5, [])
    assert model.workload(CHAT).gateway_pending == pytest.approx(10)
    starting = replica(catalog, "a", running_since=0.0)
    model.tick(8, [starting])  # starting, not ready: still held at the gateway
    assert model.workload(CHAT).gateway_pending == pytest.approx(16)
    model.tick(12, [starting])
    assert model.workload(CHAT).gateway_pending == 0
    assert model.workload(CHAT).queue == pytest.approx(0)


def test_oom_never_ready_and_restarts_with_backoff(catalog: Catalog) -> None:
    model = LoadModel(ModelConfig(startup_seconds=5, oom_backoff_seconds=10))
    big_model = {"gpusim.gpusizer.io/memory-mib": "30000"}
    pod = replica(catalog, "a", "nvidia.com/mig-1g.10gb", annotations=big_model)
    restarts = []
    for t in range(0, 60):
        result = model.tick(float(t), [pod])
        assert result.mark_ready == []
        restarts += [t for _ in result.ooms]
    assert restarts == [5, 20, 45]  # 5 s start-up, then start-up + 10 s, + 20 s backoff
    assert model.replicas["uid-llm-a"].oom


def test_terminating_pods_serve_nothing(catalog: Catalog) -> None:
    model = LoadModel(ModelConfig(startup_seconds=0))
    pod = replica(catalog, "a", terminating=True)
    model.set_rate(CHAT, ConstantRate(1))
    model.tick(0, [pod])
    model.tick(1, [pod])
    assert "uid-llm-a" not in model.replicas
    assert model.workload(CHAT).gateway_pending == pytest.approx(1)


def test_trace_spreads_arrivals_and_speeds_up(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("timestamp_s,requests,input_tokens\n0,60,1\n60,0,0\n120,120,5\n")
    trace = load_trace(path)
    assert trace.bin_width == 60 and trace.duration == 180
    rate = TraceRate(trace, start=1000.0, speedup=2.0)
    assert rate.arrivals(1000, 1015) == pytest.approx(30)  # half of the first bin
    assert rate.rate(1010) == pytest.approx(2.0)
    assert rate.arrivals(1000, 1090) == pytest.approx(180)  # the whole trace in 90 s
    assert rate.arrivals(1000, 1030) + rate.arrivals(1030, 1090) == pytest.approx(180)
    assert rate.rate(1095) == 0 and rate.finished(1090)
    scaled = TraceRate(trace, start=0.0, scale=0.5)
    assert scaled.arrivals(0, 180) == pytest.approx(90)


def test_trace_shifted_and_looped(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("timestamp_s,requests\n0,60\n60,0\n120,120\n")
    trace = load_trace(path)
    shifted = TraceRate(trace, start=1000.0, speedup=2.0, offset=120)  # the last bin first
    assert shifted.rate(1010) == pytest.approx(4.0)
    assert shifted.arrivals(1000, 1030) == pytest.approx(120)
    assert shifted.rate(1031) == 0 and shifted.finished(1030)
    looped = TraceRate(trace, start=1000.0, speedup=2.0, offset=120, loop=True)
    assert looped.rate(1031) == pytest.approx(2.0)  # back at the first bin
    assert not looped.finished(10_000)
    assert looped.arrivals(1000, 1030 + 3 * 90) == pytest.approx(120 + 3 * 180)
    assert looped.arrivals(1000, 1100) + looped.arrivals(1100, 1300) == pytest.approx(
        looped.arrivals(1000, 1300)
    )
    assert looped.rate(999) == 0 and looped.arrivals(900, 1000) == 0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("time,requests\n0,1\n", "header"),
        ("timestamp_s,requests\n0,1\n0,2\n", "increase"),
        ("timestamp_s,requests\n", "no rows"),
    ],
)
def test_bad_trace(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        load_trace(path)


SHARED_TRACE = Path(__file__).parents[3] / "shared" / "traces" / "azure-llm-2023-code.csv"


def test_real_trace_replays_its_total() -> None:
    """The shared traces sit beside the repository (as in CI): a missing one is a failure."""
    trace = load_trace(SHARED_TRACE)
    rate = TraceRate(trace, start=0.0, speedup=60.0)
    assert rate.arrivals(0, trace.duration / 60) == pytest.approx(sum(trace.requests))


def test_devices_assignment_is_stable_and_collision_free(catalog: Catalog) -> None:
    nodes = {
        "gpu-a": gpu_node(catalog, "gpu-a", "h100-80gb", 2, "all-3g.40gb"),
        "gpu-b": gpu_node(catalog, "gpu-b", "h100-80gb", 2),
    }
    devices = NodeDevices(catalog).of(nodes)
    assert len(devices) == 4 + 2
    assert len({d.uuid for d in devices if d.node == "gpu-a"}) == 2
    mig = [d for d in devices if d.profile]
    assert {(d.gpu, d.instance_id) for d in mig} == {(0, 1), (0, 2), (1, 1), (1, 2)}
    allocator = Allocator()
    pods = [
        gpu_pod(f"p{i}", "gpu-a", "nvidia.com/mig-3g.40gb", running_since=float(i))
        for i in range(5)
    ]
    first = allocator.update(pods, devices)
    assert len(first) == 4  # the fifth pod finds no free instance
    keys = [d.key for held in first.values() for d in held]
    assert len(keys) == len(set(keys))
    # a pod leaving frees its instance; the others keep theirs
    second = allocator.update(pods[1:], devices)
    for uid in first:
        if uid != "uid-llm-p0":
            assert second[uid] == first[uid]
    assert "uid-llm-p4" in second
    whole = allocator.update([gpu_pod("w", "gpu-b", count=2)], devices)
    assert sorted(d.gpu for d in whole["uid-llm-w"]) == [0, 1]


def test_layout_packed_from_allocatable(catalog: Catalog) -> None:
    node = gpu_node(catalog, "gpu-c", "h100-80gb", 4)
    node = type(node)(
        name="gpu-c",
        labels={k: v for k, v in node.labels.items() if "mig.config" not in k},
        allocatable={
            "nvidia.com/gpu": "2",
            "nvidia.com/mig-1g.10gb": "7",
            "nvidia.com/mig-3g.40gb": "2",
        },
    )
    devices = NodeDevices(catalog).of({"gpu-c": node})
    by_gpu: dict[int, list[str | None]] = {}
    for d in devices:
        by_gpu.setdefault(d.gpu, []).append(d.profile)
    assert by_gpu[0] == [None] and by_gpu[1] == [None]
    assert sorted(by_gpu[2] + by_gpu[3], key=str) == sorted(["3g.40gb"] * 2 + ["1g.10gb"] * 7)


def test_simulator_readies_pods_through_the_source(catalog: Catalog) -> None:
    source = FakeClusterSource()
    source.nodes["gpu-a"] = gpu_node(catalog, "gpu-a", "h100-80gb", 1)
    source.add_pod(gpu_pod("chat-1", "gpu-a", running_since=10.0))
    now = [10.0]
    sim = Simulator(source, catalog, ModelConfig(startup_seconds=5), clock=lambda: now[0])
    deadline = 30.0
    while not source.readied and now[0] < deadline:
        sim.step()
        now[0] += 1
    assert source.readied == ["chat-1"]
    assert now[0] == 16.0  # marked ready on the tick at t=15
    sim.step()
    assert source.readied == ["chat-1"]  # once only


def test_a_requested_layout_is_not_served_before_it_is_applied(catalog: Catalog) -> None:
    node = gpu_node(catalog, "gpu-a", "h100-80gb", 2)  # all-disabled, applied
    requested = dataclasses.replace(
        node,
        labels={**node.labels, "nvidia.com/mig.config": "all-balanced"},  # state still success
        annotations={"gpusim.gpusizer.io/mig-config-applied": "all-disabled"},
    )
    devices = NodeDevices(catalog)
    assert [d.profile for d in devices.of({"gpu-a": requested})] == [None, None]
    applied = dataclasses.replace(
        requested, annotations={"gpusim.gpusizer.io/mig-config-applied": "all-balanced"}
    )
    assert len(devices.of({"gpu-a": applied})) == 8


def test_a_nodes_devices_are_derived_again_only_when_the_node_changes(catalog: Catalog) -> None:
    whole = gpu_node(catalog, "gpu-a", "h100-80gb", 1)
    other = gpu_node(catalog, "gpu-b", "h100-80gb", 1)
    devices = NodeDevices(catalog)
    first = devices.of({"gpu-a": whole, "gpu-b": other})
    again = devices.of({"gpu-a": whole, "gpu-b": other})
    assert [a is b for a, b in zip(first, again, strict=True)] == [True, True]
    sliced = gpu_node(catalog, "gpu-a", "h100-80gb", 1, "all-3g.40gb")
    changed = devices.of({"gpu-a": sliced, "gpu-b": other})
    assert [d.profile for d in changed] == ["3g.40gb", "3g.40gb", None]
    assert changed[-1] is first[-1]
    assert devices.of({"gpu-b": other}) == [first[-1]]  # a node gone takes its devices along


def test_simulator_reports_oom_restarts_through_the_source(catalog: Catalog) -> None:
    source = FakeClusterSource()
    source.nodes["gpu-a"] = gpu_node(catalog, "gpu-a", "h100-80gb", 1, "all-1g.10gb")
    big = {"gpusim.gpusizer.io/memory-mib": "30000"}
    pod = source.add_pod(gpu_pod("big-1", "gpu-a", "nvidia.com/mig-1g.10gb", annotations=big))
    now = [0.0]
    config = ModelConfig(startup_seconds=2, oom_backoff_seconds=1)
    sim = Simulator(source, catalog, config, clock=lambda: now[0])
    while len(source.oom_kills) < 2 and now[0] < 30:
        sim.step()
        now[0] += 1
    assert source.oom_kills == [("big-1", 2.0), ("big-1", 5.0)]
    assert source.pods[pod.uid].restart_count == 2 and not source.readied


def test_a_slice_can_serve_slower_than_the_catalog_says(catalog: Catalog) -> None:
    model = LoadModel(ModelConfig(capacity_rps=10, startup_seconds=0))
    speed = {"gpusim.gpusizer.io/slice-speed": "gpu-l4=2, mig-2g.20gb=0.7,mig-3g.40gb=fast"}
    slow = replica(catalog, "slow", "nvidia.com/mig-2g.20gb", annotations=speed)
    bad = replica(catalog, "bad", "nvidia.com/mig-3g.40gb", annotations=speed)
    whole = replica(catalog, "whole", annotations=speed)
    model.tick(0, [slow, bad, whole])
    assert slow.slice is not None and bad.slice is not None
    assert model.replicas["uid-llm-slow"].capacity_rps == pytest.approx(
        10 * slow.slice.relative_throughput * 0.7
    )
    # a factor that is not a positive number is logged and ignored
    assert model.replicas["uid-llm-bad"].capacity_rps == pytest.approx(
        10 * bad.slice.relative_throughput
    )
    assert model.replicas["uid-llm-whole"].capacity_rps == pytest.approx(10)  # not named


def test_a_restarted_server_counts_from_zero_and_is_not_ready_meanwhile(catalog: Catalog) -> None:
    model = LoadModel(ModelConfig(capacity_rps=10, startup_seconds=5))
    served = replica(catalog, "a", running_since=0.0)
    model.set_rate(CHAT, ConstantRate(4))
    for t in range(5, 16):
        model.tick(t, [served])
    state = model.replicas["uid-llm-a"]
    assert state.success_total == pytest.approx(40) and state.generation_tokens_total > 0
    assert model.restart("uid-llm-a", 15.0) and not model.restart("uid-llm-none", 15.0)
    assert (state.success_total, state.generation_tokens_total, state.prompt_tokens_total) == (
        0,
        0,
        0,
    )
    model.tick(18, [served])
    assert not state.ready  # its start-up time from the restart
    model.tick(20, [served])
    assert state.ready and state.success_total > 0
    # the workload's totals are the ground truth: a restart does not take them back
    assert model.workload(CHAT).served_total == pytest.approx(4 * 15)


def test_a_ready_pods_server_is_derived_again_only_when_the_pod_changes(
    catalog: Catalog,
) -> None:
    source = FakeClusterSource()
    source.nodes["gpu-a"] = gpu_node(catalog, "gpu-a", "h100-80gb", 2)
    served = gpu_pod("chat-1", "gpu-a", annotations={TOKEN_SECONDS: "0.5"})
    source.add_pod(dataclasses.replace(served, ip="127.0.0.9"))
    source.add_pod(gpu_pod("chat-2", "gpu-a"))  # no IP: nowhere to serve
    sim = Simulator(source, catalog, ModelConfig(startup_seconds=0), clock=lambda: 100.0)
    sim.step()
    sim.step()  # on the PodInfo that marking it ready made
    (first,) = sim.serving()
    assert (first.uid, first.address, first.token_seconds) == (served.uid, "127.0.0.9", 0.5)
    sim.step()
    assert sim.serving()[0] is first
    source.pods[served.uid] = dataclasses.replace(source.pods[served.uid], ip="127.0.0.10")
    sim.step()
    (moved,) = sim.serving()
    assert (moved.uid, moved.address) == (served.uid, "127.0.0.10")


def test_a_tick_makes_new_readings_only_for_what_changed(catalog: Catalog) -> None:
    source = FakeClusterSource()
    source.nodes["gpu-a"] = gpu_node(catalog, "gpu-a", "h100-80gb", 2)
    busy = source.add_pod(gpu_pod("chat-1", "gpu-a"))
    idle = source.add_pod(gpu_pod("idle-1", "gpu-a", workload="idle"))
    now = [100.0]
    sim = Simulator(source, catalog, ModelConfig(startup_seconds=0), clock=lambda: now[0])

    def tick() -> tuple[dict[str, DeviceReading], dict[str, PodServerReading]]:
        sim.step()
        now[0] += 1
        view = sim.view()
        devices = {r.pod.name: r for r in view.devices if r.pod is not None}
        return devices, {s.pod: s for s in view.servers}

    tick()
    devices, servers = tick()  # on the PodInfos that marking them ready made
    assert set(devices) == set(servers) == {"chat-1", "idle-1"}
    again, servers_again = tick()
    assert all(again[name] is devices[name] for name in devices)
    assert all(servers_again[name] is servers[name] for name in servers)

    sim.set_load(busy.workload, 5.0)
    loaded, servers_loaded = tick()
    assert loaded["chat-1"] is not devices["chat-1"] and loaded["chat-1"].busy > 0
    assert servers_loaded["chat-1"].success_total > servers["chat-1"].success_total
    assert loaded["idle-1"] is devices["idle-1"]
    assert servers_loaded["idle-1"] is servers["idle-1"]
    assert sim.describe(idle.workload)["pods"][0]["slice"] == "gpu-h100"

    node = source.nodes["gpu-a"]
    a100 = catalog.products["a100-80gb"].gfd_label
    source.nodes["gpu-a"] = dataclasses.replace(node, labels={**node.labels, PRODUCT_LABEL: a100})
    tick()
    assert sim.describe(idle.workload)["pods"][0]["slice"] == "gpu-a100"  # its node changed
