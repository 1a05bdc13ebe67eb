"""Hostile data through the pure layers: Prometheus-shaped results with bad values, arbitrary
specs, and random fleets through join and the replica policy. Every case ends in a clear error
or an "unknown", never a crash or a wrong scale. (Plain malformed JSON is covered in
test_signals_parse.)"""

from __future__ import annotations

import math
from typing import Any

from gpusizer.api.v1alpha1 import WorkloadSizingSpec
from gpusizer.policy.replicas import History, ReplicaCounts, decide_replicas
from gpusizer.signals.join import workload_signals
from gpusizer.signals.parse import per_pod, scalar
from gpusizer.signals.pods import PodInfo
from gpusizer.signals.queries import GPU_UTIL, TIMESTAMP_LABEL, queue_signal
from gpusizer.signals.snapshot import Snapshot
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

NOW = 1_700_000_000.0

bad_values = st.sampled_from(
    ["NaN", "nan", "+Inf", "-Inf", "inf", "1e999", "", "0x10", "1,5", "null", "true"]
) | st.sampled_from([math.nan, math.inf, -math.inf, None, True, [], {}])
good_values = st.floats(min_value=0, max_value=100, allow_nan=False).map(str)
any_values = (
    bad_values
    | good_values
    | st.floats()
    | st.integers(min_value=-(10**400), max_value=10**400)
    | st.text(max_size=2000)
)
pod_names = st.sampled_from(["a", "b", "c"])


def series(pod: str, value: Any, gpu: int = 0, stamp: Any = None) -> list[dict[str, Any]]:
    labels = {"namespace": "llm", "pod": pod, "gpu": str(gpu)}
    out = [{"metric": labels, "value": [NOW, value]}]
    if stamp is not None:
        out.append({"metric": {**labels, TIMESTAMP_LABEL: "1"}, "value": [NOW, stamp]})
    return out


@given(
    st.lists(
        st.tuples(pod_names, any_values, st.integers(0, 2), st.none() | any_values), max_size=12
    ),
    st.sampled_from(["mean", "max", "sum"]),
)
def test_per_pod_values_are_finite_or_the_pod_is_a_problem(
    rows: list[tuple[str, Any, int, Any]], combine: str
) -> None:
    result = [item for pod, v, gpu, ts in rows for item in series(pod, v, gpu, ts)]
    parsed = per_pod(result, combine=combine, now=NOW)
    for key, sample in parsed.samples.items():
        assert math.isfinite(sample.value) and math.isfinite(sample.age), (key, sample)
        assert key not in parsed.problems


@given(bad_values, st.integers(1, 5))
def test_one_bad_gpu_makes_the_pod_a_problem_even_among_duplicates(bad: Any, copies: int) -> None:
    result = [*series("a", "50") * copies, *series("a", bad, gpu=1)]
    parsed = per_pod(result, now=NOW)
    assert ("llm", "a") in parsed.problems and ("llm", "a") not in parsed.samples


@given(any_values)
def test_scalar_is_finite_or_a_problem(value: Any) -> None:
    for result in ([NOW, value], [{"metric": {}, "value": [NOW, value]}]):
        got, problem = scalar(result)
        assert (got is None) != (problem is None)
        assert got is None or math.isfinite(got)


json_like = st.recursive(
    st.none()
    | st.booleans()
    | st.floats()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.text(max_size=300),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=20), children, max_size=3)
    ),
    max_leaves=30,
)
spec_keys = st.sampled_from(
    ["targetRef", "replicas", "scaleToZero", "metrics", "rightSizing", "mode", "container"]
)


@settings(max_examples=300)
@given(st.dictionaries(spec_keys | st.text(max_size=20), json_like, max_size=6))
def test_any_spec_is_valid_or_a_validation_error(raw: dict[str, Any]) -> None:
    try:
        WorkloadSizingSpec.model_validate(raw)
    except ValidationError as exc:
        assert exc.errors(), "a validation error names what is wrong"


def test_deeply_nested_or_huge_spec_values_are_validation_errors() -> None:
    deep: Any = "x"
    for _ in range(500):
        deep = {"a": deep}
    for raw in (
        {"targetRef": deep, "replicas": {"max": 1}},
        {"targetRef": {"name": "x" * 100_000}, "replicas": {"min": 10**100, "max": 10**100}},
        {"targetRef": {"name": "c"}, "replicas": {"max": "NaN", "targetGPUUtilization": "inf"}},
    ):
        try:
            WorkloadSizingSpec.model_validate(raw)
        except ValidationError as exc:
            assert exc.errors()[0]["loc"], "the error names the field"
        else:
            raise AssertionError(f"accepted {str(raw)[:80]}")


SPEC = WorkloadSizingSpec.model_validate(
    {
        "targetRef": {"name": "chat"},
        "replicas": {
            "min": 0,
            "max": 16,
            "targetGPUUtilization": 70,
            "targetQueuePerReplica": 4,
            "scaleDown": {"stabilizationWindowSeconds": 0, "maxReplicasPerStep": 16},
        },
        "scaleToZero": {"enabled": True, "idleSeconds": 0, "wakeQuery": "sum(w)"},
        "metrics": {"server": "vllm", "maxSampleAgeSeconds": 60},
    }
)


@settings(max_examples=300)
@given(
    st.lists(
        st.tuples(good_values | bad_values | st.none(), good_values | st.none()),
        min_size=1,
        max_size=6,
    ),
    st.integers(1, 16),
    st.integers(0, 1),
)
def test_a_fleet_with_any_invalid_or_missing_value_never_scales_down(
    values: list[tuple[Any, Any]], current: int, wake: int
) -> None:
    pods = [
        PodInfo("llm", f"p{i}", {}, "n", True, False, "Running", "nvidia.com/gpu", "vllm", 0)
        for i in range(len(values))
    ]
    util_rows: list[dict[str, Any]] = []
    queue_rows: list[dict[str, Any]] = []
    for pod, (util, queue) in zip(pods, values, strict=True):
        if util is not None:
            util_rows += series(pod.name, util, stamp=str(NOW))
        if queue is not None:
            queue_rows += series(pod.name, queue, stamp=str(NOW))
    snapshot = Snapshot(
        time=NOW,
        signals={
            GPU_UTIL: per_pod(util_rows, now=NOW),
            queue_signal(SPEC.metrics.server): per_pod(queue_rows, combine="sum", now=NOW),
        },
    )
    joined = workload_signals(SPEC, pods, snapshot, NOW, wake=(float(wake), None))
    decision = decide_replicas(
        SPEC,
        ReplicaCounts(current=current, ready=len(pods), starting=0),
        joined.signals,
        History(last_active_time=NOW - 3600),
        NOW,
    )
    invalid = any(u is None or q is None or _bad(u) or _bad(q) for u, q in values)
    if invalid:
        assert not decision.metrics_known
        assert decision.desired >= current and decision.desired != 0, decision
    assert decision.desired <= SPEC.replicas.maximum


def _bad(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        return True
    try:
        return not math.isfinite(float(value))
    except (TypeError, ValueError):
        return True
