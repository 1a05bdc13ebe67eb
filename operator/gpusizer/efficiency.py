"""What a result costs: cost and energy per 1,000 requests and per million output tokens of one
workload, over the right-sizing window, from what its serving pods did in it.

Pure: from the window's readings (`signals.usage.UsageHistory`), the pods and the catalog.

Every figure is measured or unknown, never a guess: a pod without the series a figure needs
makes that figure unknown, and the reason is kept. The counters' increases come from
Prometheus' `increase()`, which counts a counter that restarts from zero (a server's restart)
from zero; what it cannot tell from a restart, a counter that went backwards while its process
lived, shows as an energy that no GPU can draw, and the power gauge's mean takes its place.

How a MIG instance's energy is counted: DCGM's power and energy are its parent GPU's, repeated
on every instance. An instance gets two parts of its GPU's measured energy: the GPU's idle draw
(`GPUProduct.idle_watts`, the catalog's estimate) split by compute share among the instances
the GPU has, and the rest split by each instance's own work, its GR_ENGINE_ACTIVE times its
compute share. The parts of a GPU's instances add up to the GPU's measured energy, so a wrong
idle estimate moves energy between neighbours on one GPU but neither adds nor loses any.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from gpusizer.catalog import Catalog, Slice
from gpusizer.signals.parse import LabelledValue, PodKey, PodSamples, pod_key
from gpusizer.signals.queries import (
    ACTIVE,
    ENERGY,
    OUTPUT_TOKENS,
    POWER,
    PROMPT_TOKENS,
    REQUESTS,
)
from gpusizer.signals.usage import UsageHistory

JOULES_PER_KWH = 3.6e6
MILLIJOULES_PER_JOULE = 1000.0
SECONDS_PER_HOUR = 3600.0

MAX_POWER_OVER_BOARD = 1.2
"""An energy increase that means more than this times board power is a counter that jumped
(went backwards and was taken for a restart), not energy."""


@dataclass(frozen=True)
class ServingPod:
    """A pod that serves now, and the part of the window it held its slice."""

    key: PodKey
    slice: Slice | None  # None: its GPU resource or node product is not in the catalog
    units: int
    seconds: float


@dataclass(frozen=True)
class InstanceReading:
    """One series of a MIG instance over the window: its parent GPU's energy (J) and mean power
    (W) while the series existed, and the instance's own mean GR_ENGINE_ACTIVE (0-1)."""

    gpu: str
    instance: str
    profile: str
    model_name: str
    pod: PodKey | None
    energy_joules: float | None
    power_watts: float | None
    active: float | None


@dataclass(frozen=True)
class PodEnergy:
    joules: float
    watts: float  # mean draw attributed to the pod
    from_power_gauge: bool = False


@dataclass(frozen=True)
class Figures:
    """What a result costs, in the catalog's currency and kWh; None: unknown."""

    cost_per_1k_requests: float | None = None
    cost_per_million_output_tokens: float | None = None
    kwh_per_1k_requests: float | None = None
    kwh_per_million_output_tokens: float | None = None
    output_tokens_per_second_per_cost_per_hour: float | None = None

    def scaled(self, cost: float | None, energy: float | None) -> Figures:
        """The same results at `cost` times the cost and `energy` times the energy."""

        def times(value: float | None, factor: float | None) -> float | None:
            return None if value is None or factor is None else value * factor

        per_hour = self.output_tokens_per_second_per_cost_per_hour
        return Figures(
            cost_per_1k_requests=times(self.cost_per_1k_requests, cost),
            cost_per_million_output_tokens=times(self.cost_per_million_output_tokens, cost),
            kwh_per_1k_requests=times(self.kwh_per_1k_requests, energy),
            kwh_per_million_output_tokens=times(self.kwh_per_million_output_tokens, energy),
            output_tokens_per_second_per_cost_per_hour=None
            if per_hour is None or not cost
            else per_hour / cost,
        )

    def as_dict(self) -> dict[str, float | None]:
        """The figures by field name. Not `dataclasses.asdict`, which deep-copies each value:
        a turn asks twice, and that copy was half of what its status fields cost
        (bench/README.md, "Issue 29: a wave of status writes; a scrape's memory")."""
        return dict(vars(self))


@dataclass(frozen=True)
class Efficiency:
    """The serving pods' totals over the window, and why any is unknown."""

    window_seconds: int
    pods: int
    requests: float | None
    output_tokens: float | None
    prompt_tokens: float | None
    joules: float | None
    cost: float | None
    gpu_seconds: float | None  # GPU-equivalents (a slice's share of its GPU) times seconds
    watts: float | None  # mean draw attributed to the serving pods, together
    unknown: tuple[str, ...] = ()

    @property
    def figures(self) -> Figures:
        def per(amount: float | None, results: float | None, scale: float) -> float | None:
            if amount is None or results is None or results <= 0:
                return None
            return amount / results * scale

        kwh = None if self.joules is None else self.joules / JOULES_PER_KWH
        tokens_per_cost = per(self.output_tokens, self.cost, 1.0)
        return Figures(
            cost_per_1k_requests=per(self.cost, self.requests, 1e3),
            cost_per_million_output_tokens=per(self.cost, self.output_tokens, 1e6),
            kwh_per_1k_requests=per(kwh, self.requests, 1e3),
            kwh_per_million_output_tokens=per(kwh, self.output_tokens, 1e6),
            # tokens/s over cost/h: tokens per unit of cost, per second of an hour
            output_tokens_per_second_per_cost_per_hour=None
            if tokens_per_cost is None
            else tokens_per_cost / SECONDS_PER_HOUR,
        )


def instance_readings(instances: Mapping[str, Sequence[LabelledValue]]) -> list[InstanceReading]:
    """The instance queries' series (`signals.queries.instance_queries`), joined by their labels."""
    joined: dict[tuple[str, str, str, str, PodKey | None], dict[str, float]] = {}
    for name, series in instances.items():
        for item in series:
            labels = item.labels
            key = (
                labels.get("UUID", ""),
                labels.get("GPU_I_ID", ""),
                labels.get("GPU_I_PROFILE", ""),
                labels.get("modelName", ""),
                pod_key(labels),
            )
            joined.setdefault(key, {})[name] = item.value
    return [
        InstanceReading(
            gpu=gpu,
            instance=instance,
            profile=profile,
            model_name=model,
            pod=pod,
            energy_joules=None if ENERGY not in v else v[ENERGY] / MILLIJOULES_PER_JOULE,
            power_watts=v.get(POWER),
            active=v.get(ACTIVE),
        )
        for (gpu, instance, profile, model, pod), v in joined.items()
        if gpu and instance
    ]


ShareOf = Callable[[str, str], tuple[float, float, float] | None]
"""(modelName, GPU_I_PROFILE) -> the profile's compute share, its GPU's idle and board power."""


def catalog_shares(catalog: Catalog) -> ShareOf:
    def share_of(model_name: str, profile: str) -> tuple[float, float, float] | None:
        product = catalog.product_by_model_name(model_name)
        mig = product.mig if product is not None else None
        if product is None or mig is None or profile not in mig.profiles:
            return None
        compute = mig.profiles[profile].compute_slices / mig.compute_slices
        return compute, product.idle_watts, product.board_power_watts

    return share_of


def split_mig_energy(
    readings: Sequence[InstanceReading], share_of: ShareOf, seconds: Mapping[PodKey, float]
) -> tuple[dict[PodKey, PodEnergy], dict[PodKey, str]]:
    """Each held instance's part of its GPU's energy (see the module's docstring); a pod whose
    GPU cannot be split is in the second dict with the reason. `seconds` is how long each pod
    held its instance in the window: an energy that would mean more than MAX_POWER_OVER_BOARD
    times board power over it is replaced by the power gauge's mean times it."""
    by_gpu: dict[str, list[InstanceReading]] = {}
    for reading in readings:
        by_gpu.setdefault(reading.gpu, []).append(reading)
    energy: dict[PodKey, PodEnergy] = {}
    failed: dict[PodKey, str] = {}
    for gpu, series in by_gpu.items():
        held = [(s, s.pod) for s in series if s.pod is not None and s.pod in seconds]
        if not held:
            continue
        parts, problem = _gpu_parts(gpu, series, share_of)
        for s, pod in held:
            if problem is not None:
                failed[pod] = problem
                continue
            share, board = parts[s.instance]
            joules, from_gauge = _plausible_joules(s, board, seconds[pod])
            if joules is None:
                failed[pod] = f"no energy or power series for instance {s.instance} of GPU {gpu}"
                continue
            part = share(s)
            before = energy.get(pod, PodEnergy(0.0, 0.0))
            energy[pod] = PodEnergy(
                before.joules + part * joules,
                before.watts + part * (s.power_watts or 0.0),
                before.from_power_gauge or from_gauge,
            )
    for pod in failed:
        energy.pop(pod, None)
    return energy, failed


def _plausible_joules(
    reading: InstanceReading, board_watts: float, seconds: float
) -> tuple[float | None, bool]:
    """The GPU's energy over the pod's time, from the counter, else from the power gauge."""
    joules, watts = reading.energy_joules, reading.power_watts
    ceiling = MAX_POWER_OVER_BOARD * board_watts * seconds
    if joules is not None and 0 <= joules <= ceiling:
        return joules, False
    if watts is not None and watts >= 0:
        return watts * seconds, True
    return None, False


def _gpu_parts(
    gpu: str, series: Sequence[InstanceReading], share_of: ShareOf
) -> tuple[dict[str, tuple[Callable[[InstanceReading], float], float]], str | None]:
    """Per instance of one GPU: the share of the GPU's energy a series of it gets, and the
    GPU's board power; or why the GPU cannot be split."""
    compute: dict[str, float] = {}
    idle = board = 0.0
    weighted: dict[str, tuple[float, float]] = {}  # instance -> (sum of active x weight, weight)
    for s in series:
        found = share_of(s.model_name, s.profile)
        if found is None:
            gpu_name = s.model_name or "an unknown GPU"
            return {}, f"MIG profile {s.profile} of {gpu_name} is not in the catalog"
        if s.active is None:
            return {}, f"no GR_ENGINE_ACTIVE for instance {s.instance} of GPU {gpu}"
        compute[s.instance], idle, board = found
        # a series' weight is how long it lasted: its energy over its mean power
        lasted = 1.0
        if s.energy_joules is not None and s.power_watts:
            lasted = max(0.0, s.energy_joules / s.power_watts)
        total, weight = weighted.get(s.instance, (0.0, 0.0))
        weighted[s.instance] = (total + s.active * lasted, weight + lasted)
    all_compute = sum(compute.values())
    work = sum(
        compute[i] * (total / weight if weight else 0.0) for i, (total, weight) in weighted.items()
    )

    def part_of(instance: str) -> Callable[[InstanceReading], float]:
        def share(s: InstanceReading) -> float:
            idle_fraction = 1.0 if not s.power_watts else min(1.0, idle / s.power_watts)
            by_compute = compute[instance] / all_compute
            by_work = (s.active or 0.0) * compute[instance] / work if work > 0 else by_compute
            return idle_fraction * by_compute + (1 - idle_fraction) * min(1.0, by_work)

        return share

    return {i: (part_of(i), board) for i in compute}, None


def _whole_gpu_energy(
    pod: ServingPod, energy: PodSamples | None, power: PodSamples | None
) -> PodEnergy | None:
    """A pod's own GPUs' energy over its time, from the counter, else from the power gauge."""
    assert pod.slice is not None
    sample = energy.samples.get(pod.key) if energy is not None else None
    watts_sample = power.samples.get(pod.key) if power is not None else None
    watts = watts_sample.value if watts_sample is not None else None
    ceiling = MAX_POWER_OVER_BOARD * pod.slice.product.board_power_watts * pod.units * pod.seconds
    if sample is not None and 0 <= sample.value / MILLIJOULES_PER_JOULE <= ceiling:
        joules = sample.value / MILLIJOULES_PER_JOULE
        return PodEnergy(joules, watts if watts is not None else joules / max(pod.seconds, 1.0))
    if watts is not None and watts >= 0:
        return PodEnergy(watts * pod.seconds, watts, from_power_gauge=True)
    return None


def _total(
    name: str, samples: PodSamples | None, pods: Sequence[ServingPod]
) -> tuple[float | None, str | None]:
    """The sum over the pods of a counter's increase; unknown when a pod has none."""
    if samples is None:
        return None, f"{name}: the query failed"
    found = samples.samples
    missing = [p.key for p in pods if p.key not in found]
    backwards = [p.key for p in pods if p.key in found and found[p.key].value < 0]
    if missing:
        shown = ", ".join(f"{ns}/{pod}" for ns, pod in missing[:3])
        return None, f"{name}: no series for {len(missing)} of {len(pods)} pods ({shown})"
    if backwards:
        return None, f"{name}: the counter went backwards on {backwards[0][0]}/{backwards[0][1]}"
    return sum(found[p.key].value for p in pods), None


def efficiency(history: UsageHistory, pods: Sequence[ServingPod], catalog: Catalog) -> Efficiency:
    """The serving pods' requests, tokens, energy and cost over the window."""
    window = history.window_seconds
    if not pods:
        return Efficiency(window, 0, None, None, None, None, None, None, None, ("no serving pods",))
    unknown: list[str] = []

    def total(name: str, signal: str) -> float | None:
        value, problem = _total(name, history.signals.get(signal), pods)
        if problem is not None:
            unknown.append(problem)
        return value

    requests = total("requests", REQUESTS)
    output_tokens = total("output tokens", OUTPUT_TOKENS)
    prompt_tokens = total("prompt tokens", PROMPT_TOKENS)
    unplaced = [p for p in pods if p.slice is None]
    cost = gpu_seconds = None
    if unplaced:
        unknown.append(f"cost: the slice of {unplaced[0].key[1]} is not in the catalog")
    else:
        cost = sum(p.slice.price_per_hour * p.units * p.seconds for p in pods if p.slice) / 3600
        gpu_seconds = sum(p.slice.share * p.units * p.seconds for p in pods if p.slice)
    joules, watts = _energy(history, pods, catalog, unknown)
    return Efficiency(
        window_seconds=window,
        pods=len(pods),
        requests=requests,
        output_tokens=output_tokens,
        prompt_tokens=prompt_tokens,
        joules=joules,
        cost=cost,
        gpu_seconds=gpu_seconds,
        watts=watts,
        unknown=tuple(unknown),
    )


def draw_watts(draw: UsageHistory, pods: Sequence[ServingPod], catalog: Catalog) -> float | None:
    """The pods' GPU draw (W) over a short window (`signals.queries.draw_queries`), split as
    their energy is; unknown when a pod's is."""
    return _energy(draw, pods, catalog, [])[1]


def _energy(
    history: UsageHistory, pods: Sequence[ServingPod], catalog: Catalog, unknown: list[str]
) -> tuple[float | None, float | None]:
    """The pods' energy (J) and mean draw (W) together; unknown (and said why) when a pod's is."""
    if any(p.slice is None for p in pods):
        unknown.append("energy: a pod's GPU is not in the catalog")
        return None, None
    mig = {p.key: p.seconds for p in pods if p.slice is not None and p.slice.profile is not None}
    split, failed = split_mig_energy(
        instance_readings(history.instances_of(mig)), catalog_shares(catalog), mig
    )
    joules = watts = 0.0
    from_gauge = []
    for pod in pods:
        if pod.key in mig:
            found = split.get(pod.key)
            why = failed.get(pod.key) or f"no MIG instance series for {pod.key[1]}"
        else:
            found = _whole_gpu_energy(pod, history.signals.get(ENERGY), history.signals.get(POWER))
            why = f"no energy or power series for {pod.key[1]}"
        if found is None:
            unknown.append(f"energy: {why}")
            return None, None
        joules += found.joules
        watts += found.watts
        if found.from_power_gauge:
            from_gauge.append(pod.key[1])
    if from_gauge:
        unknown.append(
            f"energy of {', '.join(from_gauge[:3])} from the mean power: its energy counter "
            "jumped or is missing"
        )
    return joules, watts


def slice_watts(slice_: Slice, replicas: int, busy_units: float) -> float:
    """Estimated draw of `replicas` of a slice doing `busy_units` of fully busy replicas' work:
    the slice's share of its GPU's idle draw, plus its share of the rest in proportion to its
    use (the split the module's docstring describes)."""
    product = slice_.product
    idle = product.idle_watts * slice_.compute_share
    dynamic = (product.board_power_watts - product.idle_watts) * slice_.compute_share
    use = min(1.0, busy_units / replicas) if replicas > 0 else 0.0
    return replicas * (idle + dynamic * use)


def after_move(
    now: Efficiency,
    cost_per_hour_now: float | None,
    cost_per_hour_after: float,
    watts_after: float,
) -> Figures:
    """The same results after a move: the cost scaled by the hourly costs, the energy by the
    measured draw now against the estimated draw after. Estimates, always."""
    cost = cost_per_hour_after / cost_per_hour_now if cost_per_hour_now else None
    energy = watts_after / now.watts if now.watts else None
    return now.figures.scaled(cost, energy)


def rounded(figures: Figures, digits: int = 4) -> Figures:
    """To `digits` significant digits: the status changes only when a figure does."""

    def significant(value: float | None) -> float | None:
        if value is None or value == 0 or not math.isfinite(value):
            return value
        return round(value, digits - 1 - math.floor(math.log10(abs(value))))

    return Figures(**{name: significant(value) for name, value in figures.as_dict().items()})
