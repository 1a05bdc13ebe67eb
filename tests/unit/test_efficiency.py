"""What a result costs: the arithmetic over the window's readings, as tables. Counters over
restarts, a MIG instance's share of its GPU's energy, and a missing series making a figure
unknown, never a guess."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest
from gpusizer.catalog import Slice, load_catalog
from gpusizer.efficiency import (
    InstanceReading,
    ServingPod,
    after_move,
    catalog_shares,
    draw_watts,
    efficiency,
    instance_readings,
    slice_watts,
    split_mig_energy,
)
from gpusizer.signals.parse import LabelledValue, PodSamples, Problem, Sample
from gpusizer.signals.queries import ACTIVE, ENERGY, OUTPUT_TOKENS, POWER, PROMPT_TOKENS, REQUESTS
from gpusizer.signals.usage import UsageHistory
from gpusizer.vocabulary import Reason

CATALOG = load_catalog()
H100 = "NVIDIA H100 80GB HBM3"
WINDOW = 60
NOW = 1_800_000_000.0


def whole() -> Slice:
    found = CATALOG.slice("gpu-h100", "h100-80gb")
    assert found is not None
    return found


def mig(name: str) -> Slice:
    found = CATALOG.slice(name, "h100-80gb")
    assert found is not None
    return found


def samples(**by_pod: float) -> PodSamples:
    return PodSamples({("llm", pod): Sample(value, 0) for pod, value in by_pod.items()})


def history(
    signals: dict[str, PodSamples], instances: dict[str, list[LabelledValue]] | None = None
) -> UsageHistory:
    return UsageHistory(WINDOW, NOW, signals=signals, instances=instances or {})


def pod(
    name: str, slice_: Slice | None = None, seconds: float = WINDOW, units: int = 1
) -> ServingPod:
    return ServingPod(("llm", name), slice_ if slice_ is not None else whole(), units, seconds)


# two whole H100s over a minute at 350 W: 21 kJ each; 600 requests, 60,000 output tokens
BUSY = {
    REQUESTS: samples(a=300, b=300),
    OUTPUT_TOKENS: samples(a=30_000, b=30_000),
    PROMPT_TOKENS: samples(a=90_000, b=90_000),
    ENERGY: samples(a=21_000_000, b=21_000_000),  # mJ
    POWER: samples(a=350, b=350),
}


def test_the_figures_of_two_busy_whole_gpus() -> None:
    found = efficiency(history(BUSY), [pod("a"), pod("b")], CATALOG)
    assert found.unknown == ()
    cost = 2 * 3.00 * WINDOW / 3600  # two H100s for a minute at $3/h
    kwh = 42_000 / 3.6e6
    figures = found.figures
    assert figures.cost_per_1k_requests == pytest.approx(cost / 600 * 1000)
    assert figures.cost_per_million_output_tokens == pytest.approx(cost / 60_000 * 1e6)
    assert figures.kwh_per_1k_requests == pytest.approx(kwh / 600 * 1000)
    assert figures.kwh_per_million_output_tokens == pytest.approx(kwh / 60_000 * 1e6)
    # 1,000 tokens/s at $6/h
    assert figures.output_tokens_per_second_per_cost_per_hour == pytest.approx(1000 / 6)
    assert found.watts == pytest.approx(700)
    assert found.gpu_seconds == pytest.approx(2 * WINDOW)


@pytest.mark.parametrize(
    ("label", "change", "unknown", "figures"),
    [
        (
            "no request counter on one pod (metrics.server none, or a server without one)",
            {REQUESTS: samples(a=300)},
            "requests: no series for 1 of 2 pods (llm/b)",
            {"cost_per_1k_requests": None, "kwh_per_1k_requests": None},
        ),
        (
            "no token counter (Triton counts none)",
            {OUTPUT_TOKENS: PodSamples()},
            "output tokens: no series for 2 of 2 pods",
            {"cost_per_million_output_tokens": None, "kwh_per_million_output_tokens": None},
        ),
        (
            "the request query failed",
            {REQUESTS: None},
            "requests: the query failed",
            {"cost_per_1k_requests": None},
        ),
        (
            "no energy counter, no power gauge",
            {ENERGY: samples(a=21_000_000), POWER: samples(a=350)},
            "energy: no energy or power series for b",
            {"kwh_per_1k_requests": None, "kwh_per_million_output_tokens": None},
        ),
        (
            "a counter that went backwards (never from Prometheus' increase(): hostile input)",
            {REQUESTS: samples(a=300, b=-5)},
            "requests: the counter went backwards on llm/b",
            {"cost_per_1k_requests": None},
        ),
    ],
)
def test_a_missing_series_makes_its_figures_unknown_not_zero(
    label: str,
    change: dict[str, PodSamples | None],
    unknown: str,
    figures: dict[str, float | None],
) -> None:
    signals = {**BUSY, **change}
    readings = history({k: v for k, v in signals.items() if v is not None})
    found = efficiency(readings, [pod("a"), pod("b")], CATALOG)
    assert any(u.startswith(unknown) for u in found.unknown), found.unknown
    shown = found.figures
    for name, value in figures.items():
        assert getattr(shown, name) == value, name
    # the figures that do not need the missing series are still there
    assert shown.cost_per_1k_requests is not None or shown.kwh_per_million_output_tokens is not None


def test_no_requests_served_is_unknown_per_request_not_infinite() -> None:
    idle = {**BUSY, REQUESTS: samples(a=0, b=0), OUTPUT_TOKENS: samples(a=0, b=0)}
    figures = efficiency(history(idle), [pod("a"), pod("b")], CATALOG).figures
    assert figures.cost_per_1k_requests is None and figures.kwh_per_1k_requests is None


def test_no_serving_pod_measures_nothing() -> None:
    found = efficiency(history(BUSY), [], CATALOG)
    assert found.unknown == ("no serving pods",)
    assert found.figures.cost_per_1k_requests is None


@pytest.mark.parametrize(
    ("label", "energy_mj", "power_w", "joules", "from_gauge"),
    [
        (
            "the counter: a restart of the server resets no GPU counter",
            21_000_000,
            350,
            21_000,
            False,
        ),
        (
            # a GPU counter that went backwards is taken for a reset by increase(), which then
            # adds its whole value since the driver loaded: no GPU draws that
            "a counter that jumped: the power gauge's mean",
            9.9e12,
            350,
            350 * WINDOW,
            True,
        ),
        ("no counter: the power gauge's mean", None, 300, 300 * WINDOW, True),
        ("a negative increase: the power gauge's mean", -5_000, 300, 300 * WINDOW, True),
    ],
)
def test_energy_over_the_window_survives_counter_resets(
    label: str, energy_mj: float | None, power_w: float, joules: float, from_gauge: bool
) -> None:
    signals = dict(BUSY)
    signals[ENERGY] = samples(a=energy_mj) if energy_mj is not None else PodSamples()
    signals[POWER] = samples(a=power_w)
    found = efficiency(history(signals), [pod("a")], CATALOG)
    assert found.joules == pytest.approx(joules)
    noted = any("from the mean power" in u for u in found.unknown)
    assert noted == from_gauge, found.unknown


def test_a_pod_that_held_its_gpu_for_part_of_the_window_costs_that_part() -> None:
    found = efficiency(history(BUSY), [pod("a", seconds=15), pod("b")], CATALOG)
    assert found.cost == pytest.approx(3.00 * (15 + WINDOW) / 3600)


def test_a_pod_on_a_gpu_the_catalog_does_not_know_has_no_cost_or_energy() -> None:
    unknown = ServingPod(("llm", "a"), None, 1, WINDOW)
    found = efficiency(history(BUSY), [unknown, pod("b")], CATALOG)
    assert found.cost is None and found.joules is None
    assert found.requests == 600  # counted all the same


# --- a MIG instance's share of its GPU's energy -----------------------------------------

BALANCED = [("1", "1g.10gb"), ("2", "1g.10gb"), ("3", "2g.20gb"), ("4", "3g.40gb")]


def gpu(
    active: dict[str, float], pods: dict[str, str], power: float, uuid: str = "GPU-1"
) -> list[InstanceReading]:
    """One balanced H100's instances over the window, all at the GPU's `power`."""
    return [
        InstanceReading(
            gpu=uuid,
            instance=instance,
            profile=profile,
            model_name=H100,
            pod=("llm", pods[instance]) if instance in pods else None,
            energy_joules=power * WINDOW,
            power_watts=power,
            active=active.get(instance, 0.0),
        )
        for instance, profile in BALANCED
    ]


def emulated_power(active: dict[str, float]) -> float:
    """The emulator's GPU power: idle plus the rest in proportion to compute-weighted work."""
    compute = {"1": 1 / 7, "2": 1 / 7, "3": 2 / 7, "4": 3 / 7}
    return 70 + 630 * sum(a * compute[i] for i, a in active.items())


@pytest.mark.parametrize(
    ("label", "active", "pods", "expected_watts"),
    [
        # 3g.40gb at half: 70 x 3/7 idle + 630 x 0.5 x 3/7 = 30 + 135 W; its neighbours idle
        ("one busy instance, idle neighbours", {"4": 0.5}, {"4": "big"}, {"big": 165.0}),
        # every instance idle: the idle draw by compute share
        (
            "all idle",
            {},
            {"1": "s1", "3": "mid", "4": "big"},
            {"s1": 10.0, "mid": 20.0, "big": 30.0},
        ),
        # a busy 1g next to a busy 3g: each pays for its own work
        (
            "two busy neighbours",
            {"1": 1.0, "4": 1.0},
            {"1": "s1", "4": "big"},
            {"s1": 10 + 90.0, "big": 30 + 270.0},
        ),
    ],
)
def test_a_mig_instance_gets_its_idle_share_and_its_own_work(
    label: str, active: dict[str, float], pods: dict[str, str], expected_watts: dict[str, float]
) -> None:
    power = emulated_power(active)
    readings = gpu(active, pods, power)
    held = {("llm", name): float(WINDOW) for name in pods.values()}
    split, failed = split_mig_energy(readings, catalog_shares(CATALOG), held)
    assert failed == {}
    for name, watts in expected_watts.items():
        assert split[("llm", name)].watts == pytest.approx(watts)
        assert split[("llm", name)].joules == pytest.approx(watts * WINDOW)


def test_the_parts_of_a_gpu_add_up_to_its_measured_energy() -> None:
    active = {"1": 0.3, "2": 0.9, "3": 0.1, "4": 0.6}
    pods = {i: f"p{i}" for i, _ in BALANCED}
    power = emulated_power(active) * 1.07  # a GPU the emulator's model does not describe
    split, _ = split_mig_energy(
        gpu(active, pods, power),
        catalog_shares(CATALOG),
        {("llm", p): float(WINDOW) for p in pods.values()},
    )
    assert sum(e.joules for e in split.values()) == pytest.approx(power * WINDOW)


def test_mig_energy_is_never_summed_across_a_gpus_instances() -> None:
    """Every instance repeats its GPU's counter: a pod gets a share of one GPU's energy."""
    active = {"4": 1.0}
    readings = gpu(active, {"4": "big"}, emulated_power(active))
    split, _ = split_mig_energy(readings, catalog_shares(CATALOG), {("llm", "big"): WINDOW})
    assert split[("llm", "big")].joules < emulated_power(active) * WINDOW


@pytest.mark.parametrize(
    ("label", "broken", "why"),
    [
        (
            "a neighbour without GR_ENGINE_ACTIVE: the split is unknown",
            lambda r: replace(r, active=None) if r.instance == "2" else r,
            "no GR_ENGINE_ACTIVE for instance 2 of GPU GPU-1",
        ),
        (
            "a profile the catalog does not know",
            lambda r: replace(r, profile="5g.50gb") if r.instance == "1" else r,
            "MIG profile 5g.50gb of NVIDIA H100 80GB HBM3 is not in the catalog",
        ),
        (
            "no energy and no power on the pod's instance",
            lambda r: replace(r, energy_joules=None, power_watts=None) if r.instance == "4" else r,
            "no energy or power series for instance 4 of GPU GPU-1",
        ),
    ],
)
def test_a_gpu_that_cannot_be_split_leaves_its_pods_energy_unknown(
    label: str, broken: Callable[[InstanceReading], InstanceReading], why: str
) -> None:
    readings = [broken(r) for r in gpu({"4": 0.5}, {"4": "big"}, 205.0)]
    split, failed = split_mig_energy(readings, catalog_shares(CATALOG), {("llm", "big"): WINDOW})
    assert split == {} and failed == {("llm", "big"): why}


def test_instance_series_are_joined_by_their_labels() -> None:
    labels = {
        "UUID": "GPU-1",
        "GPU_I_ID": "4",
        "GPU_I_PROFILE": "3g.40gb",
        "modelName": H100,
        "exported_namespace": "llm",
        "exported_pod": "big",
    }
    unheld = {**labels, "GPU_I_ID": "1", "GPU_I_PROFILE": "1g.10gb"}
    del unheld["exported_pod"], unheld["exported_namespace"]
    joined = instance_readings(
        {
            ENERGY: [LabelledValue(labels, 12_300_000.0), LabelledValue(unheld, 12_300_000.0)],
            POWER: [LabelledValue(labels, 205.0)],
            ACTIVE: [LabelledValue(labels, 0.5), LabelledValue(unheld, 0.0)],
        }
    )
    by_instance = {r.instance: r for r in joined}
    assert by_instance["4"] == InstanceReading(
        "GPU-1", "4", "3g.40gb", H100, ("llm", "big"), 12_300.0, 205.0, 0.5
    )
    assert by_instance["1"].pod is None and by_instance["1"].power_watts is None


def instance_series(readings: list[InstanceReading]) -> dict[str, list[LabelledValue]]:
    """What the instance queries would answer for these readings."""
    series: dict[str, list[LabelledValue]] = {ENERGY: [], POWER: [], ACTIVE: []}
    for r in readings:
        labels = {
            "UUID": r.gpu,
            "GPU_I_ID": r.instance,
            "GPU_I_PROFILE": r.profile,
            "modelName": r.model_name,
            **({"namespace": r.pod[0], "pod": r.pod[1]} if r.pod else {}),
        }
        series[ENERGY].append(LabelledValue(labels, (r.energy_joules or 0.0) * 1000))
        series[POWER].append(LabelledValue(labels, r.power_watts or 0.0))
        series[ACTIVE].append(LabelledValue(labels, r.active or 0.0))
    return series


def test_a_mig_pod_through_the_whole_window_readings() -> None:
    active = {"4": 0.5}
    series = instance_series(gpu(active, {"4": "big"}, emulated_power(active)))
    signals = {REQUESTS: samples(big=120), OUTPUT_TOKENS: samples(big=12_000)}
    found = efficiency(history(signals, series), [pod("big", mig("mig-3g.40gb"))], CATALOG)
    assert found.watts == pytest.approx(165.0)
    assert found.cost == pytest.approx(1.50 * WINDOW / 3600)  # half an H100's price
    assert found.figures.kwh_per_1k_requests == pytest.approx(165 * WINDOW / 3.6e6 / 120 * 1000)


def test_the_draw_is_split_as_the_energy_from_power_and_activity_alone() -> None:
    """The ledger's draw is read without energy counters (`signals.queries.draw_queries`)."""
    active = {"4": 0.5}
    series = instance_series(gpu(active, {"4": "big"}, emulated_power(active)))
    del series[ENERGY]
    whole_gpu = {POWER: samples(a=400.0)}
    serving = [pod("big", mig("mig-3g.40gb")), pod("a")]
    assert draw_watts(history(whole_gpu, series), serving, CATALOG) == pytest.approx(165 + 400)
    assert draw_watts(history({}, series), serving, CATALOG) is None  # a's draw is unknown


def test_a_turn_reads_the_instance_series_of_its_own_gpus_only() -> None:
    """The window holds a series for every pod that held an instance in it, so where pods come
    and go they grow for as long as the window; every workload's turn reads those of the GPUs
    its pods held, the neighbours' included (the split needs them), and no other GPU's."""
    mine = gpu({"4": 0.5, "1": 0.2}, {"4": "big", "1": "neighbour"}, 205.0)
    gone = [r for n in range(3) for r in gpu({}, {"1": f"gone-{n}"}, 100.0, uuid="GPU-2")]
    window = history({}, instance_series(mine + gone))
    read = window.instances_of([("llm", "big")])
    assert {s.labels["UUID"] for series in read.values() for s in series} == {"GPU-1"}
    assert [len(read[name]) for name in (ENERGY, POWER, ACTIVE)] == [len(mine)] * 3
    assert window.instances_of([("llm", "nobody")]) == {}
    signals = {REQUESTS: samples(big=120), OUTPUT_TOKENS: samples(big=12_000)}
    serving = [pod("big", mig("mig-3g.40gb"))]
    alone = efficiency(history(signals, instance_series(mine)), serving, CATALOG)
    assert alone.joules is not None
    crowded = history(signals, instance_series(mine + gone))
    assert efficiency(crowded, serving, CATALOG) == alone


# --- after a move: estimates --------------------------------------------------------------


def test_slice_power_follows_the_emulated_split() -> None:
    assert slice_watts(whole(), 1, 0.5) == pytest.approx(70 + 630 * 0.5)
    assert slice_watts(mig("mig-3g.40gb"), 2, 1.0) == pytest.approx(2 * (30 + 270 * 0.5))
    assert slice_watts(mig("mig-3g.40gb"), 0, 1.0) == 0


def test_after_a_move_the_same_results_cost_what_the_new_slices_cost() -> None:
    now = efficiency(history(BUSY), [pod("a"), pod("b")], CATALOG)
    before, after = now.figures, after_move(now, 6.00, 1.50, 175.0)
    assert before.cost_per_1k_requests and before.kwh_per_1k_requests
    assert before.output_tokens_per_second_per_cost_per_hour
    assert after.cost_per_1k_requests == pytest.approx(before.cost_per_1k_requests / 4)
    assert after.kwh_per_1k_requests == pytest.approx(before.kwh_per_1k_requests / 4)
    per_hour = before.output_tokens_per_second_per_cost_per_hour
    assert after.output_tokens_per_second_per_cost_per_hour == pytest.approx(per_hour * 4)
    unknown_power = replace(now, watts=None)
    assert after_move(unknown_power, 6.00, 1.50, 175.0).kwh_per_1k_requests is None


def test_problems_from_prometheus_are_not_in_the_window() -> None:
    """A history whose query failed has no samples for it, and says why elsewhere."""
    readings = history({k: v for k, v in BUSY.items() if k != ENERGY})
    readings.errors[ENERGY] = Problem(Reason.PROMETHEUS_UNREACHABLE, "down")
    found = efficiency(readings, [pod("a"), pod("b")], CATALOG)
    assert found.joules == pytest.approx(42_000)  # the power gauge's mean, and said so
    assert any("from the mean power" in u for u in found.unknown)
