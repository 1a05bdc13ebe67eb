"""A replica's memory across kopf peering pauses and resumes, without any other fault.

The soak judges the RSS of whichever replica is in charge, and each replica there takes charge
by a resume. This runs the soak's 200 workloads (`e2e/soak`, its cluster and peering) under one
replica, then writes a live peer of higher priority into the ClusterKopfPeering and takes it
out again, `--cycles` times: kopf pauses the replica (stopping its watches and timers) and
resumes it (relisting every watched kind). It prints the
replica's RSS after each pause and each resume as JSON lines; `--no-pause` does the same waits
without the peer, as the control.

Usage: python bench/peering_churn.py [--cycles 12] [--paused 15] [--resumed 30] [--no-pause]
"""

from __future__ import annotations

import argparse
import datetime
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from hostinfo import machine
from scale import rss_mib

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kubernetes import client as k8s  # noqa: E402

from e2e.soak.__main__ import (  # noqa: E402
    NAMESPACE,
    PEERING,
    SYNC_SECONDS,
    apply_all,
    decided,
    deployment,
    hpa,
    peering_objects,
    plan,
    ready_count,
    replay,
    sizing,
    soak_cluster,
)
from e2e.tests.conftest import wait_until  # noqa: E402
from e2e.tests.fault_support import lease_args  # noqa: E402
from e2e.tests.operator_support import Operator  # noqa: E402

FAKE_PEER = "bench-peering-churn"


def rss_now(op: Operator) -> float:
    assert op.process is not None
    return rss_mib(op.process.pid, "VmRSS")


def set_peer(custom: k8s.CustomObjectsApi, present: bool) -> None:
    """A live peer of the highest priority in the peering's status (kopf keeps its peers
    there, with no status subresource), or none."""
    now = datetime.datetime.now(datetime.UTC).isoformat()
    peer = {"priority": 2**62, "lastseen": now, "lifetime": 600} if present else None
    body = {"status": {FAKE_PEER: peer}}
    custom.patch_cluster_custom_object("kopf.dev", "v1", "clusterkopfpeerings", PEERING, body)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cycles", type=int, default=12)
    p.add_argument("--paused", type=float, default=15.0, help="seconds paused in each cycle")
    p.add_argument("--resumed", type=float, default=30.0, help="seconds resumed in each cycle")
    p.add_argument("--no-pause", action="store_true", help="the control: the same waits, no peer")
    p.add_argument("--seed", type=int, default=7, help="the soak's plan of workloads")
    args = p.parse_args()
    started = time.time()

    def say(**fields: Any) -> None:
        print(json.dumps({"t": round(time.time() - started, 1), **fields}), flush=True)

    say(machine=machine(), args=vars(args))
    traces = sorted((REPO.parent / "shared" / "traces").glob("*.csv"))
    workloads = plan(200, traces, random.Random(args.seed))
    cluster_args = argparse.Namespace(cluster_dir=None, keep=False)
    with soak_cluster(cluster_args) as cluster, peering_objects(cluster):
        api = cluster.api_client()
        apps, custom = k8s.AppsV1Api(api), k8s.CustomObjectsApi(api)
        cluster.kubectl("create", "namespace", NAMESPACE, check=False)
        apply_all(cluster, [deployment(w) for w in workloads])
        apply_all(cluster, [hpa(w) for w in workloads if w.kind == "hpa"])
        wait_until(
            lambda: ready_count(apps) >= len(workloads), 600, interval=5, what="every workload"
        )
        for w in workloads:
            replay(cluster, w)
        op = Operator(
            cluster,
            Path(tempfile.mkdtemp(prefix="peering-churn-")),
            name="replica-a",
            sync_period=SYNC_SECONDS,
            extra_args=[*lease_args(PEERING), "--rightsizing-period", "30"],
        )
        op.start()
        try:
            apply_all(cluster, [sizing(w) for w in workloads])
            wait_until(
                lambda: decided(custom) >= len(workloads), 300, interval=5, what="every decided"
            )
            say(phase="decided", rss_mib=rss_now(op), log=str(op.logs[-1]))
            time.sleep(60)
            say(phase="warm", rss_mib=rss_now(op))
            for cycle in range(args.cycles):
                if not args.no_pause:
                    set_peer(custom, present=True)
                time.sleep(args.paused)
                say(phase="paused", cycle=cycle, rss_mib=rss_now(op))
                if not args.no_pause:
                    set_peer(custom, present=False)
                time.sleep(args.resumed)
                say(phase="resumed", cycle=cycle, rss_mib=rss_now(op))
        finally:
            op.stop()
        text = op.logs[-1].read_text(errors="replace")
        say(phase="end", resumes=text.count("Resuming operations"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
