"""Scale benchmark: one operator, N WorkloadSizings, on the local GPU cluster with the emulator.

For each size (ascending; the workloads of a size are kept for the next one) it creates N
Deployments of one GPU replica and their WorkloadSizings, waits until every replica is ready and
every WorkloadSizing has been decided, then measures:

- change-to-write latency: the load of a sample of workloads is raised in the emulator, one
  after the other over the period of the operator's read of their hour's use (`--spread`), so
  that every phase of its rhythm is sampled as often as it lasts: the scrapes, the reads, the
  full reads and the reads over a window. One watch on the Deployments records when each
  one's spec.replicas changes (p50, p95), split at the timestamp of the scrape that carried
  the change and at its landing in Prometheus;
- cycle: the time to decide every workload once, N / (decisions per second), from the
  operator's gpusizer_reconcile_duration_seconds_count over whole waits of a quiet workload;
- operator CPU (cores, from /proc/PID/stat over a steady window) and peak RSS (VmHWM);
- Prometheus queries per cycle: delta of gpusizer_prometheus_query_duration_seconds_count over
  the delta of gpusizer_snapshot_duration_seconds_count (one snapshot per read, full or moved);
- API requests per cycle: delta of gpusizer_kube_api_requests_total (every request of the
  operator's client, status patches included, plus the events kopf posts for it) per cycle;
- the mean time of a full read and of a moved read, and the CPU of Prometheus and of the
  emulator over the same window (they share the machine with the operator).

Usage: python bench/scale.py [--sizes 100,1000,5000] [--out FILE] [--cluster-dir DIR]
Without --cluster-dir it starts its own cluster (bench/nodepools-scale.yaml, sized for the
largest size) in a temporary directory and stops it at the end.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import requests
import yaml
from hostinfo import machine
from kubernetes.client.rest import ApiException
from urllib3.exceptions import ProtocolError

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gpusizer.api.v1alpha1 import RightSizingSpec  # noqa: E402
from gpusizer.report.status import STATUS_REFRESHES_PER_SECOND  # noqa: E402
from gpusizer.settings import (  # noqa: E402
    OperatorSettings,
    PrometheusSettings,
    read_period_seconds,
)
from gpusizer.signals.queries import MOVE_FRACTION  # noqa: E402
from gpusizer.signals.reader import window_period  # noqa: E402

from e2e.tests.conftest import Cluster, run_script  # noqa: E402
from e2e.tests.operator_support import (  # noqa: E402
    Operator,
    deployment_manifest,
    install_manifests,
    sizing_spec,
)

NAMESPACE = "bench-scale"
LABEL = "gpusizer.io/bench"
GPUS_PER_NODE = 64
# The bench's own lists of the fleet's Deployments and WorkloadSizings, while it waits for
# them to be ready and decided, are load on the API server under test: at most this many
# objects a second (the twenty-fourth session's note: at 10,000, a list every 5 s).
LISTED_PER_SECOND = 1000.0
HIGH_RPS = 30.0  # 3x one replica's 70 % target: every sample must scale up
SCRAPE_SECONDS = 5.0  # cluster-up.sh's scrape_interval


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def wait_for(check: Callable[[], Any], timeout: float, what: str, interval: float = 2.0) -> Any:
    """`check`'s first true value; an API server too busy to answer a check (5xx), or whose
    answer broke off, is asked again at the next interval: a 504 to the bench's own list of
    10,000 WorkloadSizings ended a run after 55 minutes (twenty-fourth session), and that list
    cut off after 31 MB another (twenty-sixth session)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = check()
        except ApiException as err:
            if err.status is None or err.status < 500:
                raise
            log(f"waiting for {what}: the API server answered {err.status} {err.reason}")
            value = None
        except ProtocolError as err:
            log(f"waiting for {what}: the API server's answer broke off: {err}")
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


# --- the operator process ---------------------------------------------------------------------


def control_plane_pids(state_dir: Path) -> dict[str, int]:
    """The local cluster's components by name (its `pids` file: `name pid` lines)."""
    try:
        lines = (state_dir / "pids").read_text().splitlines()
    except FileNotFoundError:
        return {}
    return {name: int(pid) for name, pid in (line.split() for line in lines if line.strip())}


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int, field: str) -> float:
    """VmHWM (the peak since the process started) or VmRSS (now), from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return 0.0


BROKEN_DOWN = {  # series -> (label, prefix of its values in the per-cycle breakdown)
    "gpusizer_prometheus_query_duration_seconds_count": ("signal", ""),
    "gpusizer_kube_api_requests_total": ("verb", ""),
    "gpusizer_status_writes_total": ("field", "status."),
    "gpusizer_snapshot_duration_seconds_count": ("read", "reads."),
    "gpusizer_snapshot_duration_seconds_sum": ("read", "reads."),  # not per cycle: see read_s
    "gpusizer_reconcile_duration_seconds_bucket": ("le", "turns.le."),  # not per cycle either
}


def scrape(port: int) -> dict[str, float]:
    """The operator's /metrics, summed per series name (labels dropped), plus the query and
    API request counts per signal and verb as `name:value`."""
    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
    sums: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, _, value = line.rpartition(" ")
        name = name_labels.split("{", 1)[0]
        sums[name] = sums.get(name, 0.0) + float(value)
        label, prefix = BROKEN_DOWN.get(name, ("", ""))
        if label and f'{label}="' in name_labels:
            value_of_label = name_labels.split(label + '="', 1)[1].split('"', 1)[0]
            key = f"{name}:{prefix}{value_of_label}"
            sums[key] = sums.get(key, 0.0) + float(value)
    return sums


# --- workloads --------------------------------------------------------------------------------


def workload_name(i: int) -> str:
    return f"w{i:05d}"


def deployment(name: str) -> dict[str, Any]:
    return deployment_manifest(name, NAMESPACE, labels={LABEL: "scale"})


def workload_sizing(name: str) -> dict[str, Any]:
    spec = sizing_spec(
        name,
        replicas={
            "min": 1,
            "max": 4,
            "scaleDown": {
                "stabilizationWindowSeconds": 30,
                "maxReplicasPerStep": 4,
                "periodSeconds": 5,
            },
        },
    )
    return {
        "apiVersion": "gpusizer.io/v1alpha1",
        "kind": "WorkloadSizing",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {LABEL: "scale"}},
        "spec": spec,
    }


APPLY_ATTEMPTS = 3


def apply_list(cluster: Cluster, items: list[dict[str, Any]]) -> None:
    """Server-side apply, 250 objects at a time. A chunk kubectl gave up on is applied again,
    whole, which is idempotent: one of 250 Deployments took over kubectl's 120 s while the
    second 5,000 were created on a two-core Intel host (twenty-fifth session). The bench owns
    what it applies (--force-conflicts): on a cluster kept from an earlier run (--cluster-dir)
    the operator has scaled the sampled Deployments, and each size starts from one replica."""
    for start in range(0, len(items), 250):
        part = items[start : start + 250]
        chunk = json.dumps({"apiVersion": "v1", "kind": "List", "items": part})
        for attempt in range(1, APPLY_ATTEMPTS + 1):
            try:
                cluster.kubectl(
                    "apply", "--server-side", "--force-conflicts", "-f", "-", stdin=chunk
                )
                break
            except subprocess.TimeoutExpired as exc:
                if attempt == APPLY_ATTEMPTS:
                    raise
                log(f"applying objects {start}-{start + len(part) - 1} again: {exc}")


def listed_deployments(apps: Any) -> dict[str, Any]:
    """The benchmark's Deployments as the API server's JSON: the client's models of 10,000
    of them took seconds of the machine's two cores at every poll."""
    response = apps.list_namespaced_deployment(
        NAMESPACE, label_selector=f"{LABEL}=scale", _preload_content=False
    )
    listed: dict[str, Any] = json.loads(response.data)
    return listed


def poll_interval(size: int) -> float:
    """Seconds between the bench's lists of `size` objects: 5, or longer at larger sizes."""
    return max(5.0, size / LISTED_PER_SECOND)


def ready_deployments(apps: Any, names: set[str]) -> int:
    return sum(
        1
        for d in listed_deployments(apps)["items"]
        if d["metadata"]["name"] in names and (d.get("status") or {}).get("readyReplicas", 0) >= 1
    )


def decided(custom: Any, names: set[str]) -> tuple[int, int]:
    """How many of the WorkloadSizings have been decided, and how many of those have known
    metrics."""
    items = custom.list_namespaced_custom_object(
        "gpusizer.io", "v1alpha1", NAMESPACE, "workloadsizings", label_selector=f"{LABEL}=scale"
    )["items"]
    done = known = 0
    for obj in items:
        if obj["metadata"]["name"] not in names:
            continue
        conditions = (obj.get("status") or {}).get("conditions") or []
        metrics = [c for c in conditions if c["type"] == "MetricsAvailable"]
        done += bool(metrics)
        known += any(c["status"] == "True" for c in metrics)
    return done, known


def own_decisions(metrics: dict[str, float]) -> float:
    """The decisions the operator behind `metrics` (`scrape`) made since it started."""
    return metrics.get("gpusizer_reconcile_duration_seconds_count", 0.0)


def grow(
    cluster: Cluster, apps: Any, custom: Any, have: int, size: int, metrics_port: int
) -> dict[str, Any]:
    """Create workloads up to `size`, and wait until all are decided and their first
    decisions' writes have gone out: how many have known metrics, and what the operator wrote
    over the last quiet span ("no": it did not fall quiet)."""
    names = [workload_name(i) for i in range(have, size)]
    started = time.monotonic()
    apply_list(cluster, [deployment(n) for n in names])
    log(f"{len(names)} Deployments created in {time.monotonic() - started:.0f}s")
    everyone = {workload_name(i) for i in range(size)}
    wait_for(
        lambda: ready_deployments(apps, everyone) == size,
        timeout=300 + size * 0.6,
        what=f"{size} ready Deployments",
        interval=poll_interval(size),
    )
    log(f"{size} Deployments ready after {time.monotonic() - started:.0f}s")
    apply_list(cluster, [workload_sizing(n) for n in names])
    counts = (0, 0)
    all_decided: float | None = None

    def settled() -> bool:
        """Decided, nearly all with known metrics, by this operator: on a kept cluster the
        statuses may be an earlier operator's, and one restarted on a fleet of 10,000 once took
        23 minutes to decide anything (bench/README.md). (WorkloadSizings carry no finalizer
        since 271a25e: kopf has no backlog of finalizer patches left to wait for.)"""
        nonlocal counts, all_decided
        if own_decisions(scrape(metrics_port)) < size:
            return False
        counts = decided(custom, everyone)
        if counts[0] == size and all_decided is None:
            all_decided = time.monotonic() - started
        return counts[0] == size and counts[1] >= 0.99 * size

    try:
        wait_for(settled, timeout=300 + size * 0.2, what="decisions", interval=poll_interval(size))
    except TimeoutError:
        if counts[0] < size:
            raise
    # under load some readings go missing (scrape or query timeouts): measured, and said
    log(
        f"{counts[0]} WorkloadSizings decided after {all_decided:.0f}s, "
        f"{counts[1]} with known metrics after {time.monotonic() - started:.0f}s"
    )
    try:
        quiet = wait_for(
            lambda: first_handling_over(metrics_port),
            timeout=300 + size * 0.1,
            what="the first decisions' Events, conditions and status patches to go out",
            interval=0,
        )
        log(f"first handling over after {time.monotonic() - started:.0f}s ({quiet})")
    except TimeoutError as exc:  # measured anyway, and the result says it was not quiet
        log(str(exc))
        quiet = ""
    return {"known": counts[1], "quiet": quiet or "no"}


QUIET_SPAN_SECONDS = 10.0
AT_REST = {  # what a fleet at rest writes over a span, at most: series, count
    # a workload's first decisions post Events and set conditions; a steady one does neither
    "events": ("gpusizer_kube_api_requests_total:POST", 2.0),
    "conditions": ("gpusizer_status_writes_total:status.conditions", 2.0),
    # readings rewritten while nothing material changed go out at most at the refresh budget's
    # pace (report.status.RefreshBudget); more is a wave of material writes, as when readings
    # come and go while the emulator's scrapes time out after the creation burst
    "status patches": (
        "gpusizer_kube_api_requests_total:PATCH",
        STATUS_REFRESHES_PER_SECOND * QUIET_SPAN_SECONDS,
    ),
}


def first_handling_over(metrics_port: int) -> str:
    """What the operator wrote over QUIET_SPAN_SECONDS, when it is no more than a fleet at rest
    writes (`at_rest`). At 10,000 the first handling of the workloads was still going out 50 s
    after the last first decision (sixteenth session), and a window began during a wave of 252
    status patches a cycle (twenty-third session): a window that holds either measures the
    backlog, not the steady state (bench/README.md)."""
    before = scrape(metrics_port)
    time.sleep(QUIET_SPAN_SECONDS)  # a span to count writes over, not a wait for readiness
    return at_rest(before, scrape(metrics_port))


def at_rest(before: dict[str, float], after: dict[str, float]) -> str:
    """What was written between two scrapes QUIET_SPAN_SECONDS apart, by AT_REST's names; ""
    when any of them is more than a fleet at rest writes."""
    written = {
        name: after.get(series, 0.0) - before.get(series, 0.0)
        for name, (series, _) in AT_REST.items()
    }
    if any(written[name] > most for name, (_, most) in AT_REST.items()):
        return ""
    return ", ".join(f"{count:.0f} {name}" for name, count in written.items()) + (
        f" in {QUIET_SPAN_SECONDS:.0f}s"
    )


# --- change-to-write latency -------------------------------------------------------------------


class ReplicaWatch:
    """One watch on the benchmark's Deployments: when did each sample's spec.replicas change."""

    def __init__(self, apps: Any, samples: set[str]) -> None:
        self.apps = apps
        self.samples = samples
        self.changed: dict[str, float] = {}
        self.all_changed = threading.Event()
        self._stop = False
        self._rv = listed_deployments(apps)["metadata"]["resourceVersion"]
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from kubernetes import watch

        while not self._stop:
            w = watch.Watch()
            try:
                self._follow(w)
            except Exception as exc:  # 410 Gone or a dropped stream: list again, then watch
                log(f"watch restarted: {exc}")
                self._rv = listed_deployments(self.apps)["metadata"]["resourceVersion"]

    def _follow(self, w: Any) -> None:
        for event in w.stream(
            self.apps.list_namespaced_deployment,
            NAMESPACE,
            label_selector=f"{LABEL}=scale",
            resource_version=self._rv,
            timeout_seconds=30,
        ):
            obj = event["object"]
            self._rv = obj.metadata.resource_version
            name = obj.metadata.name
            if name in self.samples and name not in self.changed and obj.spec.replicas > 1:
                self.changed[name] = time.time()
                if len(self.changed) == len(self.samples):
                    self.all_changed.set()
            if self._stop:
                w.stop()

    def stop(self) -> None:
        self._stop = True


def set_load(gpusim_url: str, name: str, rps: float) -> None:
    r = requests.put(
        f"{gpusim_url}/v1/workloads/{NAMESPACE}/{name}/load",
        json={"requestsPerSecond": rps},
        timeout=10,
    )
    r.raise_for_status()


def latency(
    cluster: Cluster, apps: Any, samples: list[str], spread: float
) -> tuple[dict[str, float], dict[str, float]]:
    """When each sample's load changed, and when its spec.replicas did (if it did)."""
    watcher = ReplicaWatch(apps, set(samples))
    changed_at: dict[str, float] = {}
    t0 = time.time()
    try:
        for i, name in enumerate(samples):
            due = t0 + spread * i / len(samples)  # a schedule, so every phase is sampled
            time.sleep(max(0.0, due - time.time()))
            set_load(cluster.gpusim_url, name, HIGH_RPS)
            changed_at[name] = time.time()
        watcher.all_changed.wait(timeout=120)
    finally:
        watcher.stop()
        for name in samples:
            set_load(cluster.gpusim_url, name, 0)
    return changed_at, dict(watcher.changed)


class Scraped(NamedTuple):
    """The first scraped sample of a workload's pod that shows its load change."""

    at: float  # its timestamp: when its scrape began
    instance: str  # the scrape target that served it


def first_scraped(prometheus_url: str, changed_at: dict[str, float]) -> dict[str, Scraped]:
    """The timestamp of the first scraped GPU utilisation sample of each workload's pod that
    shows its load change (moved as the operator counts a move), and its target: splits
    change-to-write into the emulator and the scrape, and what comes after."""
    pods = f'namespace="{NAMESPACE}",pod=~"({"|".join(changed_at)})-.*"'
    since = max(0, math.ceil(time.time() - min(changed_at.values())) + 60)
    answer = requests.get(
        f"{prometheus_url}/api/v1/query",
        params={"query": f"DCGM_FI_DEV_GPU_UTIL{{{pods}}}[{since}s]"},
        timeout=30,
    ).json()
    seen: dict[str, Scraped] = {}
    for series in answer["data"]["result"]:
        name = series["metric"]["pod"].split("-", 1)[0]
        points = [(float(t), float(v)) for t, v in series["values"]]
        before = [v for t, v in points if t < changed_at[name]]
        if not before:
            continue  # a pod started by the scale-up
        for t, v in points:
            moved = abs(v - before[-1]) > MOVE_FRACTION * max(v, before[-1], 1.0)
            if t >= changed_at[name] and moved:
                if name not in seen or t < seen[name].at:
                    seen[name] = Scraped(t, series["metric"]["instance"])
                break
    return seen


def scrape_durations(prometheus_url: str, scraped: dict[str, Scraped]) -> dict[str, float]:
    """How long the scrape that brought each workload's first moved sample took: Prometheus
    stamps a sample with its scrape's start and stores it once the scrape's body is read, so
    a query sees it this long after its timestamp. At 10,000 GPUs the emulator shares the two
    cores and some of its scrapes take seconds: time that is the emulator's, not the
    operator's. `scrape_duration_seconds` carries the same timestamp as its scrape's samples."""
    if not scraped:
        return {}
    since = max(0, math.ceil(time.time() - min(s.at for s in scraped.values())) + 60)
    instances = "|".join(sorted({s.instance for s in scraped.values()}))
    answer = requests.get(
        f"{prometheus_url}/api/v1/query",
        params={"query": f'scrape_duration_seconds{{instance=~"{instances}"}}[{since}s]'},
        timeout=30,
    ).json()
    took = {
        (series["metric"]["instance"], round(float(t), 3)): float(v)
        for series in answer["data"]["result"]
        for t, v in series["values"]
    }
    return {
        name: took[(s.instance, round(s.at, 3))]
        for name, s in scraped.items()
        if (s.instance, round(s.at, 3)) in took
    }


def percentile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


# --- one size ---------------------------------------------------------------------------------


def read_period(args: argparse.Namespace) -> float:
    return read_period_seconds(args.read_period, args.sync_period)


def steady_window(args: argparse.Namespace) -> float:
    """`--window`, at least four sync periods, rounded up to whole waits of a quiet workload
    (its decide_every * quiet_every reads): over a part of a wait, the cycle counted its turns
    on that part's cycles alone."""
    settings = OperatorSettings(
        PrometheusSettings(url=""),
        sync_period_seconds=args.sync_period,
        read_period_seconds=args.read_period,
    )
    wait = settings.read_period * settings.decide_every * settings.quiet_every
    return wait * math.ceil(max(args.window, 4 * args.sync_period) / wait)


def measure(
    cluster: Cluster, op: Operator, apps: Any, size: int, have: int, args: argparse.Namespace
) -> dict[str, Any]:
    assert op.process is not None
    pid = op.process.pid
    window = steady_window(args)
    neighbours = {
        name: int(cluster.env[key])
        for name, key in (("prometheus", "PROMETHEUS_PID"), ("gpusim", "GPUSIM_PID"))
        if cluster.env.get(key)
    }
    apiserver = control_plane_pids(cluster.state_dir).get("kube-apiserver")
    if apiserver is not None:
        neighbours["apiserver"] = apiserver
    n0 = {name: cpu_seconds(p) for name, p in neighbours.items()}
    m0, c0, t0 = scrape(op.metrics_port), cpu_seconds(pid), time.monotonic()
    profile = None
    if args.profile:
        profile = Path(args.profile).with_suffix(f".{size}.txt")
        subprocess.run(
            [
                str(REPO / ".venv" / "bin" / "py-spy"),
                "record",
                "--pid",
                str(pid),
                "--duration",
                str(int(window)),
                "--rate",
                "50",
                "--gil",  # CPU spent in Python, not threads waiting on sockets
                "--format",
                "raw",
                "--output",
                str(profile),
                "--nonblocking",
            ],
            check=False,
            capture_output=True,
        )
    remaining = window - (time.monotonic() - t0)
    if remaining > 0:
        time.sleep(remaining)  # the steady window: nothing to wait for, a duration to measure
    m1, c1, t1 = scrape(op.metrics_port), cpu_seconds(pid), time.monotonic()
    n1 = {name: cpu_seconds(p) for name, p in neighbours.items()}

    def delta(name: str) -> float:
        return m1.get(name, 0.0) - m0.get(name, 0.0)

    def read_s(kind: str = "") -> float:
        """Mean time of one read: of every read, or of the full or moved ones."""
        suffix = f":reads.{kind}" if kind else ""
        count = delta("gpusizer_snapshot_duration_seconds_count" + suffix)
        return (
            delta("gpusizer_snapshot_duration_seconds_sum" + suffix) / count if count else math.nan
        )

    cycles = delta("gpusizer_snapshot_duration_seconds_count")
    decisions = delta("gpusizer_reconcile_duration_seconds_count")
    # an operator before the full and moved reads has one kind: all of its reads are full
    snapshot_s = (
        read_s("full") if delta("gpusizer_snapshot_duration_seconds_count:reads.full") else read_s()
    )
    reconcile_ms = (
        1000 * delta("gpusizer_reconcile_duration_seconds_sum") / decisions
        if decisions
        else math.nan
    )
    fresh = list(range(have, size)) or list(range(size))
    picks = random.Random(size).sample(fresh, min(args.sample, len(fresh)))
    samples = [workload_name(i) for i in picks]
    spread = max(args.spread, SCRAPE_SECONDS + read_period(args))
    changed_at, written_at = latency(cluster, apps, samples, spread)
    scraped = first_scraped(cluster.prometheus_url, changed_at)
    scraped_at = {n: s.at for n, s in scraped.items()}
    took = scrape_durations(cluster.prometheus_url, scraped)
    delays = [written_at[n] - changed_at[n] for n in written_at]
    to_scrape = [scraped_at[n] - changed_at[n] for n in written_at if n in scraped_at]
    after_scrape = [written_at[n] - scraped_at[n] for n in written_at if n in scraped_at]
    scrape_took = [took[n] for n in written_at if n in took]
    after_landing = [written_at[n] - scraped_at[n] - took[n] for n in written_at if n in took]
    result = {
        "p50_s": round(percentile(delays, 0.5), 2),
        "p95_s": round(percentile(delays, 0.95), 2),
        "scraped_p50_s": round(percentile(to_scrape, 0.5), 2),
        "scraped_p95_s": round(percentile(to_scrape, 0.95), 2),
        "after_scrape_p50_s": round(percentile(after_scrape, 0.5), 2),
        "after_scrape_p95_s": round(percentile(after_scrape, 0.95), 2),
        "scrape_p50_s": round(percentile(scrape_took, 0.5), 2),
        "scrape_p95_s": round(percentile(scrape_took, 0.95), 2),
        "after_landing_p50_s": round(percentile(after_landing, 0.5), 2),
        "after_landing_p95_s": round(percentile(after_landing, 0.95), 2),
        "cycle_s": round(size * (t1 - t0) / decisions, 2) if decisions else math.nan,
        "cpu_cores": round((c1 - c0) / (t1 - t0), 3),
        "rss_mib": round(rss_mib(pid, "VmHWM"), 1),
        "rss_steady_mib": round(rss_mib(pid, "VmRSS"), 1),
        "queries_per_cycle": round(
            delta("gpusizer_prometheus_query_duration_seconds_count") / cycles, 2
        )
        if cycles
        else math.nan,
        "api_requests_per_cycle": round(delta("gpusizer_kube_api_requests_total") / cycles, 1)
        if cycles
        else math.nan,
        "snapshot_s": round(snapshot_s, 3),
        "moved_read_s": round(read_s("moved"), 3),
        **{
            f"{name}_cpu_cores": round((n1[name] - n0[name]) / (t1 - t0), 3)
            if name in neighbours
            else math.nan
            for name in ("prometheus", "gpusim", "apiserver")
        },
        "per_cycle": {
            key.split(":", 1)[1]: round(delta(key) / cycles, 2)
            for key in sorted(m1)
            if ":" in key
            and not key.split(":", 1)[0].endswith(("_sum", "_bucket"))
            and cycles
            and delta(key)
        },
        "reconcile_ms": round(reconcile_ms, 2),
        # the share of the window's turns that took over a second
        "turns_over_1s": round(
            1 - delta("gpusizer_reconcile_duration_seconds_bucket:turns.le.1.0") / decisions, 4
        )
        if decisions
        else math.nan,
        "samples": len(samples),
        "spread_s": spread,
        "missed": [n for n in samples if n not in written_at],
        "window_s": round(t1 - t0, 1),
        # each sample's change-to-write, its after-scrape part and its scrape's duration: a
        # p95 of 60 is the third-highest, so the spread says more than the figures
        "delays_s": {
            n: [
                round(written_at[n] - changed_at[n], 2),
                round(written_at[n] - scraped_at[n], 2),
                round(took[n], 2) if n in took else None,
            ]
            for n in written_at
            if n in scraped_at
        },
    }
    if profile is not None:
        result["profile"] = str(profile)
    if args.census:
        result["census"] = take_census(pid, Path(args.census), size)
        result["census_rss_mib"] = round(rss_mib(pid, "VmRSS"), 1)  # the walk's own included
    return result


def take_census(pid: int, path: Path, size: int) -> str:
    """Asks the operator for its heap census (bench/heap_census), once the window's figures
    are taken: the file it wrote, renamed to name the size."""
    path.unlink(missing_ok=True)
    os.kill(pid, signal.SIGUSR2)
    wait_for(path.exists, timeout=600, what=f"the heap census in {path}", interval=2)
    named = path.with_name(f"{path.stem}.{size}{path.suffix}")
    path.rename(named)
    return str(named)


def nodepools_for(largest: int, gpus_wanted: int, sample: int, workdir: Path) -> Path:
    pools = yaml.safe_load((REPO / "bench" / "nodepools-scale.yaml").read_text())
    gpus = max(largest, gpus_wanted) + 4 * sample + GPUS_PER_NODE
    pools["pools"][0]["count"] = max(2, math.ceil(gpus / GPUS_PER_NODE))
    path = workdir / "nodepools.yaml"
    path.write_text(yaml.safe_dump(pools))
    return path


def table(sizes: dict[str, dict[str, Any]]) -> str:
    cols = [
        ("size", "{}"),
        ("p50_s", "{:.1f}"),
        ("p95_s", "{:.1f}"),
        ("scraped_p50_s", "{:.1f}"),
        ("scraped_p95_s", "{:.1f}"),
        ("after_scrape_p50_s", "{:.1f}"),
        ("after_scrape_p95_s", "{:.1f}"),
        ("scrape_p50_s", "{:.1f}"),
        ("scrape_p95_s", "{:.1f}"),
        ("after_landing_p50_s", "{:.1f}"),
        ("after_landing_p95_s", "{:.1f}"),
        ("cycle_s", "{:.1f}"),
        ("cpu_cores", "{:.2f}"),
        ("rss_mib", "{:.0f}"),
        ("rss_steady_mib", "{:.0f}"),
        ("queries_per_cycle", "{:.1f}"),
        ("api_requests_per_cycle", "{:.0f}"),
        ("snapshot_s", "{:.2f}"),
        ("moved_read_s", "{:.2f}"),
        ("reconcile_ms", "{:.1f}"),
        ("prometheus_cpu_cores", "{:.2f}"),
        ("gpusim_cpu_cores", "{:.2f}"),
        ("apiserver_cpu_cores", "{:.2f}"),
    ]
    rows = [[c for c, _ in cols]]
    for size, r in sizes.items():
        rows.append([size] + [fmt.format(r[c]) for c, fmt in cols[1:]])
    widths = [max(len(row[i]) for row in rows) for i in range(len(cols))]
    lines = ("  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)) for row in rows)
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sizes", default="100,1000,5000", help="comma-separated workload counts")
    p.add_argument("--out", help="write the results as JSON to this file")
    p.add_argument("--cluster-dir", help="use (start if needed, never stop) this cluster state dir")
    p.add_argument(
        "--gpus", type=int, default=0, help="GPUs of a new cluster (default: the largest size)"
    )
    p.add_argument("--sync-period", type=float, default=5.0, help="the operator's --sync-period")
    p.add_argument(
        "--read-period", type=float, help="the operator's --read-period (default: its own)"
    )
    p.add_argument(
        "--operator-scrape-interval",
        default="30s",
        help="Prometheus scrape interval of the operator's /metrics (the chart's default: 30s)",
    )
    p.add_argument(
        "--prometheus-timeout",
        type=float,
        default=10.0,
        help="the operator's --prometheus-timeout (its default; the e2e tests use 3)",
    )
    p.add_argument("--sample", type=int, default=60, help="workloads whose load changes per size")
    p.add_argument(
        "--spread",
        type=float,
        # how often the operator reads the workloads' use over their window (an hour)
        default=window_period(
            RightSizingSpec().history_seconds, OperatorSettings.rightsizing_period_seconds
        ),
        help="seconds over which the samples' loads change (how often the operator reads the "
        "use over a window: a shorter spread measures a slice of its rhythm; at least a scrape "
        "plus a read period)",
    )
    p.add_argument(
        "--window",
        type=float,
        default=40.0,
        help="steady window for CPU, cycles (s; rounded up to whole waits of a quiet workload)",
    )
    p.add_argument("--log-level", default="info", help="the operator's --log-level")
    p.add_argument(
        "--operator-path",
        help="import gpusizer from this directory (e.g. a worktree's operator/) to compare",
    )
    p.add_argument(
        "--operator-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="set in the operator's environment, not the emulator's (PYTHONMALLOC=malloc)",
    )
    p.add_argument("--profile", help="py-spy raw profile of each window to FILE.<size>.txt")
    p.add_argument(
        "--census",
        help="after each window, the operator's live objects by owner and by type, to FILE "
        "(.json: FILE's stem.<size>.json) "
        "(bench/heap_census: a walk of every object, which holds the operator for seconds)",
    )
    args = p.parse_args()
    sizes = sorted({int(s) for s in args.sizes.split(",") if s.strip()})

    from kubernetes import client

    workdir = Path(tempfile.mkdtemp(prefix="gpusizer-bench-"))
    state_dir = Path(args.cluster_dir).resolve() if args.cluster_dir else workdir / "cluster"
    nodepools = nodepools_for(sizes[-1], args.gpus, args.sample, workdir)
    log(f"starting the cluster in {state_dir} ({nodepools})")
    up = run_script(
        "cluster-up.sh",
        state_dir,
        GPUSIZER_NODEPOOLS=str(nodepools),
        GPUSIZER_GPUSIM="1",
        GPUSIZER_CLUSTER_TIMEOUT="900",
        # the controller-manager's default 20 requests/s creates ~4 workloads a second: 20
        # minutes of set-up for 5,000; the operator's own API limits are left as they are
        GPUSIZER_CLIENT_QPS="400",
    )
    if up.returncode != 0:
        print(up.stdout, up.stderr, file=sys.stderr)
        return 1
    cluster = Cluster.from_state_dir(state_dir)
    op: Operator | None = None
    results: dict[str, dict[str, Any]] = {}
    try:
        install_manifests(cluster)
        cluster.kubectl("create", "namespace", NAMESPACE, check=False)
        os.environ["GPUSIZER_LOG_LEVEL"] = args.log_level
        paths = [str(Path(args.operator_path).resolve())] if args.operator_path else []
        if args.census:
            paths.append(str(REPO / "bench" / "heap_census"))
            os.environ["GPUSIZER_HEAP_CENSUS"] = str(Path(args.census).resolve())
        if paths:
            os.environ["PYTHONPATH"] = os.pathsep.join(paths)
        for setting in args.operator_env:  # the cluster and its emulator have started already
            name, _, value = setting.partition("=")
            os.environ[name] = value
        # scraped by Prometheus as the chart's ServiceMonitor does (the exposition is work)
        op = Operator(
            cluster,
            workdir,
            sync_period=args.sync_period,
            scrape=True,
            scrape_interval=args.operator_scrape_interval,
            # None, unless given: an operator from before the flag (--operator-path) can run
            read_period=args.read_period,
            extra_args=["--prometheus-timeout", str(args.prometheus_timeout)],
        )
        op.start()
        api = cluster.api_client()
        apps, custom = client.AppsV1Api(api), client.CustomObjectsApi(api)
        have = 0
        for size in sizes:
            log(f"size {size}: creating {size - have} workloads")
            settled = grow(cluster, apps, custom, have, size, op.metrics_port)
            results[str(size)] = {**measure(cluster, op, apps, size, have, args), **settled}
            have = size
            log(f"size {size}: {json.dumps(results[str(size)])}")
            if args.out:
                Path(args.out).write_text(
                    json.dumps({"machine": machine(), "sizes": results}, indent=2) + "\n"
                )
    finally:
        if op is not None:
            stopping = time.monotonic()
            try:
                op.stop()
                log(f"the operator exited {time.monotonic() - stopping:.1f}s after SIGTERM")
            except subprocess.TimeoutExpired:
                log("the operator still ran 30s after SIGTERM (a pod's grace period): killed")
                op.stop(signal.SIGKILL)
        if not args.cluster_dir:
            run_script("cluster-down.sh", state_dir)
    print(f"\nmachine: {json.dumps(machine())}")
    print(
        f"sync period {args.sync_period}s, read period {read_period(args)}s, "
        f"scrape interval {SCRAPE_SECONDS}s, "
        f"operator scraped every {args.operator_scrape_interval}\n"
    )
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
