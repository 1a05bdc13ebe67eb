"""Activator benchmark, on the local GPU cluster: the operator (default settings), the two
activator replicas of deploy/ run at their pods' IPs (e2e/tests/activator_support.py), one
workload behind its Service, and a load generator that reaches the Service as kube-proxy does
(e2e/loadgen.py).

- requests, lost, duplicated: 200 concurrent requests (100 streamed) at zero, then 20 cold
  starts of 500 concurrent requests (250 streamed) each: every request must get a complete,
  correct completion (lost: those that did not), and the emulator counts each request id it
  served (duplicated: ids served more than once);
- wake_s: over the 20 cold starts, from the first request held (the time the activator
  records in its annotation, `since`) to the /scale write that woke the workload, as a watch
  of the Deployment sees it (p50, p95); the time from the first request sent, which adds the
  client's and the activator's own queueing under a burst of 500, is printed too. Between
  cold starts the benchmark sets the workload to zero itself and waits for the Service to
  point at the activator again;
- the activator's memory (VmRSS of each replica) after every cold start, over the 10,000
  requests held and released (printed; bench/README.md);
- overhead_ms: the latency the activator adds while it is in the path, at 50 and 500
  concurrent streams: the same streamed completions sent straight to the ready replica and
  through one activator replica, in alternating rounds (side by side on a noisy machine), the
  difference of the completion times' p50 and of their p99;
- through_activator_when_ready: once a replica is ready and the operator took the route out,
  how many of 100 requests sent to the Service pass the activator (its request counters).

Usage: python bench/activator.py [--out FILE] [--cluster-dir DIR]
Without --cluster-dir it starts its own cluster in a temporary directory and stops it.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp
import requests
from hostinfo import machine

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gpusizer.api.annotations import HELD_PREFIX, HeldRecord  # noqa: E402
from gpusizer.timefmt import parse_time  # noqa: E402
from gpusizer.watches import Obj, follow, start  # noqa: E402
from kubernetes import client as k8s  # noqa: E402

from e2e.loadgen import Answer, ServiceEndpoints, send  # noqa: E402
from e2e.tests.activator_support import ActivatorPods, Container, ReplicaWatch  # noqa: E402
from e2e.tests.conftest import Cluster, run_script, wait_until  # noqa: E402
from e2e.tests.operator_support import (  # noqa: E402
    Operator,
    deployment_manifest,
    install_manifests,
    sizing_spec,
)

NAMESPACE = "bench-activator"
COLD_STARTS = 20
PER_COLD_START = 500
ROUNDS = 3  # alternating rounds per path and concurrency


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def burst(
    targets: ServiceEndpoints | list[str], count: int, prefix: str, streamed: int
) -> list[Answer]:
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        return list(
            await asyncio.gather(
                *(
                    send(session, targets, f"{prefix}-{i}", stream=i < streamed, chat=i % 2 == 1)
                    for i in range(count)
                )
            )
        )


class HeldWatch:
    """The `since` of every activator record on the WorkloadSizing, as a watch shows them:
    when each replica's first request held arrived."""

    def __init__(self, cluster: Cluster) -> None:
        self.since: list[float] = []
        self._stop = threading.Event()
        custom = k8s.CustomObjectsApi(cluster.api_client())

        def saw(obj: Obj) -> None:
            for key, raw in (obj["metadata"].get("annotations") or {}).items():
                if key.startswith(HELD_PREFIX):
                    first = parse_time(HeldRecord.model_validate_json(raw).since)
                    if first is not None:
                        self.since.append(first)

        start(
            functools.partial(
                follow,
                "the WorkloadSizing's activator records",
                custom.list_namespaced_custom_object,
                "gpusizer.io",
                "v1alpha1",
                NAMESPACE,
                "workloadsizings",
                field_selector="metadata.name=chat",
                listed=lambda items: [saw(o) for o in items],
                changed=lambda kind, obj: saw(obj) if kind != "DELETED" else None,
                stop=self._stop,
            ),
            "held-records",
        )

    def first_after(self, moment: float) -> float | None:
        after = [t for t in self.since if t >= moment]
        return min(after) if after else None

    def stop(self) -> None:
        self._stop.set()


class Bench:
    def __init__(self, cluster: Cluster, activator: ActivatorPods) -> None:
        self.cluster = cluster
        self.activator = activator
        self.endpoints = ServiceEndpoints(cluster.api_client(), NAMESPACE, "chat", "http")
        self.sent = 0
        self.lost = 0

    def setup(self) -> None:
        self.cluster.kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait")
        requests.delete(f"{self.cluster.gpusim_url}/v1/workloads/{NAMESPACE}", timeout=10)
        self.cluster.kubectl("create", "namespace", NAMESPACE)
        apply = [
            deployment_manifest(
                "chat",
                NAMESPACE,
                replicas=0,
                startup_seconds=2,
                annotations={"gpusim.gpusizer.io/token-seconds": "0.01"},
            ),
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": "chat", "namespace": NAMESPACE},
                "spec": {
                    "selector": {"app": "chat"},
                    "ports": [{"name": "http", "port": 80, "targetPort": 8000}],
                },
            },
            {
                "apiVersion": "gpusizer.io/v1alpha1",
                "kind": "WorkloadSizing",
                "metadata": {"name": "chat", "namespace": NAMESPACE},
                "spec": sizing_spec(
                    "chat",
                    replicas={"min": 0, "max": 1},
                    scaleToZero={
                        "enabled": True,
                        "idleSeconds": 3600,
                        "activator": {"enabled": True},
                    },
                ),
            },
        ]
        for obj in apply:
            self.cluster.kubectl("apply", "-f", "-", stdin=json.dumps(obj))

    def status(self) -> dict[str, Any]:
        obj = self.cluster.kubectl_json("get", "workloadsizing", "chat", "-n", NAMESPACE)
        return dict((obj.get("status") or {}).get("activator") or {})

    def routed_to_activator(self) -> None:
        wait_until(
            lambda: (
                self.endpoints.managers() == {"gpusizer.io"} and len(self.endpoints.ready()) == 2
            ),
            120,
            what="the Service pointed at the two activator replicas",
        )

    def to_zero(self) -> None:
        self.cluster.kubectl("scale", "deployment", "chat", "-n", NAMESPACE, "--replicas=0")
        wait_until(
            lambda: (
                not self.cluster.kubectl_json("get", "pods", "-n", NAMESPACE, "-l", "app=chat")[
                    "items"
                ]
            ),
            120,
            what="no pod left",
        )
        self.routed_to_activator()

    def count(self, answers: list[Answer]) -> None:
        self.sent += len(answers)
        self.lost += sum(not a.ok for a in answers)
        if not all(a.ok for a in answers):
            failed = {a.error.split(":", 1)[0] for a in answers if not a.ok}
            log(f"  {sum(not a.ok for a in answers)} failed: {failed}")

    def cold_start(self, prefix: str, count: int, streamed: int) -> tuple[float, float]:
        """From the first request held, and from the first one sent, to the /scale write."""
        replicas = ReplicaWatch(self.cluster, NAMESPACE, "chat")
        held = HeldWatch(self.cluster)
        try:
            answers = asyncio.run(burst(self.endpoints, count, prefix, streamed))
        finally:
            replicas.stop()
            held.stop()
        self.count(answers)
        sent = min(a.started for a in answers)
        woken = replicas.woken_after(sent)
        first_held = held.first_after(sent)
        if woken is None or first_held is None:
            raise RuntimeError("the workload was not woken by the requests it held")
        return woken - first_held, woken - sent

    def rss_kib(self) -> dict[str, int]:
        found = {}
        for c in self.activator.ready_pods():
            for line in Path(f"/proc/{c.process.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    found[c.pod] = int(line.split()[1])
        return found

    def overhead(self, concurrency: int, one: Container, port: int) -> dict[str, float]:
        """Completion times straight to the replica and through the activator, alternating."""
        pod = self.endpoints.ready()
        assert len(pod) == 1, pod
        times: dict[str, list[float]] = {"direct": [], "activator": []}
        firsts: dict[str, list[float]] = {"direct": [], "activator": []}
        for round_ in range(ROUNDS):
            for path, target in (("direct", pod), ("activator", [f"{one.ip}:{port}"])):
                answers = asyncio.run(
                    burst(target, concurrency, f"o{concurrency}-{path}-{round_}", concurrency)
                )
                self.count(answers)
                times[path] += [(a.ended or 0) - a.started for a in answers if a.ok]
                firsts[path] += [(a.first_byte or 0) - a.started for a in answers if a.ok]
        result = {
            "p50": 1000 * (percentile(times["activator"], 0.5) - percentile(times["direct"], 0.5)),
            "p99": 1000
            * (percentile(times["activator"], 0.99) - percentile(times["direct"], 0.99)),
        }
        log(
            f"  {concurrency} streams: completion p50 direct "
            f"{1000 * percentile(times['direct'], 0.5):.1f} ms, through the activator "
            f"{1000 * percentile(times['activator'], 0.5):.1f} ms; p99 "
            f"{1000 * percentile(times['direct'], 0.99):.1f} / "
            f"{1000 * percentile(times['activator'], 0.99):.1f} ms; first byte p50 "
            f"{1000 * percentile(firsts['direct'], 0.5):.1f} / "
            f"{1000 * percentile(firsts['activator'], 0.5):.1f} ms"
        )
        return {k: round(v, 2) for k, v in result.items()}

    def activator_requests(self) -> float:
        return sum(
            self.activator.metric(c, "gpusizer_activator_requests_total", namespace=NAMESPACE)
            for c in self.activator.ready_pods()
        )

    def duplicated(self) -> int:
        described = requests.get(
            f"{self.cluster.gpusim_url}/v1/workloads/{NAMESPACE}/chat", timeout=10
        ).json()
        return len(described["httpDuplicates"])


def run(cluster: Cluster, workdir: Path) -> dict[str, Any]:
    install_manifests(cluster)
    operator = Operator(cluster, workdir, sync_period=15.0)  # the operator's defaults
    operator.start()
    activator = ActivatorPods(cluster, workdir)
    activator.install()
    try:
        activator.wait_ready(2)
        bench = Bench(cluster, activator)
        bench.setup()
        bench.routed_to_activator()
        log("200 concurrent requests (100 streamed) at zero")
        held, sent = bench.cold_start("burst", 200, 100)
        log(f"  woken {held:.3f} s after the first request held ({sent:.3f} s after it was sent)")
        wakes, from_sent = [], []
        for n in range(COLD_STARTS):
            bench.to_zero()
            held, sent = bench.cold_start(f"cold{n}", PER_COLD_START, PER_COLD_START // 2)
            wakes.append(held)
            from_sent.append(sent)
            log(
                f"cold start {n + 1}/{COLD_STARTS}: woken {held:.3f} s after the first request "
                f"held ({sent:.3f} s after it was sent); activator VmRSS KiB {bench.rss_kib()}"
            )
        log(
            f"from the first request sent: p50 {statistics.median(from_sent):.3f} s, "
            f"p95 {percentile(from_sent, 0.95):.3f} s"
        )
        wait_until(
            lambda: (
                bench.status().get("routing") == "Direct"
                and bench.endpoints.managers() == {"endpointslice-controller.k8s.io"}
            ),
            120,
            what="the route taken out",
        )
        port = int(bench.status()["port"])
        one = activator.ready_pods()[0]
        overhead = {str(c): bench.overhead(c, one, port) for c in (50, 500)}
        before = bench.activator_requests()
        through = asyncio.run(burst(bench.endpoints, 100, "ready", 50))
        bench.count(through)
        passed = bench.activator_requests() - before
        return {
            "machine": machine(),
            "wake_s": {
                "p50": round(statistics.median(wakes), 3),
                "p95": round(percentile(wakes, 0.95), 3),
            },
            "requests": bench.sent,
            "lost": bench.lost,
            "duplicated": bench.duplicated(),
            "overhead_ms": overhead,
            "through_activator_when_ready": int(passed),
        }
    finally:
        activator.uninstall()
        operator.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", help="write the results as JSON to this file")
    p.add_argument("--cluster-dir", help="use (start if needed, never stop) this cluster state dir")
    args = p.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="gpusizer-bench-activator-"))
    state_dir = Path(args.cluster_dir).resolve() if args.cluster_dir else workdir / "cluster"
    log(f"starting the cluster in {state_dir}")
    up = run_script("cluster-up.sh", state_dir, GPUSIZER_GPUSIM="1")
    if up.returncode != 0:
        print(up.stdout, up.stderr, file=sys.stderr)
        return 1
    try:
        result = run(Cluster.from_state_dir(state_dir), workdir)
    finally:
        if not args.cluster_dir:
            run_script("cluster-down.sh", state_dir)
    print(json.dumps(result, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
