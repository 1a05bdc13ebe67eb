"""Per-pod samples -> one workload's signals, through the pods its target owns."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from gpusizer.api.v1alpha1 import Server, WorkloadSizingSpec
from gpusizer.cluster import ClusterView
from gpusizer.signals.join import workload_signals
from gpusizer.signals.parse import PodSamples, Problem, Sample
from gpusizer.signals.pods import PodInfo, matches_selector, pod_info
from gpusizer.signals.queries import (
    GPU_UTIL,
    KV_CACHE,
    MEMORY,
    MIG_UTIL,
    queue_signal,
    request_rate_signal,
)
from gpusizer.signals.snapshot import Snapshot, moved_pods
from gpusizer.vocabulary import Reason

from tests.fakes import TIMED_OUT

NOW = 1_800_000_000.0


def spec(**metrics: Any) -> WorkloadSizingSpec:
    return WorkloadSizingSpec.model_validate(
        {
            "targetRef": {"name": "chat"},
            "replicas": {
                "min": 1,
                "max": 8,
                "targetGPUUtilization": 70,
                "targetQueuePerReplica": 4,
            },
            "metrics": metrics,
        }
    )


def pod(name: str, ready: bool = True, resource: str = "nvidia.com/gpu") -> PodInfo:
    return PodInfo(
        "llm", name, {"app": "chat"}, "node", ready, False, "Running", resource, "vllm", 0
    )


def samples(values: dict[str, float], age: float = 5) -> PodSamples:
    return PodSamples(samples={("llm", p): Sample(v, age) for p, v in values.items()})


def snapshot(**signals: PodSamples | Problem) -> Snapshot:
    snap = Snapshot(time=NOW)
    for name, value in signals.items():
        key = {"gpu": GPU_UTIL, "mig": MIG_UTIL, "mem": MEMORY, "queue": queue_signal(Server.VLLM)}[
            name
        ]
        if isinstance(value, Problem):
            snap.errors[key] = value
        else:
            snap.signals[key] = value
    return snap


def test_all_known() -> None:
    snap = snapshot(
        gpu=samples({"a": 80, "b": 60}),
        queue=samples({"a": 3, "b": 5}),
        mem=samples({"a": 20000, "b": 24500}),
    )
    got = workload_signals(spec(), [pod("a"), pod("b"), pod("c", ready=False)], snap, NOW)
    assert got.signals.gpu_utilization == 70
    assert got.signals.queue_total == 8
    assert got.queue_per_replica == 4
    assert got.memory_peak_mib == 24500
    assert got.sample_age_seconds == 5
    assert got.problems == ()


def test_mig_pods_read_gr_engine_active() -> None:
    snap = snapshot(gpu=samples({}), mig=samples({"m": 41.2}), queue=samples({"m": 0}))
    got = workload_signals(spec(), [pod("m", resource="nvidia.com/mig-3g.40gb")], snap, NOW)
    assert got.signals.gpu_utilization == 41.2


@pytest.mark.parametrize(
    ("gpu", "reason"),
    [
        (samples({"a": 80}), Reason.PARTIAL_SAMPLES),
        (samples({}), Reason.NO_SAMPLES),
        (samples({"a": 80, "b": 60}, age=120), Reason.STALE_SAMPLES),
        (
            PodSamples(problems={("llm", "b"): Problem(Reason.INVALID_VALUE, "nan")}),
            Reason.INVALID_VALUE,
        ),
        (Problem(Reason.PROMETHEUS_UNREACHABLE, "down"), Reason.PROMETHEUS_UNREACHABLE),
    ],
)
def test_unknown_utilisation_keeps_the_reason(gpu: PodSamples | Problem, reason: Reason) -> None:
    snap = snapshot(gpu=gpu, queue=samples({"a": 1, "b": 1}))
    got = workload_signals(spec(), [pod("a"), pod("b")], snap, NOW)
    assert got.signals.gpu_utilization is None
    assert got.problems[0].reason == reason
    assert got.problems[0].signal == "gpuUtilization"
    assert got.signals.unknown_reasons and reason.value in got.signals.unknown_reasons[0]


def test_custom_queue_replaces_server_default() -> None:
    snap = snapshot(gpu=samples({"a": 50}), queue=samples({"a": 100}))
    got = workload_signals(
        spec(queueQuery="my_queue"), [pod("a")], snap, NOW, custom_queue=samples({"a": 2})
    )
    assert got.signals.queue_total == 2


def test_no_ready_pods_is_not_a_problem_and_wake_problem_is() -> None:
    snap = snapshot(gpu=samples({}), queue=samples({}))
    got = workload_signals(
        spec(), [pod("a", ready=False)], snap, NOW, wake=(None, Problem(Reason.QUERY_ERROR, "bad"))
    )
    assert got.signals.gpu_utilization is None and got.signals.queue_total is None
    assert [p.signal for p in got.problems] == ["wakeQuery"]


@pytest.mark.parametrize(
    ("selector", "labels", "matches"),
    [
        ("app=chat", {"app": "chat"}, True),
        ("app=chat,tier=gpu", {"app": "chat"}, False),
        ("app in (chat, code)", {"app": "code"}, True),
        ("app notin (chat)", {"app": "chat"}, False),
        ("app!=chat", {"app": "other"}, True),
        ("app", {"app": "x"}, True),
        ("!app", {"app": "x"}, False),
        ("", {"app": "chat"}, False),
    ],
)
def test_scale_selector(selector: str, labels: dict[str, str], matches: bool) -> None:
    assert matches_selector(labels, selector) is matches


def test_pod_info_reads_gpu_resource_readiness_and_oom() -> None:
    body = {
        "metadata": {"name": "p", "namespace": "llm", "labels": {"app": "chat"}},
        "spec": {
            "nodeName": "gpu-a",
            "containers": [
                {"name": "sidecar"},
                {"name": "vllm", "resources": {"limits": {"nvidia.com/mig-1g.10gb": 1}}},
            ],
        },
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "False"}],
            "containerStatuses": [
                {
                    "name": "vllm",
                    "restartCount": 3,
                    "lastState": {"terminated": {"reason": "OOMKilled"}},
                }
            ],
        },
    }
    info = pod_info(body)
    assert info.gpu_resource == "nvidia.com/mig-1g.10gb" and info.gpu_container == "vllm"
    assert info.is_mig and info.starting and not info.ready
    assert info.oom_kills == 3


def test_a_pod_ready_since_the_last_scrape_is_arriving_capacity_not_a_hole() -> None:
    newcomer = dataclasses.replace(pod("new"), ready_since=NOW - 3)
    veteran = dataclasses.replace(pod("old"), ready_since=NOW - 600)
    snap = snapshot(gpu=samples({"a": 80}), queue=samples({"a": 2}))
    got = workload_signals(spec(), [pod("a"), newcomer], snap, NOW)
    assert got.problems == () and got.unobserved == 1
    assert got.signals.gpu_utilization == 80 and got.queue_per_replica == 2
    stale = workload_signals(spec(), [pod("a"), veteran], snap, NOW)
    assert stale.unobserved == 0 and stale.problems[0].reason == Reason.PARTIAL_SAMPLES


def test_ready_pods_decided_on_an_earlier_reads_samples_are_counted() -> None:
    """reader._carried: a pod whose series left the answers keeps its last sample while it
    is fresh, and the policy does not scale down on it."""
    gpu = samples({"a": 80, "b": 60})
    gpu.carried = frozenset({("llm", "b")})
    got = workload_signals(
        spec(), [pod("a"), pod("b")], snapshot(gpu=gpu, queue=samples({"a": 1, "b": 1})), NOW
    )
    assert got.problems == () and got.unscraped == 1 and got.signals.gpu_utilization == 70
    queue = samples({"a": 1, "b": 1})
    queue.carried = frozenset({("llm", "a"), ("llm", "b")})
    both = workload_signals(
        spec(), [pod("a"), pod("b")], snapshot(gpu=samples({"a": 80, "b": 60}), queue=queue), NOW
    )
    assert both.unscraped == 2
    kv = samples({"a": 0.5, "b": 0.5})
    kv.carried = frozenset({("llm", "a")})
    snap = snapshot(gpu=samples({"a": 80, "b": 60}), queue=samples({"a": 1, "b": 1}))
    snap.signals[KV_CACHE] = kv
    assert workload_signals(spec(), [pod("a"), pod("b")], snap, NOW).unscraped == 0
    on_kv = spec().model_copy(
        update={"replicas": spec().replicas.model_copy(update={"target_kv_cache_usage": 80.0})}
    )
    assert workload_signals(on_kv, [pod("a"), pod("b")], snap, NOW).unscraped == 1


def test_a_pod_ready_during_an_outage_is_awaited_from_when_prometheus_came_back() -> None:
    """Scaled up while Prometheus was out: a restarted Prometheus scrapes its targets one by
    one, and the new pod is no hole until maxSampleAgeSeconds after it came back. A pod ready
    before the outage has no such grace."""
    outage = (NOW - 900, NOW - 5)  # Prometheus out for 15 minutes, back 5 s ago
    during = dataclasses.replace(pod("new"), ready_since=NOW - 600)
    before = dataclasses.replace(pod("old"), ready_since=NOW - 1000)
    snap = snapshot(gpu=samples({"a": 80}), queue=samples({"a": 2}))
    got = workload_signals(spec(), [pod("a"), during], snap, NOW, outage=outage)
    assert got.problems == () and got.unobserved == 1
    held_before = workload_signals(spec(), [pod("a"), before], snap, NOW, outage=outage)
    assert held_before.problems[0].reason == Reason.PARTIAL_SAMPLES
    late = workload_signals(spec(), [pod("a"), during], snap, NOW, outage=(NOW - 900, NOW - 300))
    assert late.problems[0].reason == Reason.PARTIAL_SAMPLES


def read_at(when: float, values: dict[str, float], age: float = 5) -> PodSamples:
    """Samples as Prometheus answered at `when`, each `age` seconds old then."""
    return PodSamples(samples={("llm", p): Sample(v, age) for p, v in values.items()}, read_at=when)


def test_a_samples_age_is_counted_from_when_it_was_read_not_from_the_decision() -> None:
    # thousands of workloads share one snapshot, so a decision may come well after it: the
    # samples were fresh when read, and the exporter is not to blame for the operator's lag
    snap = snapshot(gpu=read_at(NOW - 100, {"a": 80}), queue=read_at(NOW - 100, {"a": 2}))
    got = workload_signals(spec(maxSampleAgeSeconds=30), [pod("a")], snap, NOW)
    assert got.problems == () and got.sample_age_seconds == 5
    old = snapshot(gpu=read_at(NOW - 100, {"a": 80}, age=40), queue=read_at(NOW, {"a": 2}))
    stale = workload_signals(spec(maxSampleAgeSeconds=30), [pod("a")], old, NOW)
    assert [(p.signal, p.reason) for p in stale.problems] == [
        ("gpuUtilization", Reason.STALE_SAMPLES)
    ]
    assert "newest sample is 40s old" in stale.problems[0].message


def test_a_pod_ready_after_the_samples_were_read_is_not_a_hole() -> None:
    later = dataclasses.replace(pod("new"), ready_since=NOW - 60)
    snap = snapshot(gpu=read_at(NOW - 100, {"a": 80}), queue=read_at(NOW - 100, {"a": 2}))
    got = workload_signals(spec(maxSampleAgeSeconds=30), [pod("a"), later], snap, NOW)
    assert got.problems == () and got.unobserved == 1


LABELLED = [
    PodInfo("llm", f"p{i}", labels, "node", True, False, "Running", "nvidia.com/gpu", "vllm", 0)
    for i, labels in enumerate(
        [
            {"app": "chat", "tier": "gpu"},
            {"app": "chat"},
            {"app": "code", "tier": "gpu", "zone": "a"},
            {"app": "code", "canary": "true"},
            {"team": "x"},
        ]
    )
]


@pytest.mark.parametrize(
    "selector",
    [
        "app=chat",
        "app==code",
        "tier=gpu,app=code",
        "app in (chat,code),tier=gpu",
        "zone in (a)",
        "app!=chat",
        "!canary,app=code",
        "team",
        "app=none",
        "",
    ],
)
def test_selection_through_the_label_index_equals_a_scan(selector: str) -> None:
    index: dict[tuple[str, str, str], list[PodInfo]] = {}
    for info in LABELLED:
        for key, value in info.labels.items():
            index.setdefault((info.namespace, key, value), []).append(info)
    scanned = ClusterView({"llm": LABELLED}, {})
    indexed = ClusterView({"llm": LABELLED}, {}, pods_by_label=index)
    expected = [p for p in LABELLED if matches_selector(p.labels, selector)]
    assert scanned.selected("llm", selector) == expected
    assert indexed.selected("llm", selector) == expected
    assert scanned.selected("other", selector) == indexed.selected("other", selector) == []


def _snapshot(signals: dict[str, dict[str, float]]) -> Snapshot:
    return Snapshot(
        time=0.0,
        signals={
            name: PodSamples({("ns", pod): Sample(v, 0.0) for pod, v in values.items()})
            for name, values in signals.items()
        },
    )


VLLM_QUEUE = queue_signal(Server.VLLM)


def test_pods_whose_utilisation_or_queue_moved_are_named() -> None:
    before = _snapshot(
        {
            GPU_UTIL: {"steady": 50.0, "busier": 50.0, "gone": 10.0},
            MEMORY: {"steady": 1000.0},
            VLLM_QUEUE: {"steady": 0.0, "queued": 0.0},
        }
    )
    after = _snapshot(
        {
            GPU_UTIL: {"steady": 51.0, "busier": 60.0, "new": 10.0},
            MEMORY: {"steady": 9000.0},  # sizes slices, not replicas
            VLLM_QUEUE: {"steady": 0.04, "queued": 1.0},
        }
    )
    assert moved_pods(before, after) == {
        ("ns", "busier"),
        ("ns", "gone"),
        ("ns", "new"),
        ("ns", "queued"),
    }


def test_every_pod_moved_in_the_first_cycle_and_after_a_failed_signal() -> None:
    after = _snapshot({GPU_UTIL: {"a": 50.0}, VLLM_QUEUE: {"b": 0.0}})
    assert moved_pods(None, after) == {("ns", "a"), ("ns", "b")}
    failed_before = _snapshot({GPU_UTIL: {"a": 50.0}})
    failed_before.errors[VLLM_QUEUE] = Problem(Reason.QUERY_ERROR, "HTTP 500")
    assert moved_pods(failed_before, after) == {("ns", "b")}


# --- the LLM signals: KV-cache usage and the served-request rate ----------------------------

KV_SPEC = WorkloadSizingSpec.model_validate(
    {
        "targetRef": {"name": "chat"},
        "replicas": {"min": 1, "max": 8, "targetGPUUtilization": 70, "targetKVCacheUsage": 0.8},
    }
)


def llm_snapshot(kv: PodSamples | Problem | None, rate: PodSamples | Problem) -> Snapshot:
    snap = snapshot(gpu=samples({"a": 50, "b": 50}), queue=samples({"a": 0, "b": 0}))
    for key, value in ((KV_CACHE, kv), (request_rate_signal(Server.VLLM), rate)):
        if isinstance(value, Problem):
            snap.errors[key] = value
        elif value is not None:
            snap.signals[key] = value
    return snap


def test_kv_cache_and_request_rate_are_read_for_the_ready_pods() -> None:
    snap = llm_snapshot(samples({"a": 0.5, "b": 0.9}), samples({"a": 1.5, "b": 2.0, "c": 9}))
    got = workload_signals(KV_SPEC, [pod("a"), pod("b"), pod("c", ready=False)], snap, NOW)
    assert got.problems == ()
    assert got.signals.kv_cache_usage == pytest.approx(0.7)
    assert got.signals.request_rate == pytest.approx(3.5)  # c is not ready: not counted


def test_kv_cache_unknown_when_a_pod_lacks_it_and_only_when_it_is_a_target() -> None:
    snap = llm_snapshot(samples({"a": 0.5}), samples({"a": 1.0}))
    got = workload_signals(KV_SPEC, [pod("a"), pod("b")], snap, NOW)
    assert got.signals.kv_cache_usage is None
    assert [(p.signal, p.reason) for p in got.problems] == [
        ("kvCacheUsage", Reason.PARTIAL_SAMPLES)
    ]
    # without a KV-cache target nothing depends on it, so its absence is no problem
    plain = workload_signals(spec(), [pod("a"), pod("b")], llm_snapshot(None, samples({})), NOW)
    assert plain.problems == () and plain.signals.kv_cache_usage is None


def test_request_rate_is_zero_without_ready_pods_and_unknown_when_unread() -> None:
    at_zero = workload_signals(KV_SPEC, [], llm_snapshot(None, samples({})), NOW)
    assert at_zero.signals.request_rate == 0
    failed = Problem(Reason.QUERY_ERROR, "bad")
    down = workload_signals(KV_SPEC, [pod("a")], llm_snapshot(samples({"a": 0.5}), failed), NOW)
    assert down.signals.request_rate is None
    tgi = workload_signals(spec(server="tgi"), [pod("a")], llm_snapshot(None, samples({})), NOW)
    assert tgi.signals.request_rate is None  # TGI exports no served-request counter


def test_held_samples_count_while_fresh_then_say_the_failure() -> None:
    """Samples a later read could not replace (its query timed out) age from when they were
    read: known while fresh, and the failure, not their staleness, said after."""
    held = dataclasses.replace(read_at(NOW - 20, {"a": 80}, age=5), held=TIMED_OUT)
    snap = snapshot(gpu=held, queue=read_at(NOW, {"a": 2}))
    known = workload_signals(spec(maxSampleAgeSeconds=30), [pod("a")], snap, NOW)
    assert known.problems == () and known.signals.gpu_utilization == 80
    assert known.sample_age_seconds == 25
    late = workload_signals(spec(maxSampleAgeSeconds=30), [pod("a")], snap, NOW + 6)
    assert [(p.signal, p.reason) for p in late.problems] == [
        ("gpuUtilization", Reason.PROMETHEUS_UNREACHABLE)
    ]
    assert "timed out" in late.problems[0].message
    assert "maxSampleAgeSeconds 30" in late.problems[0].message
