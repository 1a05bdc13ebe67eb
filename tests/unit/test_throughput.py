"""Throughput learned, not assumed: when a measurement is taken, whose measurements count, and
when they replace the catalog's estimate in the slice choice."""

from __future__ import annotations

from typing import Any

import pytest
from gpusizer.api.v1alpha1 import RightSizingSpec
from gpusizer.catalog import Slice, load_catalog
from gpusizer.policy.slices import Offer, Usage, choose_slice, speed_ratio
from gpusizer.signals.parse import PodSamples, Sample
from gpusizer.signals.pods import PodInfo
from gpusizer.signals.queries import OUTPUT_TOKENS, REQUESTS
from gpusizer.signals.usage import UsageHistory
from gpusizer.throughput import (
    REQUESTS_UNIT,
    TOKENS_UNIT,
    Measurement,
    ThroughputBook,
    capacities,
    fingerprint,
    measure,
    predicted_rate,
    surprise,
)

from tests.unit.test_reconcile import NOW
from tests.unit.test_reconcile import pod as reconcile_pod

CATALOG = load_catalog()
WINDOW = 120


def slice_(name: str) -> Slice:
    found = CATALOG.slice(name, "h100-80gb")
    assert found is not None
    return found


H100, MIG_2G, MIG_3G = slice_("gpu-h100"), slice_("mig-2g.20gb"), slice_("mig-3g.40gb")


def pod(name: str, ready_for: float = WINDOW, created_before: float | None = None) -> PodInfo:
    created = NOW - (created_before if created_before is not None else ready_for)
    return reconcile_pod(name, created=created, ready_since=NOW - ready_for)


def window(
    util: dict[str, float],
    requests: dict[str, float],
    tokens: dict[str, float] | None = None,
    signal: str = "utilization",
) -> UsageHistory:
    def each(values: dict[str, float]) -> PodSamples:
        return PodSamples({("llm", p): Sample(v, 0) for p, v in values.items()})

    signals = {signal: each(util), REQUESTS: each(requests)}
    if tokens is not None:
        signals[OUTPUT_TOKENS] = each(tokens)
    return UsageHistory(WINDOW, NOW, signals=signals)


@pytest.mark.parametrize(
    ("label", "history", "pods", "expected"),
    [
        # two replicas at 40 % serving 4 req/s each: a busy replica serves 10
        (
            "two replicas over the whole window",
            window({"a": 40, "b": 40}, {"a": 480, "b": 480}, {"a": 48_000, "b": 48_000}),
            [pod("a"), pod("b")],
            (10.0, 1000.0, 40.0),
        ),
        # a replica started inside the window is left out: only the whole window's count
        (
            "a replica ready for part of the window",
            window({"a": 40, "new": 90}, {"a": 480, "new": 200}),
            [pod("a"), pod("new", ready_for=90, created_before=120)],
            (10.0, None, 40.0),
        ),
        ("too idle to scale by", window({"a": 5}, {"a": 60}), [pod("a")], None),
        ("none ready the whole window", window({"a": 40}, {"a": 400}), [pod("a", 100)], None),
        ("no request counter", window({"a": 40}, {}), [pod("a")], None),
        ("no utilisation", window({}, {"a": 480}), [pod("a")], None),
        ("no serving pod", window({"a": 40}, {"a": 480}), [], None),
    ],
)
def test_a_measurement_is_taken_only_when_the_window_shows_it(
    label: str,
    history: UsageHistory,
    pods: list[PodInfo],
    expected: tuple[float, float | None, float] | None,
) -> None:
    found = measure(history, pods, H100, "fp")
    if expected is None:
        assert found is None
        return
    assert found is not None
    requests, tokens, utilization = expected
    assert found.requests_per_second == pytest.approx(requests)
    assert found.output_tokens_per_second == (None if tokens is None else pytest.approx(tokens))
    assert found.utilization == pytest.approx(utilization)
    assert (found.slice, found.product, found.time) == ("gpu-h100", "h100-80gb", NOW)


def test_on_a_mig_slice_the_instances_activity_is_the_utilisation() -> None:
    history = window({"a": 50}, {"a": 240}, signal="mig_utilization")
    found = measure(history, [pod("a")], MIG_3G, "fp")
    assert found is not None and found.requests_per_second == pytest.approx(4.0)


def measured(slice_: Slice, rps: float, tps: float | None = None, at: float = NOW) -> Measurement:
    return Measurement(slice_.name, slice_.product.key, "fp", rps, tps, 50.0, at)


@pytest.mark.parametrize(
    ("label", "known", "unit", "ratio_2g", "measured_2g"),
    [
        # the catalog: 2g.20gb serves about a quarter of an H100
        ("one slice measured: the catalog", [measured(H100, 10)], REQUESTS_UNIT, 0.26, False),
        (
            "both measured: the measurement, 30 % under the catalog",
            [measured(H100, 10), measured(MIG_2G, 1.82)],
            REQUESTS_UNIT,
            0.182,
            True,
        ),
        (
            "tokens when every measurement has them",
            [measured(H100, 10, 1000), measured(MIG_2G, 1.82, 150)],
            TOKENS_UNIT,
            0.15,
            True,
        ),
        (
            "requests when one lacks them",
            [measured(H100, 10, 1000), measured(MIG_2G, 1.82)],
            REQUESTS_UNIT,
            0.182,
            True,
        ),
        ("nothing measured: the catalog", [], REQUESTS_UNIT, 0.26, False),
    ],
)
def test_measured_throughput_replaces_the_estimate_only_for_pairs_measured(
    label: str, known: list[Measurement], unit: str, ratio_2g: float, measured_2g: bool
) -> None:
    found = capacities({m.key: m for m in known})
    assert found.unit == unit
    ratio, was_measured = speed_ratio(H100, MIG_2G, found.per_slice)
    assert ratio == pytest.approx(ratio_2g, abs=0.005)
    assert was_measured == measured_2g
    # a third slice never measured keeps the catalog's ratio
    assert speed_ratio(H100, MIG_3G, found.per_slice) == (
        pytest.approx(MIG_3G.relative_throughput),
        False,
    )


QUIET = Usage(
    peak_memory_mib=12288,
    mean_utilization=15.0,
    served_rps=1.5,
    replicas=1,
    oom_kills=0,
    coverage=1.0,
)
SPEC = RightSizingSpec.model_validate(
    {"allowedSlices": ["gpu-h100", "mig-2g.20gb"], "minSavingsPercent": 15}
)
OFFERS = [Offer(H100, 8), Offer(MIG_2G, 16)]


def choice(known: list[Measurement]) -> Any:
    return choose_slice(
        H100,
        QUIET,
        OFFERS,
        SPEC,
        target_utilization=70,
        min_replicas=1,
        now=NOW,
        measured=capacities({m.key: m for m in known}).per_slice,
    )


def test_the_next_recommendation_uses_the_learned_figure_and_says_so() -> None:
    # one H100 at 15 %. The catalog says 2g.20gb serves 0.26 of an H100: one slice at 58 %
    estimated = choice([measured(H100, 10)])
    best = estimated.recommended
    assert best.slice == MIG_2G and best.replicas == 1 and not best.measured
    assert "throughput estimated from the catalog)" in estimated.message
    # measured 30 % slower than that: two slices, and the choice says it is measured
    learned = choice([measured(H100, 10), measured(MIG_2G, 1.82)])
    best = learned.recommended
    assert best.slice == MIG_2G and best.replicas == 2 and best.measured
    assert "throughput measured)" in learned.message
    assert "throughput measured on gpu-h100@h100-80gb, mig-2g.20gb@h100-80gb" in learned.message


def test_a_prediction_uses_the_measured_ratio_or_else_the_catalogs() -> None:
    both = capacities({m.key: m for m in [measured(H100, 10), measured(MIG_2G, 1.82)]})
    assert predicted_rate(both, H100, MIG_2G) == pytest.approx(1.82)
    one = capacities({m.key: m for m in [measured(H100, 10)]})
    assert predicted_rate(one, H100, MIG_2G) == pytest.approx(10 * MIG_2G.relative_throughput)
    assert predicted_rate(capacities({}), H100, MIG_2G) is None
    assert surprise(2.6, 1.82) == pytest.approx(-0.3)


def test_the_book_keeps_the_newest_of_each_slice_among_workloads_serving_alike() -> None:
    book = ThroughputBook()
    book.learn(("a", "chat"), [measured(H100, 10, at=NOW - 60), measured(MIG_2G, 1.8)])
    book.learn(("b", "chat"), [measured(H100, 12, at=NOW), measured(MIG_3G, 4, at=NOW - 600)])
    other = Measurement("gpu-h100", "h100-80gb", "other", 3.0, None, 50.0, NOW + 1)
    book.learn(("c", "other"), [other])
    known = book.measured("fp")
    assert known[H100.key].requests_per_second == 12
    assert set(known) == {H100.key, MIG_2G.key, MIG_3G.key}
    assert book.measured("other") == {H100.key: other}
    assert book.measured(None) == {}
    # a deleted workload's measurements go with it; what others measured stays
    book.forget(("b", "chat"))
    known = book.measured("fp")
    assert known[H100.key].requests_per_second == 10 and MIG_3G.key not in known
    # a workload whose status no longer has a slice (its image changed): gone too
    book.learn(("a", "chat"), [measured(H100, 10, at=NOW - 60)])
    assert set(book.measured("fp")) == {H100.key}


def container(**fields: Any) -> dict[str, Any]:
    base = {
        "name": "vllm",
        "image": "vllm/vllm-openai:v0.11.0",
        "args": ["--model", "meta-llama/Llama-3.1-8B-Instruct"],
        "resources": {"limits": {"nvidia.com/gpu": "1"}},
    }
    return {**base, **fields}


def test_the_fingerprint_is_the_model_image_and_arguments_not_the_slice() -> None:
    on_h100 = {"nodeSelector": {"a": "b"}, "containers": [container()]}
    moved = {
        "nodeSelector": {"c": "d"},
        "containers": [container(resources={"limits": {"nvidia.com/mig-2g.20gb": "1"}})],
    }
    other_model = {"containers": [container(args=["--model", "Qwen/Qwen3-8B"])]}
    assert fingerprint(on_h100, None) == fingerprint(moved, None)
    assert fingerprint(on_h100, None) != fingerprint(other_model, None)
    sidecar = {"containers": [{"name": "proxy", "image": "envoy"}, container()]}
    assert fingerprint(sidecar, None) == fingerprint(on_h100, None)
    assert fingerprint(sidecar, "proxy") != fingerprint(on_h100, None)
    assert fingerprint({"containers": [{"name": "cpu-only"}]}, None) is None


def test_measurements_kept_in_a_status_that_do_not_parse_are_dropped() -> None:
    from gpusizer.measurement import measurements_from_status

    kept = {
        "slice": "gpu-h100",
        "product": "h100-80gb",
        "fingerprint": "fp",
        "requestsPerSecond": 10.0,
        "outputTokensPerSecond": 2000.0,
        "utilization": 40.0,
        "time": "2027-01-15T08:00:00Z",
    }
    status = {
        "measuredThroughput": [
            kept,
            {**kept, "requestsPerSecond": -1},  # not a rate
            {**kept, "time": "yesterday"},
            {"slice": "gpu-h100"},
            "garbage",
        ]
    }
    [found] = measurements_from_status(status)
    assert (found.slice, found.requests_per_second, found.output_tokens_per_second) == (
        "gpu-h100",
        10.0,
        2000.0,
    )
    assert measurements_from_status(None) == []
