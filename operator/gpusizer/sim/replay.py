"""Replay one trace under several policies and score them against the offline optimum."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from gpusizer.api.v1alpha1 import WorkloadSizing, WorkloadSizingSpec
from gpusizer.sim import POLICIES
from gpusizer.sim.controllers import (
    GpusizerController,
    HpaConfig,
    HpaController,
    KedaConfig,
    KedaController,
    ScheduleController,
    StaticController,
    initial_replicas,
    opening_rate,
)
from gpusizer.sim.fleet import Controller, FleetParams, Run, simulate, tick_arrivals
from gpusizer.sim.optimal import optimal_schedule
from gpusizer.sim.trace import Trace

# The simulator's default WorkloadSizing: the API defaults plus the targets a user must choose.
# 85 % leaves 15 % headroom, enough for the smooth traces' growth over a 2 min start-up (see
# docs/simulate.md for the sweep); 100 replicas is KEDA's default maxReplicaCount. Requests
# that arrive at zero are held by the activator, with its default bounds.
DEFAULT_SPEC: dict[str, Any] = {
    "targetRef": {"name": "replayed"},
    "replicas": {"min": 0, "max": 100, "targetGPUUtilization": 85, "targetQueuePerReplica": 4},
    "scaleToZero": {"enabled": True, "activator": {"enabled": True}},
}
ACTIVATOR_REPLICAS = 2  # the chart's and deploy/'s; maxPendingRequests bounds each


def with_activator(params: FleetParams, spec: WorkloadSizingSpec) -> FleetParams:
    """The fleet with the spec's activator bounds, when it uses one (a wakeQuery's gateway is
    taken to hold without bound)."""
    activator = spec.scale_to_zero.activator
    if not activator.enabled:
        return params
    return replace(
        params,
        max_held=float(activator.max_pending_requests * ACTIVATOR_REPLICAS),
        hold_timeout_seconds=float(activator.hold_timeout_seconds),
    )


@dataclass(frozen=True)
class Baselines:
    """The baselines' settings: `hpa` and `keda` (its vLLM configuration) and `keda-queue` (the
    queue-only ScaledObject with KEDA's defaults, minReplicaCount 0)."""

    hpa: HpaConfig
    keda: KedaConfig
    keda_queue: KedaConfig


def default_baselines(spec: WorkloadSizingSpec) -> Baselines:
    """HPA on the spec's own targets (the comparison isolates the control logic) with the API's
    behaviour defaults; KEDA as the vLLM production-stack configures it; the queue-only
    ScaledObject at the spec's queue target with KEDA's defaults."""
    rules = spec.replicas
    hpa = HpaConfig(
        target_utilization=rules.target_gpu_utilization,
        target_queue=rules.target_queue_per_replica,
        target_kv_cache=(
            None if rules.target_kv_cache_usage is None else rules.target_kv_cache_usage / 100
        ),
        min_replicas=max(1, rules.minimum),
        max_replicas=rules.maximum,
    )
    keda = KedaConfig(max_replicas=rules.maximum)
    keda_queue = KedaConfig(
        queue_threshold=rules.target_queue_per_replica or 4.0,
        kv_cache_threshold=None,
        min_replicas=0,
        max_replicas=rules.maximum,
        polling_interval_seconds=30.0,
        cooldown_period_seconds=300.0,
    )
    return Baselines(hpa=hpa, keda=keda, keda_queue=keda_queue)


@dataclass(frozen=True)
class Result:
    name: str
    run: Run
    gpu_hours: float
    cost: float
    slo_attainment: float
    vs_optimal: float | None

    def as_json(self) -> dict[str, float | int | None]:
        return {
            "gpu_hours": round(self.gpu_hours, 4),
            "cost": round(self.cost, 2),
            "slo_attainment": round(self.slo_attainment, 5),
            "dropped": round(self.run.dropped),
            "scale_events": self.run.scale_events,
            "vs_optimal": None if self.vs_optimal is None else round(self.vs_optimal, 4),
        }


def load_spec(path: Path | None) -> WorkloadSizingSpec:
    """A WorkloadSizing YAML (the whole object or just its spec); the default without one."""
    if path is None:
        return WorkloadSizingSpec.model_validate(DEFAULT_SPEC)
    document = yaml.safe_load(path.read_text())
    if isinstance(document, dict) and "spec" in document:
        return WorkloadSizing.model_validate(document).spec
    return WorkloadSizingSpec.model_validate(document)


def capacity_for_peak(trace: Trace, peak_replicas: int) -> float:
    """Per-replica capacity (req/s) such that the trace's peak minute needs `peak_replicas`."""
    return trace.peak_rate() / peak_replicas


def default_tick(trace: Trace) -> float:
    """The bin width, up to 5 s: fine enough for a 15 s control loop and a 5 s SLO, coarse
    enough to replay two weeks in seconds."""
    return min(trace.bin_seconds, 5.0)


def static_replicas(trace: Trace, capacity_rps: float) -> int:
    """Enough replicas for the peak minute's mean rate, fully busy."""
    return max(1, math.ceil(trace.peak_rate() / capacity_rps - 1e-9))


def replay(
    trace: Trace,
    params: FleetParams,
    spec: WorkloadSizingSpec,
    policies: Sequence[str] = POLICIES,
    *,
    baselines: Baselines | None = None,
    price_per_gpu_hour: float = 3.0,
    quiet: bool = True,
    optimal_seconds: float | None = None,
) -> dict[str, Result]:
    """Run each policy over the trace; vs_optimal is relative to the optimum's GPU-seconds
    (computed here unless `optimal_seconds` gives them)."""
    baselines = baselines or default_baselines(spec)
    arrivals = tick_arrivals(trace, params.tick_seconds)
    rules = spec.replicas
    target_util = rules.target_gpu_utilization or 70.0
    start = initial_replicas(
        opening_rate(arrivals, params.tick_seconds, params.startup_seconds + 60.0),
        params.capacity_rps,
        target_util,
    )
    runs: dict[str, Run] = {}
    wanted = [*policies]
    if "optimal" not in wanted and optimal_seconds is None:
        wanted.append("optimal")  # always the yardstick
    for name in wanted:
        controller: Controller
        first = start
        if name == "gpusizer":
            controller = GpusizerController(spec)
        elif name == "hpa":
            controller = HpaController(baselines.hpa)
        elif name == "keda":
            controller = KedaController(baselines.keda)
        elif name == "keda-queue":
            controller = KedaController(baselines.keda_queue)
        elif name == "static":
            first = static_replicas(trace, params.capacity_rps)
            controller = StaticController(first)
        elif name == "optimal":
            schedule = optimal_schedule(arrivals, params)
            first = int(schedule[0])
            controller = ScheduleController(schedule, params.tick_seconds)
        else:
            raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}")
        runs[name] = simulate(
            arrivals, params, controller, first, label=f"{trace.name}: {name}", quiet=quiet
        )
    best = runs["optimal"].gpu_seconds if optimal_seconds is None else optimal_seconds
    results = {}
    for name in policies:
        run = runs[name]
        hours = run.gpu_seconds / 3600.0
        results[name] = Result(
            name=name,
            run=run,
            gpu_hours=hours,
            cost=hours * price_per_gpu_hour,
            slo_attainment=run.within_slo / run.arrived if run.arrived else 1.0,
            vs_optimal=run.gpu_seconds / best if best else None,
        )
    return results
