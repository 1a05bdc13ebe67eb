"""The demo: gpusizer on the local GPU cluster, through a burst, a quiet spell and new demand.

`make demo` runs this. It starts the cluster if needed (state in .cluster/), installs the CRD
and RBAC from deploy/, runs the operator under the ServiceAccount those manifests bind, creates
two inference Deployments with WorkloadSizings, drives their load through the emulator, and
ends with what the operator did and what it saved against static peak provisioning.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from gpusizer.vocabulary import EventReason

from e2e.tests.conftest import REPO, Cluster
from e2e.tests.operator_support import (
    Operator,
    Workloads,
    install_manifests,
    recommend,
)

STATE = REPO / ".cluster"
NAMESPACE = "demo"
PRICE_PER_GPU_HOUR = 3.00  # H100-80GB, from the catalog's default price table


@dataclass
class Ledger:
    """Replica-seconds each workload held, sampled as the story runs."""

    last: float = field(default_factory=time.time)
    gpu_seconds: dict[str, float] = field(default_factory=dict)
    peak: dict[str, int] = field(default_factory=dict)

    def add(self, replicas: dict[str, int]) -> None:
        now = time.time()
        for name, n in replicas.items():
            self.gpu_seconds[name] = self.gpu_seconds.get(name, 0.0) + n * (now - self.last)
            self.peak[name] = max(self.peak.get(name, 0), n)
        self.last = now


def start_cluster() -> Cluster:
    print("== starting the local GPU cluster (first run builds the control plane: 15-25 min)")
    subprocess.run([str(REPO / "e2e" / "scripts" / "cluster-up.sh")], check=True)
    return Cluster.from_state_dir(STATE)


def workload_specs(namespace: str) -> dict[str, dict[str, object]]:
    wake_query = f'sum(gateway_pending_requests{{namespace="{namespace}",service="code"}})'
    scale_down = {"stabilizationWindowSeconds": 45, "maxReplicasPerStep": 4, "periodSeconds": 15}
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
            "rightSizing": {"mode": "Off"},
        },
        "code": {
            "targetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "code"},
            "replicas": {"min": 0, "max": 4, "targetGPUUtilization": 70, "scaleDown": scale_down},
            "scaleToZero": {
                "enabled": True,
                "idleSeconds": 30,
                "wakeQuery": wake_query,
            },
            "rightSizing": {"mode": "Off"},
        },
    }


def show(workloads: Workloads, ledger: Ledger, phase: str, started: float) -> None:
    replicas = {}
    cells = []
    for name in ("chat", "code"):
        n = workloads.replicas(name)
        replicas[name] = n
        obs = workloads.status(name).get("observation") or {}
        util = obs.get("gpuUtilization")
        util_text = "  -  " if util is None else f"{util:5.1f}"
        cells.append(f"{name}: {n} replicas ({workloads.ready(name)} ready) GPU {util_text}%")
    ledger.add(replicas)
    print(f"[{time.time() - started:5.0f}s] {phase:<28} " + " | ".join(cells), flush=True)


def run_phase(
    workloads: Workloads, ledger: Ledger, phase: str, seconds: float, started: float
) -> None:
    end = time.time() + seconds
    while time.time() < end:
        show(workloads, ledger, phase, started)
        time.sleep(5)  # a display refresh, not a readiness wait


def main() -> int:
    cluster = start_cluster()
    install_manifests(cluster)
    workdir = Path(tempfile.mkdtemp(prefix="gpusizer-demo-"))
    operator = Operator(cluster, workdir, sync_period=5.0, scrape=True)
    print(f"== starting the operator as ServiceAccount gpusizer-system/gpusizer (log {workdir})")
    operator.start()
    cluster.kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=true")
    workloads = Workloads(cluster, NAMESPACE)
    for name in ("chat", "code"):
        workloads.deployment(name, replicas=1, capacity_rps=10, startup_seconds=10)
        workloads.load(name, 2)
    for name, spec in workload_specs(NAMESPACE).items():
        result = workloads.sizing(name, spec)
        if result.returncode != 0:
            print(result.stderr, file=sys.stderr)
            return 1
    started = time.time()
    ledger = Ledger()
    try:
        print("== 1. a burst: chat gets 40 req/s, code 12 req/s (10 req/s per H100 replica)")
        workloads.load("chat", 40)
        workloads.load("code", 12)
        run_phase(workloads, ledger, "burst", 75, started)
        print("== 2. quiet: chat drops to 6 req/s, nobody uses code")
        workloads.load("chat", 6)
        workloads.load("code", 0)
        run_phase(workloads, ledger, "quiet", 100, started)
        print("== 3. new demand for code: the gateway holds requests, the wake query sees them")
        workloads.load("code", 8)
        run_phase(workloads, ledger, "wake", 45, started)
    finally:
        operator.stop()
    elapsed = time.time() - started
    print("\n== what the operator did")
    for name in ("chat", "code"):
        ours = {r.value for r in EventReason}
        reasons = [r for r in workloads.event_reasons(name) if r in ours]
        counts = {r: reasons.count(r) for r in sorted(set(reasons))}
        print(f"  {name}: events {counts}")
    print("\n== GPU time over the story, against static provisioning for the peak")
    total_used = total_static = 0.0
    for name, used in ledger.gpu_seconds.items():
        static = ledger.peak[name] * elapsed
        total_used += used
        total_static += static
        print(
            f"  {name}: {used / 3600:.3f} GPU-h used vs {static / 3600:.3f} GPU-h static "
            f"(peak {ledger.peak[name]} replicas)"
        )
    saved = 1 - total_used / total_static if total_static else 0.0
    print(
        f"  total: ${total_used / 3600 * PRICE_PER_GPU_HOUR:.2f} vs "
        f"${total_static / 3600 * PRICE_PER_GPU_HOUR:.2f} at ${PRICE_PER_GPU_HOUR:.2f}/GPU-h: "
        f"{saved:.0%} saved"
    )
    print("\n== right-sizing: what each GPU workload should run on (gpusizer recommend)")
    report = recommend(cluster, 300, check=False)
    print(report.stdout or report.stderr)
    print(
        f"\nThe cluster is still running: `source {STATE}/env`; stop it with `make cluster-down`."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
