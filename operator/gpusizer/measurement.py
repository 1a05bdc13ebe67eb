"""A turn's measuring step: what the workload's results cost over the right-sizing window, the
throughput it showed on its slice, and what its pods held since its previous turn, for the
status, the operator's metrics and the slice choice.

Learned throughput is kept in the WorkloadSizing's status (`measuredThroughput`): it lives as
long as the workload, survives the operator's restarts and replicas, needs no permission or
object of its own and no write that every workload contends for, and `kubectl get -o yaml`
shows it. Workloads that serve alike (`throughput.fingerprint`) share theirs through the
in-process `ThroughputBook`, which every turn fills from its workload's status.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpusizer.actuate.target_view import TargetView
from gpusizer.api import v1alpha1 as api
from gpusizer.api.v1alpha1 import WorkloadSizingSpec
from gpusizer.catalog import Catalog, Slice
from gpusizer.efficiency import Efficiency, ServingPod, draw_watts, efficiency, rounded
from gpusizer.ledger import WINDOWS, LedgerRow, held
from gpusizer.report import metrics
from gpusizer.signals.discovery import NodeInfo
from gpusizer.signals.pods import PodInfo
from gpusizer.signals.queries import (
    ENERGY_JOULES,
    HELD_COST,
    HELD_COST_PER_HOUR,
    HELD_GPU_SECONDS,
    HELD_GPUS,
    HELD_IDLE_JOULES,
    HELD_IDLE_WATTS,
    REQUESTS,
    TRACKED_SECONDS,
)
from gpusizer.signals.reader import HistoryCache, LedgerCache
from gpusizer.signals.usage import UsageHistory
from gpusizer.throughput import (
    Capacities,
    Measurement,
    ThroughputBook,
    capacities,
    fingerprint,
    measure,
)
from gpusizer.timefmt import iso, parse_time

KEPT_MEASUREMENTS = 16  # slices per workload, the newest (status.measuredThroughput's limit)
DEFAULT_MAX_GAP_SECONDS = 120.0


@dataclass(frozen=True)
class Measured:
    """What the measuring step found, for the status and the slice choice."""

    efficiency: Efficiency | None = None
    throughput: tuple[Measurement, ...] = ()  # the newest of each slice, for the status
    capacity: Capacities = field(default_factory=lambda: Capacities({}, "requests"))
    currency: str = "USD"
    time: float | None = None

    def status_fields(self) -> dict[str, Any]:
        """The WorkloadSizingStatus fields this step sets."""
        fields: dict[str, Any] = {
            "measured_throughput": [
                api.SliceThroughput(
                    slice=m.slice,
                    product=m.product,
                    fingerprint=m.fingerprint,
                    requests_per_second=_significant(m.requests_per_second),
                    output_tokens_per_second=_significant(m.output_tokens_per_second),
                    utilization=round(m.utilization, 1),
                    time=iso(m.time),
                )
                for m in self.throughput
            ]
        }
        found = self.efficiency
        if found is not None and self.time is not None:
            figures = rounded(found.figures)
            fields["efficiency"] = api.Efficiency(
                **figures.as_dict(),
                window_seconds=found.window_seconds,
                requests=_significant(found.requests),
                output_tokens=_significant(found.output_tokens),
                power_watts=None if found.watts is None else round(found.watts, 1),
                currency=self.currency,
                unknown="; ".join(found.unknown)[:1024] or None,
                time=iso(self.time),
            )
        return fields


def _significant(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else float(f"{value:.{digits}g}")


def measurements_from_status(status: Mapping[str, Any] | None) -> list[Measurement]:
    """The measurements a status keeps; an entry that does not parse is dropped, never
    guessed."""
    found = []
    for item in (status or {}).get("measuredThroughput") or []:
        try:
            record = api.SliceThroughput.model_validate(item)
        except ValueError:
            continue
        at = parse_time(record.time)
        if at is not None:
            found.append(
                Measurement(
                    slice=record.slice,
                    product=record.product,
                    fingerprint=record.fingerprint,
                    requests_per_second=record.requests_per_second,
                    output_tokens_per_second=record.output_tokens_per_second,
                    utilization=record.utilization,
                    time=at,
                )
            )
    return found


def pod_slice(catalog: Catalog, pod: PodInfo, nodes: Mapping[str, NodeInfo]) -> Slice | None:
    node = nodes.get(pod.node or "")
    if not pod.gpu_resource or node is None or not node.product_label:
        return None
    return catalog.slice_for(pod.gpu_resource, node.product_label)


def serving_pods(
    pods: Sequence[PodInfo],
    slices: Mapping[tuple[str, str], Slice | None],
    history: UsageHistory,
    max_age_seconds: float,
) -> list[ServingPod]:
    """The pods serving now that the window saw, each with the part of it they held their
    slice. One started since the window was read counts from the next read, and so does one
    that turned ready less than `max_age_seconds` (metrics.maxSampleAgeSeconds) before it
    without a request count yet: the next scrape shows it, so it is not a hole in the data
    (as `signals.join` counts such a pod)."""
    window = float(history.window_seconds)
    counted = history.signals.get(REQUESTS)

    def seen(p: PodInfo) -> bool:
        if p.created is not None and p.created >= history.time:
            return False
        fresh = p.ready_since is not None and history.time - p.ready_since < max_age_seconds
        return not (fresh and counted is not None and (p.namespace, p.name) not in counted.samples)

    return [
        ServingPod(
            key=(p.namespace, p.name),
            slice=slices.get((p.namespace, p.name)),
            units=max(1, p.gpu_count),
            seconds=window if p.created is None else min(window, history.time - p.created),
        )
        for p in pods
        if p.ready and not p.terminating and seen(p)
    ]


def measure_on_one_slice(
    history: UsageHistory,
    pods: Sequence[PodInfo],
    slices: Mapping[tuple[str, str], Slice | None],
    alike: str | None,
) -> Measurement | None:
    """The throughput the window shows, when every serving pod runs on one known slice."""
    serving = [p for p in pods if p.ready and not p.terminating]
    on = {slices.get((p.namespace, p.name)) for p in serving}
    if alike is None or len(on) != 1:
        return None
    (only,) = on
    return None if only is None else measure(history, serving, only, alike)


def newest(known: Sequence[Measurement], new: Measurement | None) -> tuple[Measurement, ...]:
    """The newest measurement of each slice, newest first, at most KEPT_MEASUREMENTS."""
    latest: dict[tuple[str, str], Measurement] = {}
    for m in [*known, *([new] if new else [])]:
        if m.key not in latest or latest[m.key].time < m.time:
            latest[m.key] = m
    ordered = sorted(latest.values(), key=lambda m: m.time, reverse=True)
    return tuple(ordered[:KEPT_MEASUREMENTS])


class Measurer:
    """The measuring step's collaborators: the catalog, the window's readings, the ledger and
    the measurements every workload reported."""

    def __init__(
        self,
        catalog: Catalog,
        history: HistoryCache,
        ledger: LedgerCache | None = None,
        max_gap_seconds: float = DEFAULT_MAX_GAP_SECONDS,
    ) -> None:
        self.catalog = catalog
        self._history = history
        self._ledger = ledger
        self._max_gap = max_gap_seconds

    async def measure(
        self,
        spec: WorkloadSizingSpec,
        key: tuple[str, str],
        target: TargetView,
        pods: Sequence[PodInfo],
        nodes: Mapping[str, NodeInfo],
        status: Mapping[str, Any],
        book: ThroughputBook,
        previous_turn: float | None,
        now: float,
    ) -> Measured:
        """`key`: the WorkloadSizing's namespace and name; `book`: what every workload
        measured, this one's added; `previous_turn`: when this process last decided it
        (None: not yet)."""
        history = await self._history.get(spec.right_sizing.history_seconds)
        slices = {(p.namespace, p.name): pod_slice(self.catalog, p, nodes) for p in pods}
        serving = serving_pods(pods, slices, history, spec.metrics.max_sample_age_seconds)
        found = efficiency(history, serving, self.catalog)
        alike = fingerprint(target.pod_spec, spec.container)
        known = [m for m in measurements_from_status(status) if m.fingerprint == alike]
        kept = newest(known, measure_on_one_slice(history, pods, slices, alike))
        book.learn(key, kept)
        draw = await self._history.draw()
        drawing = serving_pods(pods, slices, draw, spec.metrics.max_sample_age_seconds)
        watts = draw_watts(draw, drawing, self.catalog)
        self._account(key, pods, slices, watts, previous_turn, now)
        metrics.WORKLOADS.gauges(*key, _figure_gauges(found))
        await self._report_ledger(key)
        return Measured(
            efficiency=found,
            throughput=kept,
            capacity=capacities(book.measured(alike)),
            currency=self.catalog.data.currency,
            time=history.time,
        )

    def _account(
        self,
        key: tuple[str, str],
        pods: Sequence[PodInfo],
        slices: Mapping[tuple[str, str], Slice | None],
        watts: float | None,
        previous_turn: float | None,
        now: float,
    ) -> None:
        """What the pods held since the previous turn, into the ledger's counters; `watts`:
        their draw over the last right-sizing period (`HistoryCache.draw`)."""
        found = held(
            [(p, slices[(p.namespace, p.name)]) for p in pods],
            previous_turn,
            now,
            self._max_gap,
            watts,
        )
        metrics.WORKLOADS.gauges(
            *key,
            {
                HELD_GPUS: found.gpus,
                HELD_COST_PER_HOUR: found.cost_per_hour,
                HELD_IDLE_WATTS: found.idle_watts,
            },
        )
        metrics.WORKLOADS.account(
            *key,
            {
                TRACKED_SECONDS: found.seconds,
                HELD_GPU_SECONDS: found.gpu_seconds,
                HELD_COST: found.cost,
                HELD_IDLE_JOULES: found.idle_joules,
                ENERGY_JOULES: found.joules,
            },
        )

    async def _report_ledger(self, key: tuple[str, str]) -> None:
        if self._ledger is None:
            return
        rows = (await self._ledger.get()).get(key, [])
        metrics.WORKLOADS.ledger(*key, ledger_gauges(rows))


def _figure_gauges(found: Efficiency) -> dict[str, float | None]:
    figures = found.figures
    return {
        "gpusizer_cost_per_1k_requests": figures.cost_per_1k_requests,
        "gpusizer_cost_per_million_output_tokens": figures.cost_per_million_output_tokens,
        "gpusizer_kwh_per_1k_requests": figures.kwh_per_1k_requests,
        "gpusizer_kwh_per_million_output_tokens": figures.kwh_per_million_output_tokens,
        "gpusizer_output_tokens_per_second_per_cost_per_hour": (
            figures.output_tokens_per_second_per_cost_per_hour
        ),
        "gpusizer_power_watts": found.watts,
    }


def ledger_gauges(rows: Sequence[LedgerRow]) -> dict[tuple[str, str, str], float]:
    """A workload's ledger rows as the operator exports them."""
    out: dict[tuple[str, str, str], float] = {}
    for row in rows:
        if row.window not in WINDOWS:
            continue
        for family, used, static in (
            ("gpusizer_ledger_gpu_hours", row.gpu_hours_used, row.gpu_hours_static),
            ("gpusizer_ledger_cost", row.cost_used, row.cost_static),
            ("gpusizer_ledger_kwh", row.kwh_used, row.kwh_static),
        ):
            if used is not None:
                out[(family, row.window, "used")] = used
            if static is not None:
                out[(family, row.window, "static")] = static
    return out
