"""Prometheus results -> per-pod samples: shapes, label spellings and hostile values."""

from __future__ import annotations

import math
from typing import Any

import pytest
from gpusizer.signals.parse import Sample, labelled_values, per_pod, scalar
from gpusizer.signals.queries import TIMESTAMP_LABEL, pod_query
from gpusizer.vocabulary import Reason
from hypothesis import given
from hypothesis import strategies as st

NOW = 1_800_000_000.0


def series(labels: dict[str, str], value: Any, ts: float | None = None) -> list[dict[str, Any]]:
    """A value series and its timestamp twin, as the combined query returns them."""
    out = [{"metric": {"__name__": "DCGM_FI_DEV_GPU_UTIL", **labels}, "value": [NOW, value]}]
    if ts is not None:
        out.append({"metric": {**labels, TIMESTAMP_LABEL: "1"}, "value": [NOW, str(ts)]})
    return out


def dcgm(
    pod: str, gpu: str = "0", hostname_label: str = "Hostname", **extra: str
) -> dict[str, str]:
    return {
        "gpu": gpu,
        "UUID": f"GPU-{pod}-{gpu}",
        "device": f"nvidia{gpu}",
        "modelName": "NVIDIA H100 80GB HBM3",
        hostname_label: "gpu-a",
        "namespace": "llm",
        "pod": pod,
        **extra,
    }


def test_query_returns_each_pods_value_and_oldest_timestamp_in_one() -> None:
    q = pod_query("DCGM_FI_DEV_FB_USED", "max")
    assert q.count("DCGM_FI_DEV_FB_USED") == 2 and " or " in q
    assert q.startswith("(max by (namespace, pod, exported_namespace, exported_pod) (")
    assert "min by (namespace, pod, exported_namespace, exported_pod) (timestamp(" in q


@pytest.mark.parametrize("hostname_label", ["Hostname", "hostname"])
def test_both_hostname_spellings(hostname_label: str) -> None:
    result = series(dcgm("chat-1", hostname_label=hostname_label), "40", NOW - 5)
    assert per_pod(result, now=NOW).samples == {("llm", "chat-1"): Sample(40.0, 5.0)}


def test_exported_labels_name_the_workload_pod() -> None:
    labels = dcgm("dcgm-exporter-x")
    labels.update(namespace="gpu-operator", exported_pod="chat-1", exported_namespace="llm")
    result = series(labels, "55", NOW)
    assert ("llm", "chat-1") in per_pod(result, now=NOW).samples


def test_pod_gpus_combine_mean_max_sum() -> None:
    result = series(dcgm("p", "0"), "20", NOW) + series(dcgm("p", "1"), "60", NOW - 3)
    assert per_pod(result, now=NOW).samples[("llm", "p")] == Sample(40.0, 3.0)
    assert per_pod(result, combine="max", now=NOW).samples[("llm", "p")].value == 60
    assert per_pod(result, combine="sum", now=NOW).samples[("llm", "p")].value == 80


def test_a_pods_age_is_its_oldest_twin_and_never_below_zero() -> None:
    result = [
        *series(dcgm("p", "0"), "20", NOW - 2),
        {"metric": {"namespace": "llm", "pod": "p", TIMESTAMP_LABEL: "1"}, "value": [NOW, "1"]},
        *series(dcgm("q", "0"), "30", NOW + 5),  # Prometheus' clock ahead of the operator's
        *series(dcgm("r", "0"), "40"),  # no twin: evaluated at the read
    ]
    samples = per_pod(result, now=NOW).samples
    assert samples[("llm", "p")] == Sample(20.0, NOW - 1)
    assert samples[("llm", "q")].age == 0 and samples[("llm", "r")].age == 0


def test_mig_scale_to_percent() -> None:
    result = series(dcgm("p", GPU_I_PROFILE="3g.40gb", GPU_I_ID="2"), "0.412", NOW)
    assert per_pod(result, scale=100, now=NOW).samples[("llm", "p")].value == pytest.approx(41.2)


def test_unallocated_gpus_are_ignored() -> None:
    labels = dcgm("x")
    del labels["pod"], labels["namespace"]
    assert per_pod(series(labels, "0", NOW), now=NOW).samples == {}


@pytest.mark.parametrize("bad", ["NaN", "+Inf", "-Inf", "abc", None, True, [], {}])
def test_non_finite_or_garbage_is_a_problem_not_a_value(bad: Any) -> None:
    result = series(dcgm("p", "0"), "30", NOW) + series(dcgm("p", "1"), bad, NOW)
    parsed = per_pod(result, now=NOW)
    assert ("llm", "p") not in parsed.samples
    assert parsed.problems[("llm", "p")].reason == Reason.INVALID_VALUE


@pytest.mark.parametrize(
    "result",
    [None, "x", 3, {"metric": {}}, [1, 2], [{"metric": "x", "value": [1, "2"]}], [{"value": [1]}]],
)
def test_malformed_results_yield_nothing(result: Any) -> None:
    parsed = per_pod(result, now=NOW)
    assert parsed.samples == {} and parsed.problems == {}


@pytest.mark.parametrize(
    ("result", "value", "reason"),
    [
        ([NOW, "3"], 3.0, None),
        ([{"metric": {}, "value": [NOW, "7"]}], 7.0, None),
        ([], None, Reason.NO_SAMPLES),
        ([{"metric": {}, "value": [NOW, "1"]}] * 2, None, Reason.INVALID_VALUE),
        ([NOW, "NaN"], None, Reason.INVALID_VALUE),
        ("garbage", None, Reason.INVALID_VALUE),
    ],
)
def test_scalar(result: Any, value: float | None, reason: Reason | None) -> None:
    got, problem = scalar(result)
    assert got == value
    assert (problem.reason if problem else None) == reason


json_values = st.recursive(
    st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=50),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=20,
)


@given(json_values)
def test_any_json_never_crashes_and_never_yields_non_finite(result: Any) -> None:
    parsed = per_pod(result, now=NOW)
    assert all(math.isfinite(s.value) for s in parsed.samples.values())
    value, problem = scalar(result)
    assert (value is None) != (problem is None)
    assert value is None or math.isfinite(value)


def test_huge_values_that_overflow_when_combined_are_a_problem() -> None:
    result = series(dcgm("p", "0"), "1e308", NOW) + series(dcgm("p", "1"), "1e308", NOW)
    parsed = per_pod(result, combine="sum", now=NOW)
    assert ("llm", "p") not in parsed.samples
    assert parsed.problems[("llm", "p")].reason == Reason.INVALID_VALUE


@given(json_values)
def test_labelled_values_never_crash_and_keep_only_finite_text_labelled_series(
    result: Any,
) -> None:
    found, dropped = labelled_values(result)
    assert all(math.isfinite(v.value) for v in found)
    assert all(isinstance(k, str) for v in found for k in v.labels.values())
    assert dropped >= 0


def test_labelled_values_count_what_they_leave_out() -> None:
    good = {"metric": {"UUID": "GPU-1", "GPU_I_ID": "4"}, "value": [NOW, "205.5"]}
    result = [
        good,
        {"metric": {"UUID": "GPU-1"}, "value": [NOW, "NaN"]},
        {"metric": {"UUID": 7}, "value": [NOW, "1"]},
        {"metric": {"UUID": "GPU-2"}},
        "garbage",
    ]
    found, dropped = labelled_values(result)
    assert [(v.labels, v.value) for v in found] == [({"UUID": "GPU-1", "GPU_I_ID": "4"}, 205.5)]
    assert dropped == 4
    assert labelled_values({"not": "a list"}) == ([], 0)
