"""The soak: `python -m e2e.soak --minutes N --seed S --out FILE` (`make soak`).

On the local cluster (its own, from e2e/soak/nodepools.yaml), 200 WorkloadSizings under load
replayed from the shared traces (time-compressed, each workload shifted into its trace, in a
loop), some scaling to zero, some right-sized in Auto, some in Recommend, paused or owned by an
HPA; two operator replicas under one kopf peering, reading Prometheus through a proxy that can
misbehave; a fault every `--fault-every` seconds after a warm-up (faults.py), drawn from a
seeded generator whose seed is printed, or none with `--fault-every 0`: a quiet run, which
measures the operator's growth without the scatter that faults add (report.growth).
Every write the operator makes is read from the API server's audit log and judged by
checker.py against what was true then; report.py turns the samples into the report, written
to `--out` as JSON. Exit status 1 when a check fails.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
from kubernetes import client as k8s

from e2e.gpusim.traces import Trace, TraceRate, load_trace
from e2e.soak import report
from e2e.soak.audit import AuditLog
from e2e.soak.checker import Checker, Rules
from e2e.soak.faults import Schedule, Stage, describe, kill_leftovers
from e2e.tests.conftest import REPO, Cluster, KubectlFailed, run_script, wait_until
from e2e.tests.fault_support import PrometheusProxy, lease_args, peering
from e2e.tests.operator_support import (
    Operator,
    deployment_manifest,
    install_manifests,
)

NAMESPACE = "soak"
PEERING = "gpusizer-soak"
SYNC_SECONDS = 5.0
CAPACITY_RPS = 10.0  # one replica on a whole H100, the emulator's default
DEMAND_WINDOW = 30.0  # the demand a scale-up is owed for: the mean over this long
MIG_SLICES = ["gpu-h100", "mig-1g.10gb", "mig-2g.20gb", "mig-3g.40gb"]
# one in ten of each: what the operator must act on, and what it must leave alone
KINDS = ("auto", "auto", "auto", "auto", "auto", "zero", "reshape", "recommend", "paused", "hpa")
QUIET_SLOT_SECONDS = 30.0  # a quiet run's Events and status patches are counted in slots this long
SETTLE_SECONDS = 60.0  # after the last fault: wrong actions coming late
# and until every fault has recovered, at most this long: the operator knows metrics again 1-4
# minutes after Prometheus was killed (bench/README.md, "Soak"), and a run that ended a minute
# after its last fault judged such a fault unrecovered (seed 33, 2026-11-26)
SETTLE_MAX_SECONDS = 600.0
# what the operator watches (its audited lists: e2e/cluster/audit.go), each listed again after a
# restart of the API server whose versions expired
WATCHED = {"pods", "nodes", "deployments", "statefulsets", "workloadsizings"}
OUTAGE_GRACE_SECONDS = 20 * SYNC_SECONDS  # gpusizer.settings.outage_grace_seconds


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# --- the workloads --------------------------------------------------------------------------


@dataclass(frozen=True)
class Planned:
    name: str
    kind: str
    rules: Rules
    trace: Path
    speedup: float
    scale: float
    offset: float


def peak_rate(trace: Trace, speedup: float) -> float:
    """The busiest minute of wall time's mean rate, replayed `speedup` times faster."""
    rate = TraceRate(trace, 0.0, speedup)
    span = trace.duration / speedup
    return max(rate.arrivals(t, t + 60) / 60 for t in range(0, int(max(1, span - 60)), 5))


def plan(count: int, traces: list[Path], rng: random.Random) -> list[Planned]:
    """Kinds in turn, traces in turn; each workload's peak needs 2 to 5 replicas at the
    target, and starts at a random point of its trace."""
    loaded = {p: load_trace(p) for p in traces}
    # 1-s traces of an hour, 4x: a pass every 15 minutes; the 14-day one to the same 15 minutes
    speedups = {p: max(4.0, t.duration / 900) for p, t in loaded.items()}
    peaks = {p: peak_rate(loaded[p], speedups[p]) for p in traces}
    planned = []
    for i in range(count):
        kind = KINDS[i % len(KINDS)]
        path = traces[(i // len(KINDS)) % len(traces)]
        peak = rng.uniform(0.7, 2.5) * CAPACITY_RPS * 0.7 * 2  # 2 to 5 replicas at 70 %
        rules = Rules(
            name=f"w{i:03d}",
            minimum=0 if kind == "zero" else 1,
            maximum=6,
            scale_to_zero=kind == "zero",
            hands_off={
                "recommend": "in Recommend",
                "paused": "paused",
                "hpa": "owned by an HPA",
            }.get(kind, ""),
        )
        planned.append(
            Planned(
                rules.name,
                kind,
                rules,
                path,
                speedups[path],
                peak / peaks[path],
                rng.uniform(0, loaded[path].duration),
            )
        )
    return planned


def deployment(w: Planned) -> dict[str, Any]:
    dep = deployment_manifest(
        w.name,
        NAMESPACE,
        replicas=1,
        capacity_rps=CAPACITY_RPS,
        memory_mib=12288 if w.kind == "reshape" else 16000,
        startup_seconds=10,
        labels={"gpusizer.io/soak": w.kind},
    )
    if w.kind == "paused" and int(w.name[1:]) % 20 >= 10:
        dep["metadata"]["annotations"]["gpusizer.io/paused"] = "true"  # on the target
    return dep


def sizing(w: Planned) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "targetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": w.name},
        "mode": "Recommend" if w.kind == "recommend" else "Auto",
        "replicas": {
            "min": w.rules.minimum,
            "max": w.rules.maximum,
            "targetGPUUtilization": w.rules.target_utilization,
            "targetQueuePerReplica": 4,
            "tolerance": w.rules.tolerance,
            "scaleUp": {
                "stabilizationWindowSeconds": 0,
                "maxReplicasPerStep": 4,
                "periodSeconds": 15,
            },
            "scaleDown": {
                "stabilizationWindowSeconds": 60,
                "maxReplicasPerStep": 2,
                "periodSeconds": 15,
            },
        },
        "metrics": {"server": "vllm", "maxSampleAgeSeconds": 30},
        "rightSizing": {"mode": "Off"},
    }
    if w.kind == "zero":
        wake = f'sum(gateway_pending_requests{{namespace="{NAMESPACE}",service="{w.name}"}})'
        spec["scaleToZero"] = {"enabled": True, "idleSeconds": 60, "wakeQuery": wake}
    if w.kind == "reshape":
        spec["rightSizing"] = {
            "mode": "Auto",
            "allowedSlices": MIG_SLICES,
            "historySeconds": 120,
            "minSavingsPercent": 15,
        }
    metadata: dict[str, Any] = {"name": w.name, "namespace": NAMESPACE}
    if w.kind == "paused" and int(w.name[1:]) % 20 < 10:
        metadata["annotations"] = {"gpusizer.io/paused": "true"}  # on the WorkloadSizing
    return {
        "apiVersion": "gpusizer.io/v1alpha1",
        "kind": "WorkloadSizing",
        "metadata": metadata,
        "spec": spec,
    }


def hpa(w: Planned) -> dict[str, Any]:
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": w.name, "namespace": NAMESPACE},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": w.name},
            "minReplicas": 1,
            "maxReplicas": 6,
            "metrics": [
                {
                    "type": "Resource",
                    "resource": {
                        "name": "cpu",
                        "target": {"type": "Utilization", "averageUtilization": 80},
                    },
                }
            ],
        },
    }


def apply_all(cluster: Cluster, items: list[dict[str, Any]]) -> None:
    for start in range(0, len(items), 100):
        chunk = {"apiVersion": "v1", "kind": "List", "items": items[start : start + 100]}
        cluster.kubectl("apply", "--server-side", "-f", "-", stdin=json.dumps(chunk))


def replay(cluster: Cluster, w: Planned) -> TraceRate:
    """Starts the workload's load in the emulator; returns the same rate, to know the truth."""
    answer = requests.post(
        f"{cluster.gpusim_url}/v1/workloads/{NAMESPACE}/{w.name}/replay",
        json={
            "trace": str(w.trace),
            "speedup": w.speedup,
            "scale": w.scale,
            "offsetSeconds": w.offset,
            "loop": True,
        },
        timeout=30,
    )
    answer.raise_for_status()
    return TraceRate(load_trace(w.trace), time.time(), w.speedup, w.scale, w.offset, True)


# --- the operators ----------------------------------------------------------------------------


def exposition(op: Operator) -> list[str]:
    try:
        return requests.get(
            f"http://127.0.0.1:{op.metrics_port}/metrics", timeout=5
        ).text.splitlines()
    except requests.RequestException:
        return []


def _value(line: str) -> float:
    return float(line.rsplit(" ", 1)[1])


def look(
    op: Operator, t: float, before: report.OperatorSample | None
) -> report.OperatorSample | None:
    """The process's memory and CPU, and its metrics; in charge if it decided since it was
    last looked at (a new process: if it decided at all)."""
    if not op.running() or op.process is None:
        return None
    pid = op.process.pid
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    rss = next(int(x.split()[1]) / 1024 for x in status.splitlines() if x.startswith("VmRSS:"))
    cpu = (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")
    lines = exposition(op)
    if not lines:
        return None
    decisions = sum(
        _value(x) for x in lines if x.startswith("gpusizer_reconcile_duration_seconds_count")
    )
    available = next(
        (_value(x) for x in lines if x.startswith("gpusizer_prometheus_available ")), None
    )
    known = frozenset(
        x.split('name="', 1)[1].split('"', 1)[0]
        for x in lines
        if x.startswith("gpusizer_metrics_available{") and _value(x) == 1
    )
    previous = before.decisions if before is not None and before.pid == pid else 0.0
    return report.OperatorSample(
        t, op.name, pid, rss, cpu, decisions, decisions > previous, available, known
    )


# --- the run ----------------------------------------------------------------------------------


@contextmanager
def soak_cluster(args: argparse.Namespace) -> Iterator[Cluster]:
    reuse = args.cluster_dir is not None
    state = (
        Path(args.cluster_dir).resolve()
        if reuse
        else Path(tempfile.mkdtemp(prefix="soak-")) / "state"
    )
    env = {
        "GPUSIZER_NODEPOOLS": str(REPO / "e2e" / "soak" / "nodepools.yaml"),
        "GPUSIZER_GPUSIM": "1",
    }
    up = run_script("cluster-up.sh", state, **env)
    if up.returncode != 0:
        raise SystemExit(f"cluster-up.sh failed:\n{up.stdout}\n{up.stderr}")
    try:
        yield Cluster.from_state_dir(state)
    finally:
        if not reuse and not args.keep:
            run_script("cluster-down.sh", state)


def run(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    traces = sorted(Path(args.traces_dir).glob("*.csv"))
    if not traces:
        raise SystemExit(f"no traces (*.csv) in {args.traces_dir}")
    workloads = plan(args.workloads, traces, rng)
    by_name = {w.name: w for w in workloads}
    acting = [w.name for w in workloads if not w.rules.hands_off]
    checker = Checker({w.name: w.rules for w in workloads}, owed_bound_seconds=args.owed_bound)
    lock = threading.Lock()
    with soak_cluster(args) as cluster, peering_objects(cluster):
        api = cluster.api_client()
        apps, core, custom = k8s.AppsV1Api(api), k8s.CoreV1Api(api), k8s.CustomObjectsApi(api)
        audit = AuditLog(cluster.state_dir / "logs" / "audit.log")
        audit.skip_to_end()
        cluster.kubectl("create", "namespace", NAMESPACE, check=False)
        started = time.time()
        apply_all(cluster, [deployment(w) for w in workloads])
        apply_all(cluster, [hpa(w) for w in workloads if w.kind == "hpa"])
        for w in workloads:
            checker.set_replicas(w.name, 1)
        wait_until(
            lambda: ready_count(apps) >= len(workloads),
            600,
            interval=5,
            what="every workload ready",
        )
        rates = {w.name: replay(cluster, w) for w in workloads}
        log(f"{len(workloads)} workloads ready and loaded after {time.time() - started:.0f}s")

        proxy = PrometheusProxy(cluster.prometheus_url)
        workdir = Path(tempfile.mkdtemp(prefix="soak-operators-"))
        operators = [
            Operator(
                cluster,
                workdir,
                name=name,
                sync_period=SYNC_SECONDS,
                prometheus_url=proxy.url,
                extra_args=[
                    *lease_args(PEERING),
                    "--reshape-deadline",
                    "120",
                    "--rightsizing-period",
                    "30",
                ],
            )
            for name in ("replica-a", "replica-b")
        ]
        for op in operators:
            op.start()
        apply_all(cluster, [sizing(w) for w in workloads])
        wait_until(
            lambda: decided(custom) >= len(workloads),
            300,
            interval=5,
            what="every WorkloadSizing decided",
        )
        log(
            f"every WorkloadSizing decided after {time.time() - started:.0f}s; "
            f"operators' logs in {workdir}"
        )

        samples: list[report.OperatorSample] = []
        exits: list[dict[str, Any]] = []  # replicas that stopped without a fault stopping them
        last_look: dict[str, report.OperatorSample] = {}
        capacity: dict[str, float] = {}

        decided_at: dict[str, float] = {}  # when each replica was last seen deciding

        def active() -> Operator | None:
            """The replica seen deciding last, if it still runs and was within 30 s."""
            running = [op for op in operators if op.running() and op.name in decided_at]
            latest = max(running, key=lambda op: decided_at[op.name], default=None)
            if latest is None or time.time() - decided_at[latest.name] > 30:
                return None
            return latest

        stage = Stage(
            cluster,
            NAMESPACE,
            proxy,
            operators,
            checker,
            lock,
            acting,
            lambda name: deployment(by_name[name]),
            active,
            # asked now, not the last sample: a workload scaled down off a node in the 5 s
            # since was judged as if its metrics were hidden with the node's (seed 27's w125)
            lambda since=0.0: ready_by_node(emulated(cluster), since),
            apps,
            core,
            custom,
        )
        schedule = Schedule(stage, rng, args.fault_every)
        total = args.minutes * 60
        warm = min(120.0, total * 0.2)
        t0 = time.time()
        faults_from, faults_until = t0 + warm, t0 + total
        next_fault, next_truth = faults_from, 0.0
        log(
            f"soak: {args.minutes:g} min, seed {seed}, "
            + (
                f"a fault every {args.fault_every:g}s from {warm:.0f}s"
                if args.fault_every
                else "no faults (a quiet run)"
            )
        )
        faults_over: float | None = None
        recovered, awaited = report.Recovered(), False

        def settled(now: float) -> bool:
            nonlocal awaited
            if faults_over is None or now < faults_over + SETTLE_SECONDS:
                return False
            if now >= faults_over + SETTLE_MAX_SECONDS:
                return True
            left = recovered.pending(stage.done, samples, acting, checker.owed_at)
            if left and not awaited:
                awaited = True
                log(f"waiting for faults to recover: {', '.join(f.kind for f in left)}")
            return not left

        restarting: set[str] = set()  # replicas that exited by themselves, until started again
        try:
            while not settled(time.time()):
                now = time.time()
                with lock:
                    for action in audit.read():
                        checker.observe(action)
                if now >= next_truth:
                    next_truth = now + 5
                    sample_truth(cluster, acting, rates, capacity, checker, lock, now)
                    for op in operators:
                        if not op.running() and op.name not in stage.killing:
                            if op.name not in restarting:
                                restarting.add(op.name)
                                exits.append(exited(op, now))
                                log(f"{op.name} exited by itself: {exits[-1]['code']}; restarting")
                            try:
                                op.start()  # as the Deployment's pod would be
                                restarting.discard(op.name)
                            except KubectlFailed as exc:  # its token: the API server is away
                                log(f"{op.name} not started: {exc.stderr.strip()}; again in 5 s")
                        seen = look(op, now, last_look.get(op.name))
                        if seen is not None:
                            samples.append(seen)
                            last_look[op.name] = seen
                            if seen.active:
                                decided_at[op.name] = now
                if args.fault_every and faults_from <= now < faults_until and now >= next_fault:
                    next_fault += args.fault_every
                    fault = schedule.inject()
                    if fault is not None:
                        log(f"fault {fault.kind}{' (overlapping)' if fault.overlapped else ''}")
                if faults_over is None and now >= faults_until and not stage.running:
                    log(
                        f"faults over; settling for {SETTLE_SECONDS:g}s, and until every fault "
                        f"has recovered (at most {SETTLE_MAX_SECONDS:g}s)"
                    )
                    faults_over = now
                time.sleep(1.0)
            status_fields = status_writes(active())
        finally:
            kill_leftovers(stage)
            for op in operators:
                stop(op)
            proxy.close()
        with lock:
            for action in audit.read():
                checker.observe(action)
        shutil.copy(audit.path, workdir / "audit.log")  # the cluster goes, the evidence stays
        end = time.time()
        result = build_report(
            args, seed, checker, stage, schedule, samples, acting, t0, warm, faults_until, end
        )
        result["logs"] = str(workdir)  # the replicas' logs and the audit log
        result["owed_at_end"] = [
            {**o, "since": round(o["since"] - t0)} for o in checker.still_owed()
        ]
        episodes = [until - since for _, since, until in checker.episodes]
        result["owed_episodes"] = {
            "n": len(episodes),
            "max_s": round(max(episodes, default=0), 1),
            "over_bound": sum(e > args.owed_bound for e in episodes),
        }
        result["status_writes_by_field"] = status_fields
        result["operator_exits"] = exits
        result["checks"]["no replica stopped by itself"] = {"ok": not exits, "detail": exits}
        result["passed"] = all(c["ok"] for c in result["checks"].values())
        return result


def exited(op: Operator, t: float) -> dict[str, Any]:
    assert op.process is not None
    return {
        "time": round(t, 1),
        "replica": op.name,
        "code": op.process.returncode,
        "log": op.log_tail(5),
    }


def emulated(cluster: Cluster) -> list[dict[str, Any]]:
    """The emulator's account of every workload of the soak and its pods."""
    described: list[dict[str, Any]] = requests.get(
        f"{cluster.gpusim_url}/v1/workloads/{NAMESPACE}", timeout=10
    ).json()
    return described


def ready_by_node(
    described: list[dict[str, Any]], since: float = 0.0
) -> dict[str, set[str]] | None:
    """GPU node -> the workloads with a ready pod on it, if the emulator read its pods from the
    cluster at or after `since` (None: not yet)."""
    if any((item.get("viewedAt") or 0.0) < since for item in described):
        return None
    nodes: dict[str, set[str]] = {}
    for item in described:
        for pod in item["pods"]:
            if pod["ready"]:
                nodes.setdefault(pod["node"], set()).add(item["name"])
    return nodes


def sample_truth(
    cluster: Cluster,
    acting: list[str],
    rates: dict[str, TraceRate],
    capacity: dict[str, float],
    checker: Checker,
    lock: threading.Lock,
    now: float,
) -> None:
    """The emulator's truth for the checker: what each replica serves, the workloads with a
    pod not placed, and the demand each had over the last DEMAND_WINDOW seconds."""
    described = emulated(cluster)
    unplaced = set()
    for item in described:
        ready = [p for p in item["pods"] if p["ready"]]
        if ready:
            capacity[item["name"]] = statistics.fmean(p["capacityRps"] for p in ready)
        if any(p["node"] is None for p in item["pods"]):
            unplaced.add(item["name"])
    with lock:
        for name in acting:
            rps = rates[name].arrivals(now - DEMAND_WINDOW, now) / DEMAND_WINDOW
            checker.demand(
                now, name, rps, capacity.get(name, CAPACITY_RPS), unplaced=name in unplaced
            )


def stop(op: Operator) -> None:
    """SIGTERM, then SIGKILL if it has not exited within two minutes (it must within 90 s:
    gpusizer.startup.EXIT_GRACE_SECONDS)."""
    try:
        op.stop()
    except subprocess.TimeoutExpired:
        log(f"{op.name} did not exit on SIGTERM within 30s; waiting, then SIGKILL")
        assert op.process is not None
        try:
            op.process.wait(timeout=90)
        except subprocess.TimeoutExpired:
            op.stop(signal.SIGKILL)


def status_writes(op: Operator | None) -> dict[str, float]:
    """The replica in charge's status writes by field, since it took charge."""
    found: dict[str, float] = {}
    for line in exposition(op) if op is not None else []:
        if line.startswith("gpusizer_status_writes_total{"):
            field = line.split('field="', 1)[1].split('"', 1)[0]
            found[field] = _value(line)
    return found


def build_report(
    args: argparse.Namespace,
    seed: int,
    checker: Checker,
    stage: Stage,
    schedule: Schedule,
    samples: list[report.OperatorSample],
    acting: list[str],
    t0: float,
    warm: float,
    faults_until: float,
    end: float,
) -> dict[str, Any]:
    faults = sorted(stage.done, key=lambda f: f.start)
    recoveries: dict[str, list[float | None]] = {}
    parts: dict[str, dict[str, list[float | None]]] = {}
    metrics_back: dict[tuple[str, float], float | None] = {}
    for f in faults:
        owed = checker.owed_at(f.end or f.start)
        r = report.recovery(f, samples, acting, owed)
        metrics_back[(f.kind, f.start)] = r["metrics"]
        recoveries.setdefault(f.kind, []).append(r["total"])
        for part in ("decided", "metrics", "scale_up"):
            parts.setdefault(f.kind, {}).setdefault(part, []).append(r[part])
    slot = args.fault_every or QUIET_SLOT_SECONDS
    baseline = report.baseline_counts(checker, t0, t0 + warm, slot)
    per_fault = report.per_fault_counts(
        faults,
        checker,
        slot,
        baseline,
        len(acting),
        OUTAGE_GRACE_SECONDS,
        metrics_back,
    )
    warmed = t0 + max(warm, min(600.0, (faults_until - t0) * 0.2))
    growth = report.growth(samples, warmed, end)
    restarts = [f for f in faults if f.kind == "apiserver-restart"]
    relisted = report.relisted(restarts, checker.lists, WATCHED)

    decisions = _decisions(samples)
    checks: dict[str, dict[str, Any]] = {
        "no wrong action": {"ok": not checker.wrong, "detail": len(checker.wrong)},
        "every fault injected": {
            "ok": not schedule.errors,
            "detail": schedule.errors,
        },
        "every kind of fault": {
            "ok": not args.fault_every
            or all(report.fault_counts(faults).values())
            or args.minutes * 60 < 11 * args.fault_every + warm,
            "detail": "all kinds come once in every 11 faults"
            if args.fault_every
            else "a quiet run: no faults",
        },
        "events per fault bounded": {
            "ok": all(r["events"] <= r["events_bound"] for r in per_fault),
            "detail": "3, plus 2 per workload a fault touched itself (report.per_fault_counts)",
        },
        "status patches per fault bounded": {
            "ok": all(r["status_patches"] <= r["status_patches_bound"] for r in per_fault),
            "detail": "twice the fault-free maximum, plus 2 per workload touched, plus one "
            "per workload acted on after an outage of Prometheus longer than "
            f"{OUTAGE_GRACE_SECONDS:g}s (report.per_fault_counts)",
        },
        "RSS no growth beyond 10 %": report.judge_growth(growth["rss_mib"], faults_until - t0),
        "CPU no growth beyond 10 %": report.judge_growth(
            growth["cpu_cores"], faults_until - t0, beyond_error=bool(args.fault_every)
        ),
        "watches met 410 after each API server restart": {
            "ok": all(str(f.facts.get("watch_from_before", "")).endswith("410") for f in restarts),
            "detail": [f.facts.get("watch_from_before") for f in restarts],
        },
        "the operator listed again after each API server restart": {
            "ok": all(relisted),
            "detail": relisted,
        },
        "every fault recovered": {
            "ok": all(v is not None for vs in recoveries.values() for v in vs),
            "detail": {k: report.summary(v)["unrecovered"] for k, v in recoveries.items()},
        },
    }
    return {
        "machine": machine(),
        "seed": seed,
        "minutes": args.minutes,
        "workloads": args.workloads,
        "faults": report.fault_counts(faults),
        "faults_overlapping": sum(f.overlapped for f in faults),
        "decisions": decisions,
        "writes": checker.writes,
        "conflicts": checker.conflicts,
        "wrong_actions": [w.__dict__ for w in checker.wrong],
        "recovery_s": {
            k: {
                **report.summary(v),
                **{f"{part}_max": report.summary(p)["max"] for part, p in parts[k].items()},
            }
            for k, v in recoveries.items()
        },
        "rss_mib": growth["rss_mib"],
        "cpu_cores": growth["cpu_cores"],
        "events_per_fault": {
            "max": max((r["events"] for r in per_fault), default=0),
            "mean": report.mean([r["events"] for r in per_fault]),
            "bound_max": max((r["events_bound"] for r in per_fault), default=0),
            "load_events_max": max((r["load_events"] for r in per_fault), default=0),
        },
        "status_patches_per_fault": {
            "max": max((r["status_patches"] for r in per_fault), default=0),
            "mean": report.mean([r["status_patches"] for r in per_fault]),
            "bound_max": max((r["status_patches_bound"] for r in per_fault), default=0),
        },
        "baseline_per_slot": baseline,
        "checks": checks,
        "passed": all(c["ok"] for c in checks.values()),
        "fault_log": [{**describe(f), **r} for f, r in zip(faults, per_fault, strict=True)],
        "operators": report.processes(samples, t0),
        "rss_series": [
            [round(s.time - t0), s.pid, round(s.rss_mib, 1), round(s.cpu_seconds, 1)]
            for s in samples
            if s.active
        ],
    }


def _decisions(samples: list[report.OperatorSample]) -> int:
    """Decisions of every operator process, summed over processes (a SIGKILLed one's count
    is its last sample's)."""
    last: dict[int, float] = {}
    for s in samples:
        last[s.pid] = s.decisions
    return int(sum(last.values()))


def ready_count(apps: k8s.AppsV1Api) -> int:
    items = apps.list_namespaced_deployment(NAMESPACE).items
    return sum(1 for d in items if (d.status.ready_replicas or 0) >= 1)


def decided(custom: k8s.CustomObjectsApi) -> int:
    items = custom.list_namespaced_custom_object(
        "gpusizer.io", "v1alpha1", NAMESPACE, "workloadsizings"
    )["items"]
    return sum(1 for o in items if (o.get("status") or {}).get("conditions"))


@contextmanager
def peering_objects(cluster: Cluster) -> Iterator[None]:
    install_manifests(cluster)
    with peering(cluster, PEERING):
        yield


def machine() -> dict[str, Any]:
    """bench/hostinfo.py's account of the machine (bench/ is not a package)."""
    spec = importlib.util.spec_from_file_location("hostinfo", REPO / "bench" / "hostinfo.py")
    assert spec is not None and spec.loader is not None
    hostinfo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hostinfo)
    return dict(hostinfo.machine())


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m e2e.soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=60)
    p.add_argument("--seed", type=int, default=None, help="default: drawn, and printed")
    p.add_argument("--out", default="soak.json")
    p.add_argument("--workloads", type=int, default=200)
    p.add_argument("--fault-every", type=float, default=30.0, help="seconds; 0: no faults")
    p.add_argument("--owed-bound", type=float, default=90.0, help="seconds a scale-up may be owed")
    p.add_argument("--traces-dir", default=str(REPO.parent / "shared" / "traces"))
    p.add_argument(
        "--cluster-dir",
        default=None,
        help="use (or start) the cluster of this state dir, and keep it",
    )
    p.add_argument("--keep", action="store_true", help="leave the soak's own cluster running")
    args = p.parse_args(argv)
    if args.fault_every < 0:
        p.error(f"--fault-every: {args.fault_every:g} is negative; 0 means no faults")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    log(f"soak seed {seed} (replay with SEED={seed})")
    result = run(args, seed)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    failed = [name for name, c in result["checks"].items() if not c["ok"]]
    log(
        f"report in {args.out}: {result['writes']} writes, "
        f"{len(result['wrong_actions'])} wrong actions, "
        f"{sum(result['faults'].values())} faults; "
        + (f"FAILED: {failed}" if failed else "every check passed")
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
