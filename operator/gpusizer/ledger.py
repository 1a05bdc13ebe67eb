"""The savings ledger: the GPU time, cost and energy each workload used, against static
provisioning for its observed peak, over the last 24 hours and 7 days.

Pure. At every turn the operator counts what the workload's pods held since its previous turn
(`held`) into counters of its own metrics (`report.metrics`). Prometheus keeps them, so the
ledger of a window is their increase there (`signals.queries.ledger_queries`), whole across
the operator's restarts and replicas; `ledger_rows` reads it back. Used is measured: what the
pods held, from the watches, priced by the catalog, and the GPU energy measured over the
right-sizing window for the time they held it. Static is the peak held for the whole time the
workload was followed, with the extra GPUs drawing their idle power (the catalog's).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields

from gpusizer.catalog import Slice
from gpusizer.efficiency import JOULES_PER_KWH, SECONDS_PER_HOUR
from gpusizer.signals.parse import LabelledValue
from gpusizer.signals.pods import PodInfo

WINDOWS: dict[str, int] = {"24h": 86400, "7d": 7 * 86400}


@dataclass(frozen=True)
class Held:
    """What a workload's pods hold now, and what they held since its previous turn."""

    gpus: float = 0.0  # GPU-equivalents: a slice counts as its share of its GPU
    cost_per_hour: float = 0.0
    idle_watts: float = 0.0
    seconds: float = 0.0  # since the previous turn, when it counts
    gpu_seconds: float = 0.0
    cost: float = 0.0
    idle_joules: float = 0.0
    joules: float = 0.0


def held(
    pods: Iterable[tuple[PodInfo, Slice | None]],
    previous_turn: float | None,
    now: float,
    max_gap_seconds: float,
    watts: float | None,
) -> Held:
    """What the pods on a node hold now, and held since `previous_turn`: each pod from its
    creation or the previous turn, whichever is later. Pods gone since the previous turn are
    not counted for the part of it they lived: the operator's own writes add and remove pods
    just after a turn, so counting what is there at the next one is the closer account. A gap
    longer than `max_gap_seconds` (another replica was in charge, or the process stopped)
    counts nothing; `watts` is the pods' draw measured over the last right-sizing period."""
    since = now - previous_turn if previous_turn is not None else 0.0
    if not 0 < since <= max_gap_seconds:
        since = 0.0
    gpus = cost_per_hour = idle = gpu_seconds = cost = idle_joules = 0.0
    for pod, slice_ in pods:
        if slice_ is None or pod.node is None or pod.terminating:
            continue
        share = slice_.share * pod.gpu_count
        pod_cost = slice_.price_per_hour * pod.gpu_count
        pod_idle = slice_.product.idle_watts * slice_.compute_share * pod.gpu_count
        seconds = since if pod.created is None else max(0.0, min(since, now - pod.created))
        gpus += share
        cost_per_hour += pod_cost
        idle += pod_idle
        gpu_seconds += share * seconds
        cost += pod_cost * seconds / SECONDS_PER_HOUR
        idle_joules += pod_idle * seconds
    joules = (watts or 0.0) * since
    return Held(gpus, cost_per_hour, idle, since, gpu_seconds, cost, idle_joules, joules)


@dataclass(frozen=True)
class LedgerRow:
    """One workload's (or, with an empty name, the fleet's) ledger over a window; None:
    Prometheus has no such series for it."""

    namespace: str
    name: str
    window: str
    gpu_hours_used: float | None = None
    gpu_hours_static: float | None = None
    cost_used: float | None = None
    cost_static: float | None = None
    kwh_used: float | None = None
    kwh_static: float | None = None

    def saved(self, used: float | None, static: float | None) -> float | None:
        return None if used is None or static is None else static - used


# query name -> (LedgerRow field, divisor)
_QUANTITIES: dict[str, tuple[str, float]] = {
    "gpu_seconds_used": ("gpu_hours_used", SECONDS_PER_HOUR),
    "gpu_seconds_static": ("gpu_hours_static", SECONDS_PER_HOUR),
    "cost_used": ("cost_used", 1.0),
    "cost_static": ("cost_static", 1.0),
    "joules_used": ("kwh_used", JOULES_PER_KWH),
    "idle_joules_extra": ("kwh_static", JOULES_PER_KWH),
}


def ledger_rows(window: str, results: Mapping[str, Sequence[LabelledValue]]) -> list[LedgerRow]:
    """The ledger queries' answers (`signals.queries.ledger_queries`), one row per workload.
    Static energy is what was used plus the idle draw of what static provisioning would have
    held on top."""
    values: dict[tuple[str, str], dict[str, float]] = {}
    for query, series in results.items():
        if query not in _QUANTITIES:
            continue
        name, divisor = _QUANTITIES[query]
        for item in series:
            key = (item.labels.get("namespace", ""), item.labels.get("name", ""))
            if all(key):
                values.setdefault(key, {})[name] = max(0.0, item.value) / divisor
    rows = []
    for (namespace, name), found in sorted(values.items()):
        extra = found.pop("kwh_static", None)
        used = found.get("kwh_used")
        static = None if used is None or extra is None else used + extra
        rows.append(LedgerRow(namespace, name, window, **found, kwh_static=static))
    return rows


def fleet(window: str, rows: Sequence[LedgerRow]) -> LedgerRow:
    """Every workload together: each statically provisioned for its own peak."""
    totals: dict[str, float | None] = {}
    for field in fields(LedgerRow):
        if field.name in ("namespace", "name", "window"):
            continue
        known = [getattr(r, field.name) for r in rows if getattr(r, field.name) is not None]
        totals[field.name] = sum(known) if known else None
    return LedgerRow("", "", window, **totals)
