"""A restart on a kept fleet: one operator started on the workloads `bench/scale.py` left in a
cluster (`--cluster-dir`), each tree in turn, one after the other on the same fleet.

For each start: seconds until its first decision and until it has decided every WorkloadSizing
(from its gpusizer_reconcile_duration_seconds_count), its RSS (VmRSS) at its first decision
(what the start's listing and indexing left), its peak RSS (VmHWM), and its RSS `--after`
seconds after the last of those decisions. The operator runs as in
`bench/scale.py` (5 s sync, Prometheus scraping its /metrics every 30 s). An operator that has
not decided every workload within `--timeout` seconds is stopped and reported as such. With
`--census FILE.json`, each start's heap census (bench/heap_census) is taken after that RSS, to
FILE's stem.<start>.json.

Usage: python bench/restart.py --cluster-dir DIR --operator-path A [--operator-path B]
       [--rounds 1] [--after 60] [--out FILE] [--census FILE.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from hostinfo import machine
from scale import (  # puts the repo on the path
    NAMESPACE,
    REPO,
    own_decisions,
    rss_mib,
    scrape,
    take_census,
)

from e2e.tests.conftest import Cluster
from e2e.tests.operator_support import Operator


def workloads(cluster: Cluster) -> int:
    names = cluster.kubectl("get", "workloadsizings", "-n", NAMESPACE, "-o", "name").stdout
    return len(names.split())


def restart(
    cluster: Cluster,
    tree: Path,
    size: int,
    after: float,
    timeout: float,
    census: tuple[Path, int] | None,
) -> dict[str, Any]:
    """One start of the operator from `tree`; `census`: the census's file, and which start."""
    paths = [str(tree), *([str(REPO / "bench" / "heap_census")] if census else [])]
    os.environ["PYTHONPATH"] = os.pathsep.join(paths)
    operator = Operator(
        cluster,
        Path(tempfile.mkdtemp(prefix="gpusizer-restart-")),
        sync_period=5.0,
        scrape=True,
        scrape_interval="30s",
        extra_args=["--prometheus-timeout", "10"],
    )
    started = time.monotonic()
    operator.start()
    assert operator.process is not None
    pid = operator.process.pid
    first: float | None = None
    rss_first: float | None = None
    every: float | None = None
    try:
        while time.monotonic() - started < timeout:
            decisions = own_decisions(scrape(operator.metrics_port))
            now = time.monotonic() - started
            if first is None and decisions > 0:
                first, rss_first = now, rss_mib(pid, "VmRSS")
            if decisions >= size:
                every = now
                break
            time.sleep(1.0)
        if every is not None:
            time.sleep(after)
        result = {
            "tree": str(tree),
            "workloads": size,
            "first_decision_s": first,
            "every_decision_s": every,
            "rss_first_decision_mib": rss_first,
            "rss_peak_mib": rss_mib(pid, "VmHWM"),
            "rss_after_mib": rss_mib(pid, "VmRSS") if every is not None else None,
        }
        if census:
            result["census"] = take_census(pid, *census)
        return result
    finally:
        operator.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--cluster-dir", required=True, help="a cluster bench/scale.py filled")
    p.add_argument(
        "--operator-path",
        action="append",
        required=True,
        help="import gpusizer from this directory (a worktree's operator/); repeat to compare",
    )
    p.add_argument("--rounds", type=int, default=1, help="starts of each tree, in turn")
    p.add_argument("--after", type=float, default=60.0, help="seconds to the RSS after")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds to decide every one")
    p.add_argument("--out", help="write the results as JSON to this file")
    p.add_argument("--census", help="each start's heap census to FILE (.json: FILE's stem.N.json)")
    args = p.parse_args()
    if args.census:
        os.environ["GPUSIZER_HEAP_CENSUS"] = str(Path(args.census).resolve())

    cluster = Cluster.from_state_dir(Path(args.cluster_dir).resolve())
    size = workloads(cluster)
    results = []
    for _ in range(args.rounds):
        for tree in args.operator_path:
            census = (Path(args.census).resolve(), len(results) + 1) if args.census else None
            result = restart(cluster, Path(tree).resolve(), size, args.after, args.timeout, census)
            print(json.dumps(result), flush=True)
            results.append(result)
            if args.out:
                Path(args.out).write_text(
                    json.dumps({"machine": machine(), "starts": results}, indent=2) + "\n"
                )
    print(f"\nmachine: {json.dumps(machine())}")
    print(
        "| tree | workloads | first decision s | every decision s "
        "| RSS at the first, peak, after MiB |"
    )
    print("|---|---|---|---|---|")
    for r in results:
        every = "not in time" if r["every_decision_s"] is None else f"{r['every_decision_s']:.0f}"
        after = "" if r["rss_after_mib"] is None else f"{r['rss_after_mib']:.0f}"
        first, at_first = "none", ""
        if r["first_decision_s"] is not None:
            first = f"{r['first_decision_s']:.0f}"
            at_first = f"{r['rss_first_decision_mib']:.0f}"
        print(
            f"| {r['tree']} | {r['workloads']} | {first} | {every} "
            f"| {at_first}, {r['rss_peak_mib']:.0f}, {after} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
