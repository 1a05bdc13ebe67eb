"""The demo: gpusizer on the local GPU cluster, through a burst, a quiet spell and new demand.

`make demo` runs this. It starts the cluster if needed (state in .cluster/), installs the CRD
and RBAC from deploy/, runs the operator under the ServiceAccount those manifests bind, creates
two inference Deployments with WorkloadSizings, drives their load through the emulator, and
ends with what the operator did, what a result cost before and after right-sizing moved a
workload, and the savings ledger checked against the emulator's own GPU-hour accounting.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpusizer.signals.queries import HELD_GPU_SECONDS
from gpusizer.vocabulary import EventReason

from e2e.tests.conftest import REPO, Cluster, wait_until
from e2e.tests.operator_support import (
    Operator,
    Workloads,
    install_manifests,
    recommend,
)

STATE = REPO / ".cluster"
NAMESPACE = "demo"
NAMES = ("chat", "code", "embed")
LEDGER_TOLERANCE = 0.02  # the ledger must agree with the emulator's GPU-hours this closely


@dataclass
class PerResult:
    """Each workload's measured cost per result on its first slice, the last seen."""

    before: dict[str, dict[str, Any]] = field(default_factory=dict)
    first_slice: dict[str, str] = field(default_factory=dict)

    def note(self, name: str, slice_: str, status: dict[str, Any]) -> None:
        self.first_slice.setdefault(name, slice_)
        found = status.get("efficiency") or {}
        if slice_ == self.first_slice[name] and found.get("costPer1kRequests") is not None:
            self.before[name] = {**found, "slice": slice_}


def start_cluster() -> Cluster:
    print("== starting the local GPU cluster (first run builds the control plane: 15-25 min)")
    subprocess.run([str(REPO / "e2e" / "scripts" / "cluster-up.sh")], check=True)
    return Cluster.from_state_dir(STATE)


def workload_specs(namespace: str) -> dict[str, dict[str, Any]]:
    wake_query = f'sum(gateway_pending_requests{{namespace="{namespace}",service="code"}})'
    scale_down = {"stabilizationWindowSeconds": 45, "maxReplicasPerStep": 4, "periodSeconds": 15}
    right_sizing = {"historySeconds": 60, "minSavingsPercent": 15}
    return {
        "chat": {
            "targetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "chat"},
            "replicas": {
                "min": 1,
                "max": 8,
                "targetGPUUtilization": 70,
                "targetQueuePerReplica": 4,
                "scaleDown": scale_down,
            },
            "rightSizing": {"mode": "Recommend", **right_sizing},
        },
        "code": {
            "targetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "code"},
            "replicas": {"min": 0, "max": 4, "targetGPUUtilization": 70, "scaleDown": scale_down},
            "scaleToZero": {
                "enabled": True,
                "idleSeconds": 30,
                "wakeQuery": wake_query,
            },
            "rightSizing": {"mode": "Recommend", **right_sizing},
        },
        "embed": {
            "targetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "embed"},
            "replicas": {"min": 1, "max": 4, "targetGPUUtilization": 70, "scaleDown": scale_down},
            "rightSizing": {"mode": "Recommend", **right_sizing},
        },
    }


def slice_of(workloads: Workloads, name: str) -> str:
    limits = workloads.template(name)["spec"]["template"]["spec"]["containers"][0]["resources"]
    resource = next(iter(limits["limits"]))
    return "gpu-h100" if resource == "nvidia.com/gpu" else resource.replace("nvidia.com/", "")


def show(workloads: Workloads, seen: PerResult, phase: str, started: float) -> None:
    cells = []
    for name in NAMES:
        status = workloads.status(name)
        seen.note(name, slice_of(workloads, name), status)
        util = (status.get("observation") or {}).get("gpuUtilization")
        util_text = "  -  " if util is None else f"{util:5.1f}"
        cost = (status.get("efficiency") or {}).get("costPer1kRequests")
        cells.append(
            f"{name}: {workloads.replicas(name)} x {slice_of(workloads, name)} "
            f"({workloads.ready(name)} ready) GPU {util_text}% "
            f"${'-' if cost is None else f'{cost:.3f}'}/1k req"
        )
    print(f"[{time.time() - started:5.0f}s] {phase:<10} " + " | ".join(cells), flush=True)


def run_phase(
    workloads: Workloads, seen: PerResult, phase: str, seconds: float, started: float
) -> None:
    end = time.time() + seconds
    while time.time() < end:
        show(workloads, seen, phase, started)
        time.sleep(5)  # a display refresh, not a readiness wait


def gpu_seconds(workloads: Workloads) -> dict[str, float]:
    """The emulator's own count of what each workload's pods held (a slice as its share)."""
    return {name: workloads.emulated(name)["accounting"]["gpuSeconds"] for name in NAMES}


def at_next_scrape(cluster: Cluster, workloads: Workloads) -> dict[str, float]:
    """The emulator's count once Prometheus has scraped the operator's counters again: the
    ledger ends at their last sample, and a workload that holds three GPUs at the end of the
    story would read a few GPU-seconds short against a count taken up to two seconds later."""
    query = f'max by (name) (timestamp({HELD_GPU_SECONDS}_total{{namespace="{NAMESPACE}"}}))'

    def sampled() -> float:
        return min((float(s["value"][1]) for s in cluster.promql(query)), default=0.0)

    ended = time.time()
    wait_until(lambda: sampled() > ended, 30, interval=0.1, what="a scrape of the operator")
    return gpu_seconds(workloads)


def figures(found: dict[str, Any]) -> str:
    def shown(key: str, fmt: str) -> str:
        value = found.get(key)
        return "-" if value is None else format(value, fmt)

    return (
        f"${shown('costPer1kRequests', '.4f')} and {shown('kWhPer1kRequests', '.5f')} kWh "
        f"per 1,000 requests, ${shown('costPerMillionOutputTokens', '.3f')} per million output "
        "tokens"
    )


def print_per_result(workloads: Workloads, seen: PerResult) -> None:
    print("\n== what 1,000 requests cost, before and after the recommendation")
    for name in NAMES:
        status = workloads.status(name)
        before = seen.before.get(name)
        now = status.get("efficiency") or {}
        recommendation = status.get("recommendation") or {}
        first = seen.first_slice.get(name, "?")
        print(f"  {name}:")
        if before is not None:
            print(f"    before, on {first} (measured):   {figures(before)}")
        current = slice_of(workloads, name)
        if current != first:
            print(f"    after, on {current} (measured): {figures(now)}")
        elif recommendation.get("slice") in (None, current):
            print(f"    no move recommended: {recommendation.get('reason', '-')}")
        elif recommendation.get("after"):
            basis = (recommendation.get("throughput") or "estimated").lower()
            print(
                f"    after moving to {recommendation['replicas']} x {recommendation['slice']} "
                f"(estimated, throughput {basis}): {figures(recommendation['after'])}"
            )
        else:
            unknown = now.get("unknown") or "its window is not measured yet"
            print(
                f"    recommended: {recommendation['replicas']} x {recommendation['slice']}; no "
                f"estimate of the cost per result there: {unknown}"
            )


def ledger(cluster: Cluster) -> dict[str, dict[str, Any]]:
    """The demo's workloads' 24 h rows of `gpusizer recommend --ledger`, and the fleet's ("")."""
    result = recommend(cluster, 300, "--ledger", "--format", "json", check=False, timeout=120)
    try:
        rows = json.loads(result.stdout)["ledger"]
    except (ValueError, KeyError):
        print(result.stdout or result.stderr)
        return {}
    ours = {("", "")} | {(NAMESPACE, n) for n in NAMES}
    return {
        r["name"]: r for r in rows if r["window"] == "24h" and (r["namespace"], r["name"]) in ours
    }


def check_ledger(
    cluster: Cluster, used: dict[str, float], earlier: dict[str, dict[str, Any]]
) -> bool:
    """The operator's ledger against the emulator's GPU-hours over the story: what the ledger
    grew by since `earlier` (a cluster used again keeps the last 24 h of an earlier demo)."""
    print("\n== the savings ledger (gpusizer recommend --ledger), against the emulator's count")
    rows = ledger(cluster)
    agree = True
    for name in NAMES:
        row = rows.get(name)
        if row is None or not row["gpu_hours_used"]:
            print(f"  {name}: no ledger row")
            agree = False
            continue
        before = (earlier.get(name) or {}).get("gpu_hours_used") or 0.0
        ledger_hours, counted = row["gpu_hours_used"] - before, used[name] / 3600
        off = ledger_hours / counted - 1 if counted else float("inf")
        agree &= abs(off) <= LEDGER_TOLERANCE
        print(
            f"  {name}: {ledger_hours:.4f} GPU-h used over the story ({counted:.4f} by the "
            f"emulator's count: {off:+.1%}); over 24 h {row['gpu_hours_used']:.4f} GPU-h, "
            f"${row['cost_used']:.3f}, {row['kwh_used'] or 0:.4f} kWh used against "
            f"{row['gpu_hours_static']:.4f} GPU-h, ${row['cost_static']:.3f}, "
            f"{row['kwh_static'] or 0:.4f} kWh static for its peak"
        )
    fleet = rows.get("")
    if fleet and fleet["cost_static"]:
        saved = 1 - fleet["cost_used"] / fleet["cost_static"]
        print(
            f"  fleet (every workload followed in 24 h): {fleet['gpu_hours_used']:.4f} GPU-h and "
            f"${fleet['cost_used']:.3f} used, against {fleet['gpu_hours_static']:.4f} GPU-h and "
            f"${fleet['cost_static']:.3f} static: {saved:.0%} saved"
        )
    print(
        f"  the ledger {'agrees' if agree else 'does NOT agree'} with the emulator's count "
        f"within {LEDGER_TOLERANCE:.0%}"
    )
    return agree


def main() -> int:
    cluster = start_cluster()
    install_manifests(cluster)
    workdir = Path(tempfile.mkdtemp(prefix="gpusizer-demo-"))
    # decisions every second: the ledger counts what the pods hold at each decision, so a pod
    # that leaves between two (a rollout's, not the operator's own scale-down) goes uncounted
    # for up to one period (`ledger.held`); the story is short enough for that to show
    operator = Operator(
        cluster,
        workdir,
        sync_period=1.0,
        scrape=True,
        scrape_interval="2s",
        extra_args=["--rightsizing-period", "10"],
    )
    print(f"== starting the operator as ServiceAccount gpusizer-system/gpusizer (log {workdir})")
    operator.start()
    workloads = Workloads(cluster, NAMESPACE)
    for name in NAMES:
        workloads.deployment(
            name, replicas=2 if name == "embed" else 1, capacity_rps=10, startup_seconds=10
        )
        workloads.load(name, 1.5 if name == "embed" else 2)
    earlier = ledger(cluster)  # before the operator follows them: an earlier demo's 24 h
    specs = workload_specs(NAMESPACE)
    for name, spec in specs.items():
        result = workloads.sizing(name, spec)
        if result.returncode != 0:
            print(result.stderr, file=sys.stderr)
            return 1
    # the ledger counts from the operator's first turn on each workload: so does the demo
    wait_until(
        lambda: all(workloads.status(n).get("observedGeneration") for n in NAMES),
        60,
        what="the operator's first turn on every workload",
    )
    counted_from = gpu_seconds(workloads)
    started = time.time()
    seen = PerResult()
    try:
        print(
            "== 1. a burst: chat gets 40 req/s, code 12 req/s (10 req/s per H100 replica); "
            "embed serves 1.5 req/s on two H100s"
        )
        workloads.load("chat", 40)
        workloads.load("code", 12)
        run_phase(workloads, seen, "burst", 75, started)
        print(
            "== 2. quiet: chat drops to 1.5 req/s, nobody uses code; embed (1.5 req/s all "
            "along) gets rightSizing.mode Auto and moves to the slice its measurements call for"
        )
        workloads.load("chat", 1.5)
        workloads.load("code", 0)
        auto = specs["embed"]
        auto["rightSizing"] = {**auto["rightSizing"], "mode": "Auto"}
        workloads.sizing("embed", auto)
        run_phase(workloads, seen, "quiet", 200, started)
        print("== 3. new demand for code: the gateway holds requests, the wake query sees them")
        workloads.load("code", 8)
        run_phase(workloads, seen, "wake", 45, started)
        counted_to = at_next_scrape(cluster, workloads)
    finally:
        operator.stop()
    print("\n== what the operator did")
    for name in NAMES:
        ours = {r.value for r in EventReason}
        reasons = [r for r in workloads.event_reasons(name) if r in ours]
        counts = {r: reasons.count(r) for r in sorted(set(reasons))}
        print(f"  {name}: events {counts}")
    used = {name: counted_to[name] - counted_from[name] for name in NAMES}
    agrees = check_ledger(cluster, used, earlier)
    print("\n== right-sizing: what each GPU workload should run on (gpusizer recommend)")
    report = recommend(cluster, 300, check=False)
    print(report.stdout or report.stderr)
    print_per_result(workloads, seen)
    print(
        f"\nThe cluster is still running: `source {STATE}/env`; stop it with `make cluster-down`."
    )
    return 0 if agrees else 1


if __name__ == "__main__":
    sys.exit(main())
