"""What one turn of a quiet workload costs the operator's CPU, without a cluster.

At 10,000 workloads the operator takes some 600 turns a second of workloads whose readings do
not move (one per quiet wait each), and those turns were over half of its CPU in the scale
bench's profiles (bench/README.md, "Issue 29"). This runs one such turn again and again through
`gpusizer.reconcile.reconcile` with the in-memory ports of the unit tests (tests/fakes.py): an
Auto workload of two whole H100s at its target utilisation, right-sizing off, its efficiency
figures measured over the window, its status patch merged back into its status as the API
server would, and prints the CPU microseconds a turn (the median of --rounds rounds of --turns
turns) and whether the turns came out quiet.

Usage: python bench/turn_cost.py [--turns 2000] [--rounds 5] [--operator-path DIR]
`--operator-path` imports gpusizer from DIR (a `git archive` of another tree's operator/) to
compare trees side by side; the fakes and the turn's inputs come from this tree's tests.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from hostinfo import cpu_model

REPO = Path(__file__).resolve().parent.parent


async def rounds(turns: int, count: int) -> tuple[list[float], int]:
    """CPU seconds a turn in each of `count` rounds, and how many of the last round's turns
    were quiet."""
    fakes = importlib.import_module("tests.fakes")
    cases = importlib.import_module("tests.unit.test_reconcile")
    cluster_module = importlib.import_module("gpusizer.cluster")
    clock = importlib.import_module("gpusizer.clock")
    memory_module = importlib.import_module("gpusizer.memory")
    parse = importlib.import_module("gpusizer.signals.parse")
    queries = importlib.import_module("gpusizer.signals.queries")
    reconcile = importlib.import_module("gpusizer.reconcile").reconcile
    # a merge patch applied as the API server applies one to the status
    merge_patch = importlib.import_module("gpusizer.catalog.loader").deep_merge

    pods = [cases.pod("chat-0"), cases.pod("chat-1")]

    def each(value: float) -> Any:
        return parse.PodSamples({(cases.NS, p.name): parse.Sample(value, 5) for p in pods})

    window = {
        "utilization": each(70),
        "requests": each(3_600),
        "output_tokens": each(360_000),
        "prompt_tokens": each(720_000),
        queries.ENERGY: each(3_600 * 400 * 1_000),
        queries.POWER: each(400),
        "peak_memory": each(20_000),
    }
    stored = {(cases.NS, "chat"): cases.target()}
    targets = fakes.FakeTargets(stored)
    services = fakes.services(fakes.FakeMetrics(answers=window), targets, now=cases.NOW)
    cluster = cluster_module.ClusterView(
        {cases.NS: pods}, {cases.NODE.name: cases.NODE}, targets={"Deployment": dict(stored)}
    )
    cycle = clock.Cycle(cases.snapshot(70.0, pods), autoscalers={}, error=None)
    memory = memory_module.Memory()
    status: dict[str, Any] = {}
    now = cases.NOW
    spent: list[float] = []
    quiet = 0
    for _ in range(count + 1):  # the first round settles the status and warms the caches
        quiet = 0
        started = time.process_time()
        for _ in range(turns):
            now += 0.01
            workload = fakes.workload(cases.spec(), status)
            outcome = await reconcile(workload, cluster, cycle, services, memory, now)
            status = merge_patch(status, outcome.status_patch)
            quiet += outcome.quiet
        spent.append((time.process_time() - started) / turns)
    return spent[1:], quiet


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--operator-path", default=str(REPO / "operator"))
    args = parser.parse_args()
    sys.path[:0] = [args.operator_path, str(REPO)]
    gpusizer = importlib.import_module("gpusizer")
    assert Path(gpusizer.__file__).resolve().is_relative_to(Path(args.operator_path).resolve())
    spent, quiet = asyncio.run(rounds(args.turns, args.rounds))
    print(f"{cpu_model()}, Python {platform.python_version()}; operator {args.operator_path}")
    print(
        f"{statistics.median(spent) * 1e6:.0f} us of CPU a turn (median of {args.rounds} rounds "
        f"of {args.turns}; range {min(spent) * 1e6:.0f}-{max(spent) * 1e6:.0f}); "
        f"{quiet} of the last round's turns quiet"
    )


if __name__ == "__main__":
    main()
