"""Decision quality: cost/SLO frontiers of gpusizer, HPA and KEDA over knob sweeps, per trace.

    python bench/decision_quality.py [--traces-dir ../shared/traces] [--jobs 2] [--json FILE]

Every trace (the shared ones and the generated ones of bench/traces.py) is replayed through
each policy at every point of its sweep (the knobs a competent user tunes: target, scale-down
window, idle time or cooldown), through static provisioning and through the offline optimum.
Per trace it prints each policy's frontier (the points no other point of the same policy
beats on both GPU-hours and attainment), gpusizer's default point, and the GPU-hours the best
tuned baseline (any HPA or KEDA point) needs to reach gpusizer's default attainment and 99 %,
read off the baselines' joint frontier by linear interpolation between its points (a baseline
is credited with any attainment between two of its tuned points at the interpolated cost).
Which traces tuned gpusizer's defaults and which are held out is printed with them
(bench/README.md says why).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

from gpusizer.api.v1alpha1 import WorkloadSizingSpec
from gpusizer.sim.controllers import configured
from gpusizer.sim.fleet import FleetParams, tick_arrivals
from gpusizer.sim.optimal import optimal_schedule
from gpusizer.sim.replay import (
    DEFAULT_SPEC,
    Baselines,
    capacity_for_peak,
    default_baselines,
    default_tick,
    replay,
)
from gpusizer.sim.trace import Trace, load_trace
from hostinfo import cpu_model
from traces import generated

REPO = Path(__file__).resolve().parents[1]
PEAK_REPLICAS = 8
STARTUP_SECONDS = 120.0
SLO_WAIT_SECONDS = 5.0
DROP_AFTER_SECONDS = 60.0
# The Mooncake trace's arrivals are quantised to about 3 s (traces/README.md): finer bins
# would replay a sawtooth that is not in the load.
BIN_SECONDS = {"mooncake-conversation": 3.0}
# A sparse trace's busiest minute is a handful of requests: one replica serves 1 req/s.
SPARSE_CAPACITY_RPS = 1.0
# Weeks of a request every few minutes: steps of one decision period (15 s) keep the sweep within
# the time budget; waits inside a step are still read off the arrival and service curves.
SPARSE_TICK_SECONDS = 15.0
HIGH_ATTAINMENT = 0.99

# Which traces chose gpusizer's defaults (the shared ones: target and window, before this sweep;
# sparse-sessions-a and short-bursts-4: the cold-start budget and pre-warm) and which are held out.
TUNING = {
    "azure-llm-2023-code",
    "azure-llm-2023-conv",
    "mooncake-conversation",
    "servegen-m-large-10min",
    "sparse-sessions-a",
    "short-bursts-4",
}
KIND = {
    "azure-llm-2023-code": "bursty",
    "azure-llm-2023-conv": "smooth",
    "mooncake-conversation": "smooth",
    "servegen-m-large-10min": "smooth",
    "reasoning-long": "bursty",
    "short-bursts-4": "bursty",
    "short-bursts-5": "bursty",
    "sparse-sessions-a": "sparse",
    "sparse-sessions-b": "sparse",
    "sparse-servegen": "sparse",
}


def spec_with(**replicas_and_zero: Any) -> WorkloadSizingSpec:
    """The simulator's default spec with some replicas.* and scaleToZero.* fields changed."""
    document = json.loads(json.dumps(DEFAULT_SPEC))
    for key, value in replicas_and_zero.items():
        section, _, name = key.partition(".")
        document[section][name] = value
    return WorkloadSizingSpec.model_validate(document)


def sweeps(sparse: bool) -> dict[str, list[tuple[str, str]]]:
    """Per policy: (label, settings) points. gpusizer's settings are spec fields; the
    baselines' are the --hpa/--keda/--keda-queue settings of `gpusizer simulate`."""
    gpusizer = [("default", "")]
    if sparse:
        # at most a replica or two of load: the targets and windows never come into play, and
        # HPA and KEDA (minReplicaCount 1) hold one replica whatever their settings
        for idle in (60, 300, 1800, 3600, 7200, 14400, 43200):
            gpusizer.append((f"idle {idle}s", f"scaleToZero.idleSeconds={idle}"))
        for budget in (1, 2, 5, 10, 20):
            gpusizer.append((f"budget {budget}%", f"scaleToZero.maxColdStartPercent={budget}"))
        gpusizer.append(("pre-warm", "scaleToZero.preWarm=true"))
        gpusizer.append(("budget 5%, pre-warm",
                         "scaleToZero.maxColdStartPercent=5;scaleToZero.preWarm=true"))  # fmt: skip
        return {
            "gpusizer": gpusizer,
            "hpa": [("default", "")],
            "keda": [("default", "")],
            "keda-queue": [
                (f"cooldown {c}s{', keepalive' if k else ''}",
                 f"cooldown-period-seconds={c},keepalive={'true' if k else 'false'}")
                for c in (60, 300, 900, 1800, 3600)
                for k in (False, True)
            ],
        }  # fmt: skip
    for target in (70, 85, 95):
        for window in (120, 300, 600):
            if (target, window) != (85, 120):
                gpusizer.append((f"target {target}, down {window}s",
                                 f"replicas.targetGPUUtilization={target};"
                                 f"replicas.scaleDown={window}"))  # fmt: skip
    hpa = [
        (f"util {u}{'' if q == 'none' else f', queue {q}'}, down {w}s",
         f"target-utilization={u},target-queue={q},scale-down-window-seconds={w}")
        for u in (70, 85, 95)
        for q in ("4", "none")
        for w in (120, 300, 600)
    ]  # fmt: skip
    keda = [
        (f"queue {q}, kv {kv}, down {w}s",
         f"queue-threshold={q},kv-cache-threshold={kv},scale-down-window-seconds={w}")
        for q in (2, 5, 10)
        for kv in ("0.7", "none")
        for w in (120, 300)
    ]  # fmt: skip
    keda_queue = [
        (f"cooldown {c}s{', keepalive' if k else ''}",
         f"cooldown-period-seconds={c},keepalive={'true' if k else 'false'}")
        for c in (60, 300, 900, 1800)
        for k in (False, True)
    ]  # fmt: skip
    return {"gpusizer": gpusizer, "hpa": hpa, "keda": keda, "keda-queue": keda_queue}


@dataclass(frozen=True)
class Case:
    trace: Trace
    params: FleetParams

    @property
    def sparse(self) -> bool:
        return KIND.get(self.trace.name) == "sparse"


@dataclass(frozen=True)
class Point:
    policy: str
    label: str
    gpu_hours: float
    attainment: float
    cold: float = 0.0  # share of requests that arrived with no replica ready


@dataclass
class TraceResult:
    case: Case
    optimal_hours: float = 0.0
    static: Point | None = None
    points: list[Point] = field(default_factory=list)


def cases(traces_dir: Path) -> list[Case]:
    shared = sorted([*traces_dir.glob("*.csv"), *traces_dir.glob("*.json")])
    traces = [load_trace(p) for p in shared]
    traces = [t.rebinned(BIN_SECONDS[t.name]) if t.name in BIN_SECONDS else t for t in traces]
    out = []
    for trace in [*traces, *generated(traces_dir)]:
        sparse = KIND.get(trace.name) == "sparse"
        capacity = SPARSE_CAPACITY_RPS if sparse else capacity_for_peak(trace, PEAK_REPLICAS)
        params = FleetParams(
            capacity_rps=capacity,
            startup_seconds=STARTUP_SECONDS,
            slo_wait_seconds=SLO_WAIT_SECONDS,
            drop_after_seconds=DROP_AFTER_SECONDS,
            tick_seconds=SPARSE_TICK_SECONDS if sparse else default_tick(trace),
        )
        out.append(Case(trace, params))
    return out


def run_point(case: Case, policy: str, label: str, settings: str) -> Point:
    spec = WorkloadSizingSpec.model_validate(DEFAULT_SPEC)
    baselines = default_baselines(spec)
    if policy == "gpusizer" and settings:
        fields: dict[str, Any] = {}
        for item in settings.split(";"):
            key, _, raw = item.partition("=")
            if key == "replicas.scaleDown":
                fields[key] = {"stabilizationWindowSeconds": int(raw), "maxReplicasPerStep": 2}
            elif raw in ("true", "false"):
                fields[key] = raw == "true"
            else:
                fields[key] = float(raw)
        spec = spec_with(**fields)
    elif policy != "gpusizer":
        baselines = Baselines(
            hpa=configured(baselines.hpa, settings if policy == "hpa" else ""),
            keda=configured(baselines.keda, settings if policy == "keda" else ""),
            keda_queue=configured(baselines.keda_queue, settings if policy == "keda-queue" else ""),
        )
    result = replay(case.trace, case.params, spec, [policy], baselines=baselines,
                    optimal_seconds=1.0)[policy]  # fmt: skip
    cold = result.run.cold / result.run.arrived if result.run.arrived else 0.0
    return Point(policy, label, result.gpu_hours, result.slo_attainment, cold)


def run_optimal(case: Case) -> float:
    arrivals = tick_arrivals(case.trace, case.params.tick_seconds)
    schedule = optimal_schedule(arrivals, case.params)
    return float(schedule.sum()) * case.params.tick_seconds / 3600.0


def _job(args: tuple[int, Case, str, str, str]) -> tuple[int, Point | float, float]:
    """(trace index, outcome, CPU seconds the replay took)."""
    index, case, policy, label, settings = args
    started = time.process_time()
    outcome = run_optimal(case) if policy == "optimal" else run_point(case, policy, label, settings)
    return index, outcome, time.process_time() - started


def frontier(points: Iterable[Point]) -> list[Point]:
    """Points no other point beats on both GPU-hours and attainment, cheapest first."""
    best: list[Point] = []
    for p in sorted(points, key=lambda p: (p.gpu_hours, -p.attainment)):
        if not best or p.attainment > best[-1].attainment + 1e-12:
            best.append(p)
    return best


def hours_needed(points: list[Point], attainment: float) -> float | None:
    """GPU-hours the frontier needs for `attainment` (interpolated); None beyond its reach."""
    front = frontier(points)
    for i, p in enumerate(front):
        if p.attainment >= attainment - 1e-12:
            if i == 0:
                return p.gpu_hours
            q = front[i - 1]
            share = (attainment - q.attainment) / (p.attainment - q.attainment)
            return q.gpu_hours + share * (p.gpu_hours - q.gpu_hours)
    return None


def report(result: TraceResult) -> tuple[str, dict[str, Any]]:
    case, trace = result.case, result.case.trace
    role = "tuning" if trace.name in TUNING else "held out"
    lines = [
        f"## {trace.name} ({KIND.get(trace.name, '?')}, {role}): {trace.total:,.0f} requests over "
        f"{trace.duration / 3600:.1f} h, capacity {case.params.capacity_rps:.3f} req/s per "
        f"replica; optimum {result.optimal_hours:.2f} GPU-hours"
    ]
    summary: dict[str, Any] = {"kind": KIND.get(trace.name), "role": role,
                               "optimal_gpu_hours": result.optimal_hours}  # fmt: skip
    for policy in ("gpusizer", "hpa", "keda", "keda-queue"):
        front = frontier(p for p in result.points if p.policy == policy)
        cells = ", ".join(f"{p.gpu_hours:.2f} h {100 * p.attainment:.2f}% ({p.label})"
                          for p in front)  # fmt: skip
        lines.append(f"  {policy:<10} frontier: {cells}")
        summary[policy] = [[p.label, round(p.gpu_hours, 3), round(p.attainment, 5)] for p in front]
    if result.static is not None:
        s = result.static
        lines.append(f"  static     {s.gpu_hours:.2f} h {100 * s.attainment:.2f}%")
    default = next(p for p in result.points if p.policy == "gpusizer" and p.label == "default")
    baselines = [p for p in result.points if p.policy in ("hpa", "keda", "keda-queue")]
    at_default = hours_needed(baselines, default.attainment)
    at_high = hours_needed(baselines, HIGH_ATTAINMENT)
    ours_high = hours_needed([p for p in result.points if p.policy == "gpusizer"],
                             HIGH_ATTAINMENT)  # fmt: skip
    saving = None if at_default is None else 100 * (1 - default.gpu_hours / at_default)
    lines.append(
        f"  gpusizer default: {default.gpu_hours:.2f} h at {100 * default.attainment:.2f}%"
    )
    lines.append(
        "  best-tuned HPA/KEDA at that attainment: "
        + ("not reached" if at_default is None else f"{at_default:.2f} h")
        + f"; at 99%: {'not reached' if at_high is None else f'{at_high:.2f} h'}"
        + " (gpusizer's frontier at 99%: "
        + f"{'not reached' if ours_high is None else f'{ours_high:.2f} h'})"
    )
    if saving is not None:
        lines.append(
            f"  at equal attainment, gpusizer uses {saving:.1f} % fewer GPU-hours than the "
            "best-tuned HPA and KEDA"
        )
    else:
        lines.append("  no HPA or KEDA setting reaches gpusizer's default attainment")
    if case.sparse:
        text, budgets = budget_report(result)
        lines.append(text)
        summary["budgets"] = budgets
    summary.update(
        default=[round(default.gpu_hours, 3), round(default.attainment, 5)],
        baseline_hours_at_default=at_default,
        baseline_hours_at_99=at_high,
        gpusizer_hours_at_99=ours_high,
        saving_percent=saving,
    )
    return "\n".join(lines), summary


def budget_report(result: TraceResult) -> tuple[str, list[list[float | None]]]:
    """Each cold-start budget against the fixed idle times: the share of requests that met a
    cold start, and the GPU-hours over those of the fixed idleSeconds reaching the same share
    (interpolated between the two fixed settings around it)."""
    fixed = sorted(
        ((p.cold, p.gpu_hours) for p in result.points if p.policy == "gpusizer"
         and (p.label.startswith("idle ") or p.label == "default")),
        reverse=True,
    )  # fmt: skip
    lines, rows = (
        ["  cold-start budget: budget -> share met a cold start, GPU-hours vs fixed idle"],
        [],
    )
    for p in result.points:
        if p.policy != "gpusizer" or not p.label.startswith("budget") or "pre-warm" in p.label:
            continue
        budget = float(p.label.split()[1].rstrip("%"))
        ratio = None
        for (c1, h1), (c2, h2) in pairwise(fixed):
            if c2 <= p.cold <= c1 and c1 > c2:
                ratio = p.gpu_hours / (h1 + (c1 - p.cold) / (c1 - c2) * (h2 - h1))
        shown = "beyond the fixed settings" if ratio is None else f"{ratio:.2f}x"
        lines.append(f"    {budget:g}% -> {100 * p.cold:.2f}% at {p.gpu_hours:.2f} h: {shown}")
        rows.append([budget, round(100 * p.cold, 3), round(p.gpu_hours, 3), ratio])
    return "\n".join(lines), rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--traces-dir", type=Path, default=REPO.parent / "shared" / "traces")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--json", type=Path, help="write the frontiers and savings as JSON")
    parser.add_argument("--only", default="", help="comma-separated trace names")
    args = parser.parse_args()
    if not args.traces_dir.is_dir():
        print(f"no traces directory {args.traces_dir}", file=sys.stderr)
        return 1
    started = time.perf_counter()
    print(f"machine: {cpu_model()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print(
        f"parameters: start-up {STARTUP_SECONDS:g} s, SLO wait {SLO_WAIT_SECONDS:g} s, drop "
        f"after {DROP_AFTER_SECONDS:g} s; capacity: the busiest minute needs {PEAK_REPLICAS} "
        f"replicas (sparse traces: {SPARSE_CAPACITY_RPS:g} req/s per replica)\n"
    )
    only = {n for n in args.only.split(",") if n}
    all_cases = [c for c in cases(args.traces_dir) if not only or c.trace.name in only]
    results = [TraceResult(c) for c in all_cases]
    jobs: list[tuple[int, Case, str, str, str]] = []
    for i, case in enumerate(all_cases):
        jobs.append((i, case, "optimal", "", ""))
        jobs.append((i, case, "static", "static", ""))
        for policy, points in sweeps(case.sparse).items():
            jobs.extend((i, case, policy, label, settings) for label, settings in points)
    jobs.sort(key=lambda j: -j[1].trace.duration)  # the longest first: the pool ends evenly
    cpu = time.process_time()
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for index, outcome, seconds in pool.map(_job, jobs, chunksize=1):
            cpu += seconds
            if isinstance(outcome, float):
                results[index].optimal_hours = outcome
            elif outcome.policy == "static":
                results[index].static = outcome
            else:
                results[index].points.append(outcome)
    summaries = {}
    for result in results:
        text, summary = report(result)
        summaries[result.case.trace.name] = summary
        print(text + "\n")
    wall = time.perf_counter() - started
    # the CPU time (the replays' and this process's) over the cores is what the wall time would
    # be on free cores, whatever else shares the machine
    print(f"{len(jobs)} replays; wall time: {wall:.1f} s; CPU time: {cpu:.1f} s")
    if args.json:
        document = {"wall_seconds": wall, "cpu_seconds": cpu, "traces": summaries}
        args.json.write_text(json.dumps(document, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
