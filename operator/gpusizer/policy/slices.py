"""The slice policy: which MIG profile or GPU a workload should run on, and how many of them.

Pure. Demand is measured in "busy current-slice replicas" (replicas x mean utilisation), moved
to another slice by the ratio of their throughputs, and sized at the utilisation target; the
cheapest slice that fits the memory need, is allowed, and exists with free room wins. The
ratio is the measured one when the workload's throughput was measured on both slices
(`gpusizer.throughput`), else the catalog's estimate.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpusizer.api.v1alpha1 import RightSizingSpec
from gpusizer.catalog import Slice
from gpusizer.vocabulary import Reason

MIN_COVERAGE = 0.5
"""Share of historySeconds that must be measured before a recommendation may be applied."""


@dataclass(frozen=True)
class Offer:
    """A slice the cluster has, and how many units of it are free now."""

    slice: Slice
    free: int


@dataclass(frozen=True)
class Usage:
    """What the workload did over historySeconds on its current slice."""

    peak_memory_mib: float | None  # a high percentile of DCGM_FI_DEV_FB_USED, worst pod
    mean_utilization: float | None  # percent, averaged over time and ready pods
    served_rps: float | None  # requests per second served, all replicas
    replicas: int  # replicas running now
    oom_kills: int  # out-of-memory restarts seen on the current pods
    coverage: float  # 0..1: how much of historySeconds the measurement covers


Measured = Mapping[tuple[str, str], float]
"""Throughput per fully busy replica by slice key, in one unit, where it was measured."""


@dataclass(frozen=True)
class Candidate:
    slice: Slice
    replicas: int
    cost_per_hour: float
    fits: bool
    allowed: bool
    free: int
    measured: bool = False  # its throughput against the current slice's was measured
    speed: float = 1.0  # how much faster it serves than the current slice


@dataclass(frozen=True)
class SliceChoice:
    recommended: Candidate | None
    current_cost_per_hour: float | None
    apply: bool  # whether Auto may act on it now
    reason: Reason
    message: str


def memory_need(current: Slice, usage: Usage, headroom_percent: float) -> float | None:
    """MiB the model needs: measured peak plus headroom; after an OOM, more than it had."""
    factor = 1 + headroom_percent / 100
    need = None if usage.peak_memory_mib is None else usage.peak_memory_mib * factor
    if usage.oom_kills > 0:
        need = max(need or 0.0, current.memory_mib * factor)
    return need


def busy_units(usage: Usage) -> float | None:
    """Demand as a number of fully busy current-slice replicas."""
    if usage.mean_utilization is None:
        return None
    return usage.replicas * usage.mean_utilization / 100


def is_allowed(slice_: Slice, allowed: Sequence[str]) -> bool:
    return not allowed or slice_.name in allowed or f"{slice_.name}@{slice_.product.key}" in allowed


def speed_ratio(current: Slice, other: Slice, measured: Measured) -> tuple[float, bool]:
    """How much faster `other` serves than `current`, and whether both were measured."""
    mine, theirs = measured.get(current.key), measured.get(other.key)
    if mine and theirs:
        return theirs / mine, True
    return other.relative_throughput / current.relative_throughput, False


def candidates(
    current: Slice,
    usage: Usage,
    offers: Sequence[Offer],
    spec: RightSizingSpec,
    target_utilization: float,
    min_replicas: int,
    measured: Measured | None = None,
) -> list[Candidate]:
    """Every slice the cluster offers, costed for the measured demand."""
    need = memory_need(current, usage, spec.memory_headroom_percent)
    units = busy_units(usage)
    out = []
    for offer in offers:
        s = offer.slice
        ratio, was_measured = speed_ratio(current, s, measured or {})
        if units is None:
            replicas = max(1, min_replicas, usage.replicas)
        else:
            scaled = units / ratio
            replicas = max(1, min_replicas, math.ceil(scaled / (target_utilization / 100) - 1e-9))
        free = offer.free + (usage.replicas if s == current else 0)
        out.append(
            Candidate(
                slice=s,
                replicas=replicas,
                cost_per_hour=replicas * s.price_per_hour,
                fits=need is not None and s.memory_mib >= need,
                allowed=is_allowed(s, spec.allowed_slices),
                free=free,
                measured=was_measured,
                speed=ratio,
            )
        )
    return sorted(out, key=lambda c: (c.cost_per_hour, c.replicas, c.slice != current))


def choose_slice(
    current: Slice,
    usage: Usage,
    offers: Sequence[Offer],
    spec: RightSizingSpec,
    *,
    target_utilization: float,
    min_replicas: int,
    now: float,
    last_reshape_time: float | None = None,
    min_interval_seconds: float = 0.0,
    measured: Measured | None = None,
) -> SliceChoice:
    """The slice to recommend, and whether Auto may move there now: not within
    `min_interval_seconds` of the last reshape (`last_reshape_time`, None for never).
    `measured`: the throughput measured on each slice (`gpusizer.throughput`)."""
    current_cost = usage.replicas * current.price_per_hour
    need = memory_need(current, usage, spec.memory_headroom_percent)
    if need is None:
        return SliceChoice(
            None, current_cost, False, Reason.NO_MEASUREMENT, "no GPU memory samples yet"
        )
    options = candidates(current, usage, offers, spec, target_utilization, min_replicas, measured)
    eligible = [c for c in options if c.fits and c.allowed]
    if not eligible:
        return SliceChoice(
            None,
            current_cost,
            False,
            Reason.NO_FITTING_SLICE,
            f"no allowed slice in the cluster has {need:.0f} MiB (peak plus headroom)",
        )
    placeable = [c for c in eligible if c.free >= c.replicas]
    best_anywhere = eligible[0]
    out_of_memory = usage.oom_kills > 0
    on_current = next((c for c in options if c.slice == current), None)
    baseline = on_current.cost_per_hour if on_current and on_current.fits else None

    def saving(c: Candidate) -> float:
        return 1 - c.cost_per_hour / baseline if baseline else 1.0

    basis = _basis(usage, need, measured or {})
    best = placeable[0] if placeable else None
    if (
        (best is None or best.slice == current)
        and best_anywhere.slice != current
        and (out_of_memory or saving(best_anywhere) * 100 >= spec.min_savings_percent)
    ):
        return SliceChoice(
            best_anywhere,
            current_cost,
            False,
            Reason.NO_FREE_CAPACITY,
            f"{_describe(best_anywhere)} would fit but the cluster has only "
            f"{best_anywhere.free} free; staying on {current.name}. {basis}",
        )
    if best is None or best.slice == current:
        return SliceChoice(
            on_current or best,
            current_cost,
            False,
            Reason.RIGHT_SIZED,
            f"{current.name} is the cheapest fitting slice. {basis}",
        )
    if best_anywhere.slice != best.slice:
        basis += f" ({_describe(best_anywhere)} would be cheaper but has no free room)"
    saving_now = saving(best)
    if not out_of_memory and saving_now * 100 < spec.min_savings_percent:
        return SliceChoice(
            best,
            current_cost,
            False,
            Reason.SAVING_TOO_SMALL,
            f"{_describe(best)} saves {saving_now:.0%}, under minSavingsPercent "
            f"{spec.min_savings_percent:g}. {basis}",
        )
    reason = Reason.OUT_OF_MEMORY if out_of_memory else Reason.CHEAPER_SLICE
    why = "out of memory on " + current.name if out_of_memory else f"saves {saving_now:.0%}"
    message = f"move to {_describe(best)}: {why}. {basis}"
    if usage.coverage < MIN_COVERAGE and not out_of_memory:
        return SliceChoice(
            best,
            current_cost,
            False,
            Reason.LOW_CONFIDENCE,
            f"low confidence ({usage.coverage:.0%} of historySeconds measured): {message}",
        )
    if last_reshape_time is not None and now - last_reshape_time < min_interval_seconds:
        wait = min_interval_seconds - (now - last_reshape_time)
        return SliceChoice(
            best,
            current_cost,
            False,
            Reason.TOO_SOON,
            f"{message}; next move allowed in {wait:.0f}s",
        )
    return SliceChoice(best, current_cost, True, reason, message)


def _describe(c: Candidate) -> str:
    """Says whether its replica count rests on throughput measured on both slices."""
    basis = "measured" if c.measured else "estimated from the catalog"
    return (
        f"{c.replicas} x {c.slice.name} on {c.slice.product.key} (${c.cost_per_hour:.2f}/h, "
        f"throughput {basis})"
    )


def _basis(usage: Usage, need: float, measured: Measured) -> str:
    parts = [f"memory need {need:.0f} MiB"]
    if usage.peak_memory_mib is not None:
        parts.append(f"peak {usage.peak_memory_mib:.0f} MiB")
    if usage.mean_utilization is not None:
        parts.append(f"mean utilisation {usage.mean_utilization:.1f}% on {usage.replicas}")
    if usage.served_rps is not None:
        parts.append(f"{usage.served_rps:.2f} req/s served")
    if usage.oom_kills:
        parts.append(f"{usage.oom_kills} OOM restart(s)")
    slices = ", ".join(sorted(f"{name}@{product}" for name, product in measured))
    throughput = (
        f"throughput measured on {slices}, estimated from the catalog elsewhere"
        if len(measured) > 1
        else "throughput estimated from the catalog"
    )
    return "Based on " + ", ".join([*parts, throughput]) + "."
