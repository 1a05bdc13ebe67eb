"""The emulator's /metrics: exact DCGM and vLLM names, label sets and order, and units."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from gpusizer.catalog import Catalog, load_catalog
from prometheus_client.parser import text_string_to_metric_families

from e2e.gpusim import exposition
from e2e.gpusim.exposition import (
    CachedExposition,
    ExporterOptions,
    PartExpositions,
    View,
    render,
    render_gateway,
    render_node,
)
from e2e.gpusim.model import ModelConfig
from e2e.gpusim.server import ScrapeTargets
from e2e.gpusim.sim import Simulator
from e2e.gpusim.testing import FakeClusterSource, gpu_node, gpu_pod

BASE = ["gpu", "UUID", "pci_bus_id", "device", "modelName"]
TAIL = ["Hostname", "DCGM_FI_DRIVER_VERSION"]
POD = ["container", "namespace", "pod"]
WHOLE_ONLY = {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL"}
DCGM = [
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_RESERVED",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE",
]

Series = dict[str, list[tuple[list[str], dict[str, str], float]]]


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog()


def scrape(sim: Simulator, options: ExporterOptions | None = None) -> tuple[str, Series]:
    """Series by their exposed name, with label order read from the text itself."""
    text = render(sim.view(), options or ExporterOptions()).decode()
    rows: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if not line.startswith("#"):
            name, rest = line.split("{", 1)
            pairs = rest.rsplit("}", 1)[0].split('",')
            rows.append((name, [pair.split("=", 1)[0] for pair in pairs]))
    # values and unescaped labels from the reference parser (which renames counters to _total)
    parsed = [
        (dict(sample.labels), sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    ]
    assert len(parsed) == len(rows)
    series: Series = {}
    for (name, order), (labels, value) in zip(rows, parsed, strict=True):
        assert order == list(labels)
        series.setdefault(name, []).append((order, labels, value))
    return text, series


@pytest.fixture
def sim(catalog: Catalog) -> Simulator:
    source = FakeClusterSource()
    source.nodes["gpu-a"] = gpu_node(catalog, "gpu-a", "h100-80gb", 2)
    source.nodes["gpu-b"] = gpu_node(catalog, "gpu-b", "h100-80gb", 1, "all-balanced")
    source.add_pod(
        gpu_pod("chat-1", "gpu-a", annotations={"gpusim.gpusizer.io/memory-mib": "30000"})
    )
    source.add_pod(
        gpu_pod(
            "small-1",
            "gpu-b",
            "nvidia.com/mig-3g.40gb",
            workload="small",
            annotations={"gpusim.gpusizer.io/memory-mib": "20000"},
        )
    )
    now = [0.0]
    simulator = Simulator(source, catalog, ModelConfig(startup_seconds=0), clock=lambda: now[0])
    simulator.set_load(("llm", "chat"), 4.0)  # 40 % of a full H100 at 10 rps
    simulator.set_load(("llm", "small"), 2.0)
    simulator.set_load(("llm", "idle"), 0.0)
    for t in range(11):
        now[0] = float(t)
        simulator.step()
    return simulator


def test_names_types_and_label_order(sim: Simulator) -> None:
    text, series = scrape(sim)
    for name in DCGM:
        assert f"# TYPE {name} " in text
    assert "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter" in text
    assert "# TYPE vllm:request_success_total counter" in text
    for name in DCGM:
        for order, labels, _ in series[name]:
            mig = "GPU_I_PROFILE" in labels
            expected = BASE + (["GPU_I_PROFILE", "GPU_I_ID"] if mig else []) + TAIL
            if "pod" in labels:
                expected += POD
            assert order == expected, name
            assert labels["device"] == f"nvidia{labels['gpu']}"
            assert labels["modelName"] == "NVIDIA H100 80GB HBM3"
            assert labels["UUID"].startswith("GPU-")
            assert not (mig and name in WHOLE_ONLY)
    for name in [
        "vllm:num_requests_waiting",
        "vllm:num_requests_running",
        "vllm:kv_cache_usage_perc",
        "vllm:request_success_total",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
    ]:
        assert {tuple(order) for order, _, _ in series[name]} == {
            ("namespace", "pod", "model_name")
        }
    assert [labels for _, labels, _ in series["gateway_pending_requests"]] == [
        {"namespace": "llm", "service": "chat"},
        {"namespace": "llm", "service": "idle"},
        {"namespace": "llm", "service": "small"},
    ]


def one(series: Series, name: str, **match: str) -> tuple[dict[str, str], float]:
    rows = [(labels, value) for _, labels, value in series[name] if match.items() <= labels.items()]
    assert len(rows) == 1, (name, match, rows)
    return rows[0]


def test_whole_gpu_values_and_units(sim: Simulator) -> None:
    _, series = scrape(sim)
    _, util = one(series, "DCGM_FI_DEV_GPU_UTIL", pod="chat-1")
    assert util == 40 and float(util).is_integer()  # 0-100 integer percent
    _, gr = one(series, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", pod="chat-1")
    assert gr == pytest.approx(0.4)  # 0-1
    _, used = one(series, "DCGM_FI_DEV_FB_USED", pod="chat-1")
    _, free = one(series, "DCGM_FI_DEV_FB_FREE", pod="chat-1")
    _, reserved = one(series, "DCGM_FI_DEV_FB_RESERVED", pod="chat-1")
    assert used == 30000 and used + free + reserved == 81559  # MiB
    _, power = one(series, "DCGM_FI_DEV_POWER_USAGE", pod="chat-1")
    assert 70 < power < 700  # W, between idle and board power
    _, energy = one(series, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", pod="chat-1")
    assert energy > 0  # mJ counter, advances with power x time
    _, kv = one(series, "vllm:kv_cache_usage_perc", pod="chat-1")
    assert 0 <= kv <= 1


def test_unallocated_gpus_have_no_pod_labels(sim: Simulator) -> None:
    _, series = scrape(sim)
    idle = [labels for _, labels, _ in series["DCGM_FI_DEV_GPU_UTIL"] if "pod" not in labels]
    assert [(labels["Hostname"], labels["gpu"]) for labels in idle] == [("gpu-a", "1")]
    assert not {"container", "namespace", "pod"} & set(idle[0])
    # balanced H100: 4 instances, one allocated
    instances = [
        labels for _, labels, _ in series["DCGM_FI_PROF_GR_ENGINE_ACTIVE"] if "GPU_I_ID" in labels
    ]
    assert sorted(labels["GPU_I_PROFILE"] for labels in instances) == [
        "1g.10gb",
        "1g.10gb",
        "2g.20gb",
        "3g.40gb",
    ]
    assert sum("pod" in labels for labels in instances) == 1


def test_mig_instance_series(sim: Simulator) -> None:
    _, series = scrape(sim)
    labels, gr = one(series, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", pod="small-1")
    assert labels["GPU_I_PROFILE"] == "3g.40gb" and labels["Hostname"] == "gpu-b"
    assert 0 < gr <= 1  # relative to the instance, not the whole GPU
    _, used = one(series, "DCGM_FI_DEV_FB_USED", pod="small-1")
    _, free = one(series, "DCGM_FI_DEV_FB_FREE", pod="small-1")
    assert used == 20000 and used + free == 40448  # the instance's own memory
    powers = {
        value
        for _, labels, value in series["DCGM_FI_DEV_POWER_USAGE"]
        if labels["Hostname"] == "gpu-b"
    }
    assert len(powers) == 1 and powers.pop() > 70  # the parent's busy power, on every instance
    uuids = {
        labels["UUID"]
        for _, labels, _ in series["DCGM_FI_DEV_POWER_USAGE"]
        if labels["Hostname"] == "gpu-b"
    }
    assert len(uuids) == 1  # UUID names the parent GPU


def test_token_counters_follow_the_requests(sim: Simulator) -> None:
    _, series = scrape(sim)
    _, requests = one(series, "vllm:request_success_total", pod="chat-1")
    _, output = one(series, "vllm:generation_tokens_total", pod="chat-1")
    _, prompt = one(series, "vllm:prompt_tokens_total", pod="chat-1")
    assert requests > 0
    assert (output, prompt) == (pytest.approx(200 * requests), pytest.approx(600 * requests))


def test_each_device_owns_a_part_of_its_gpus_power_that_adds_up(sim: Simulator) -> None:
    """The ground truth of energy per result: what is not served, only accounted."""
    by_gpu: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for reading in sim.view().devices:
        key = (reading.device.node, reading.device.gpu)
        by_gpu.setdefault(key, []).append((reading.own_power_w, reading.power_w))
    for parts in by_gpu.values():
        assert sum(own for own, _ in parts) == pytest.approx(parts[0][1])
    # the busy 3g.40gb on gpu-b: 3/7 of the idle 70 W, and its own work
    small = next(r for r in sim.view().devices if r.pod is not None and r.pod.name == "small-1")
    assert small.own_power_w == pytest.approx(70 * 3 / 7 + 630 * small.busy * 3 / 7)


def test_the_accounting_is_ground_truth_per_workload(sim: Simulator) -> None:
    chat = sim.describe(("llm", "chat"))["accounting"]
    small = sim.describe(("llm", "small"))["accounting"]
    # ten one-second ticks after the first: one H100 at $3/h, half an H100's slice at $1.50/h
    assert chat["cost"] == pytest.approx(3.00 * 10 / 3600)
    assert small["cost"] == pytest.approx(1.50 * 10 / 3600)
    assert (chat["gpuSeconds"], small["gpuSeconds"]) == (pytest.approx(10), pytest.approx(5))
    assert chat["servedRequests"] == pytest.approx(40)  # 4 req/s, ready from the start
    assert chat["outputTokens"] == pytest.approx(200 * 40)
    assert chat["energyJoules"] == pytest.approx((70 + 630 * 0.4) * 10)


def test_exporter_variants(sim: Simulator) -> None:
    _, series = scrape(sim, ExporterOptions(hostname_label="hostname", exported_labels=True))
    order, labels, _ = next(
        row for row in series["DCGM_FI_DEV_GPU_UTIL"] if "exported_pod" in row[1]
    )
    assert order == [
        *BASE,
        "hostname",
        "DCGM_FI_DRIVER_VERSION",
        "container",
        "exported_namespace",
        "exported_pod",
    ]
    assert labels["exported_pod"] == "chat-1" and labels["exported_namespace"] == "llm"
    assert all(
        "Hostname" not in labels and "pod" not in labels
        for _, labels, _ in series["DCGM_FI_DEV_FB_USED"]
    )


def test_terminated_pod_disappears(catalog: Catalog) -> None:
    source = FakeClusterSource()
    source.nodes["gpu-a"] = gpu_node(catalog, "gpu-a", "l4", 1)
    pod = source.add_pod(gpu_pod("chat-1", "gpu-a"))
    sim = Simulator(source, catalog, ModelConfig(startup_seconds=0), clock=lambda: 0.0)
    sim.step()
    _, series = scrape(sim)
    assert one(series, "DCGM_FI_DEV_FB_USED", pod="chat-1")[0]["modelName"] == "NVIDIA L4"
    source.pods[pod.uid] = gpu_pod("chat-1", "gpu-a", terminating=True)
    sim.step()
    _, series = scrape(sim)
    assert all("pod" not in labels for _, labels, _ in series["DCGM_FI_DEV_FB_USED"])
    assert "vllm:num_requests_waiting" not in series


GOLDEN = Path(__file__).parent / "gpusim_exposition"
"""Bodies rendered by the prometheus_client-based renderer this one replaced (commit 09b81f1).

After an intended change of the output: GPUSIM_WRITE_GOLDEN=1 pytest this file, and review
the diff of these files.
"""


def busy_cluster(catalog: Catalog) -> Simulator:
    """Whole GPUs and MIG instances, idle and loaded, a queue, an OOM and a pending pod."""
    source = FakeClusterSource()
    source.nodes["gpu-a"] = gpu_node(catalog, "gpu-a", "h100-80gb", 3)
    source.nodes["gpu-b"] = gpu_node(catalog, "gpu-b", "a100-80gb", 2, "all-balanced")
    source.nodes["gpu-c"] = gpu_node(catalog, "gpu-c", "l4", 1)
    source.add_pod(gpu_pod("chat-1", "gpu-a", annotations={"gpusim.gpusizer.io/memory-mib": "3e4"}))
    name = "gpusim.gpusizer.io/model-name"  # escaped in label values: \\, newline and "
    source.add_pod(gpu_pod("chat-2", "gpu-a", running_since=2.0, annotations={name: "C:\\chat"}))
    source.add_pod(
        gpu_pod(
            "pair-1",
            "gpu-a",
            workload="pair",
            namespace="batch",
            count=2,
            annotations={name: "pair\nfp8"},
        )
    )
    source.add_pod(
        gpu_pod(
            "small-1",
            "gpu-b",
            "nvidia.com/mig-3g.40gb",
            workload="small",
            annotations={name: 'org/model "v2"'},
        )
    )
    source.add_pod(gpu_pod("tiny-1", "gpu-b", "nvidia.com/mig-1g.10gb", workload="tiny"))
    source.add_pod(
        gpu_pod(
            "big-1",
            "gpu-c",
            workload="big",
            annotations={"gpusim.gpusizer.io/memory-mib": "40000"},  # OOM on an L4
        )
    )
    source.add_pod(gpu_pod("late-1", None, workload="late"))
    now = [0.0]
    sim = Simulator(source, catalog, ModelConfig(startup_seconds=1), clock=lambda: now[0])
    for key, rps in [("chat", 26.5), ("small", 1.3), ("tiny", 0.25), ("big", 3.0), ("idle", 0.0)]:
        sim.set_load(("llm", key), rps)
    sim.set_load(("batch", "pair"), 5.5)
    for t in range(12):
        now[0] = t * 0.7
        sim.step()
    return sim


def idle_cluster(catalog: Catalog) -> Simulator:
    """GPUs without pods: no vLLM samples (their counter keeps its own name)."""
    source = FakeClusterSource()
    source.nodes["gpu-a"] = gpu_node(catalog, "gpu-a", "h100-80gb", 1, "all-1g.10gb")
    sim = Simulator(source, catalog, clock=lambda: 0.0)
    sim.step()
    return sim


@pytest.mark.parametrize(
    ("cluster", "options", "golden"),
    [
        (busy_cluster, ExporterOptions(), "busy.prom"),
        (busy_cluster, ExporterOptions("hostname", exported_labels=True), "busy-exported.prom"),
        (idle_cluster, ExporterOptions(), "idle.prom"),
    ],
)
def test_body_is_byte_for_byte_the_previous_renderers(
    catalog: Catalog, cluster: Callable[[Catalog], Simulator], options: ExporterOptions, golden: str
) -> None:
    body = render(cluster(catalog).view(), options)
    path = GOLDEN / golden
    if os.environ.get("GPUSIM_WRITE_GOLDEN"):
        path.write_bytes(body)
    assert body.decode() == path.read_text()


def test_body_rendered_once_per_view(sim: Simulator) -> None:
    cached = CachedExposition(sim.view, ExporterOptions())
    first = cached.body()
    assert cached.body() is first
    sim.set_load(("llm", "chat"), 9.0)
    sim.step()
    second = cached.body()
    assert second != first and second == render(sim.view(), ExporterOptions())
    assert cached.body() is second


def test_scrape_during_a_render_gets_the_previous_body(
    sim: Simulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    cached = CachedExposition(sim.view, ExporterOptions())
    first = cached.body()
    rendering, finish = threading.Event(), threading.Event()

    def slow_render(view: View, options: ExporterOptions) -> bytes:
        rendering.set()
        finish.wait(30)
        return render(view, options)

    monkeypatch.setattr(exposition, "render", slow_render)
    sim.set_load(("llm", "chat"), 9.0)
    sim.step()
    ticker = threading.Thread(target=cached.body)  # the tick thread's render
    ticker.start()
    try:
        assert rendering.wait(30)
        assert cached.body() is first
    finally:
        finish.set()
        ticker.join()
    assert cached.body() == render(sim.view(), ExporterOptions())


def test_run_renders_after_each_step(sim: Simulator) -> None:
    """The emulator's tick thread passes the exposition's `body` as `then`."""
    stop, called = threading.Event(), threading.Event()
    before = sim.view()
    views: list[View] = []

    def then() -> None:
        views.append(sim.view())
        called.set()

    runner = threading.Thread(target=sim.run, args=(0.0, stop, then))
    runner.start()
    try:
        assert called.wait(30)
    finally:
        stop.set()
        runner.join()
    assert views[0] is not before


def samples(body: bytes) -> list[str]:
    return sorted(line for line in body.decode().splitlines() if not line.startswith("#"))


def test_node_and_gateway_bodies_split_the_whole_exposition(catalog: Catalog) -> None:
    view = busy_cluster(catalog).view()
    options = ExporterOptions()
    parts = {node: render_node(view, node, options) for node in view.nodes}
    assert sorted(parts) == ["gpu-a", "gpu-b", "gpu-c"]
    together = [line for body in parts.values() for line in samples(body)]
    together += samples(render_gateway(view))
    assert sorted(together) == samples(render(view, options)), "every sample once, none added"
    for node, body in parts.items():
        text = body.decode()
        assert text.count(f'Hostname="{node}"') == text.count("Hostname=") > 0
        for server in view.servers:
            assert (f'pod="{server.pod}",model_name' in text) == (server.node == node)


def test_a_part_is_rendered_once_per_view(sim: Simulator) -> None:
    parts = PartExpositions(sim.view, ExporterOptions())
    first = parts.node("gpu-a")
    assert first is not None and parts.node("gpu-a") is first
    assert parts.node("no-such-node") is None
    gateway = parts.gateway()
    sim.set_load(("llm", "chat"), 9.0)
    sim.step()
    second = parts.node("gpu-a")
    assert second != first and second == render_node(sim.view(), "gpu-a", ExporterOptions())
    assert parts.gateway() is not gateway


def test_scrape_targets_one_per_gpu_node_and_the_gateway(tmp_path: Path) -> None:
    path = tmp_path / "gpusim.json"
    targets = ScrapeTargets(path, "127.0.0.1:9400")
    targets.update(["gpu-b", "gpu-a"])
    groups = json.loads(path.read_text())
    assert [(g["targets"], g["labels"]) for g in groups] == [
        (
            ["127.0.0.1:9400"],
            {"job": "gpusim", "instance": "gpu-a", "__metrics_path__": "/metrics/nodes/gpu-a"},
        ),
        (
            ["127.0.0.1:9400"],
            {"job": "gpusim", "instance": "gpu-b", "__metrics_path__": "/metrics/nodes/gpu-b"},
        ),
        (
            ["127.0.0.1:9400"],
            {"job": "gpusim", "instance": "gateway", "__metrics_path__": "/metrics/gateway"},
        ),
    ]
    written = path.stat().st_mtime_ns
    path.write_text("left alone")
    targets.update(["gpu-a", "gpu-b"])
    assert path.read_text() == "left alone", "rewritten only when the nodes change"
    targets.update(["gpu-a"])
    assert len(json.loads(path.read_text())) == 2 and path.stat().st_mtime_ns >= written
