"""Decision quality: every shared trace replayed through gpusizer, HPA, KEDA, static and the
offline optimum, with the parameters documented in bench/README.md.

    python bench/decision_quality.py [--traces-dir ../shared/traces] [--quiet]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

from gpusizer.sim import POLICIES
from gpusizer.sim.fleet import FleetParams
from gpusizer.sim.output import table
from gpusizer.sim.replay import (
    Result,
    capacity_for_peak,
    default_tick,
    load_spec,
    replay,
)
from gpusizer.sim.trace import load_trace
from hostinfo import cpu_model

REPO = Path(__file__).resolve().parents[1]
PEAK_REPLICAS = 8
STARTUP_SECONDS = 120.0
SLO_WAIT_SECONDS = 5.0
DROP_AFTER_SECONDS = 60.0
# The Mooncake trace's arrivals are quantised to about 3 s (traces/README.md): finer bins
# would replay a sawtooth that is not in the load.
BIN_SECONDS = {"mooncake-conversation": 3.0}


def summary(all_results: dict[str, dict[str, Result]]) -> str:
    """One line per trace: each policy's GPU-hours vs the optimum and SLO attainment."""
    header = ["trace"] + [p for p in POLICIES]
    rows = [header]
    for trace, results in all_results.items():
        cells = [trace]
        for name in POLICIES:
            r = results[name]
            cells.append(f"{r.vs_optimal or 0:.2f}x {100 * r.slo_attainment:6.2f}%")
        rows.append(cells)
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--traces-dir", type=Path, default=REPO.parent / "shared" / "traces")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    args = parser.parse_args()
    traces = sorted([*args.traces_dir.glob("*.csv"), *args.traces_dir.glob("*.json")])
    if not traces:
        print(f"no traces in {args.traces_dir}", file=sys.stderr)
        return 1
    spec = load_spec(None)
    quiet = args.quiet or not sys.stderr.isatty()
    started = time.perf_counter()
    print(f"machine: {cpu_model()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print(
        f"parameters: peak minute needs {PEAK_REPLICAS} replicas, start-up {STARTUP_SECONDS:g} s, "
        f"SLO wait {SLO_WAIT_SECONDS:g} s, drop after {DROP_AFTER_SECONDS:g} s, "
        "gpusizer with the simulator's default spec (docs/simulate.md)\n"
    )
    all_results: dict[str, dict[str, Result]] = {}
    for path in traces:
        trace = load_trace(path)
        if trace.name in BIN_SECONDS:
            trace = trace.rebinned(BIN_SECONDS[trace.name])
        capacity = capacity_for_peak(trace, PEAK_REPLICAS)
        params = FleetParams(
            capacity_rps=capacity,
            startup_seconds=STARTUP_SECONDS,
            slo_wait_seconds=SLO_WAIT_SECONDS,
            drop_after_seconds=DROP_AFTER_SECONDS,
            tick_seconds=default_tick(trace),
        )
        results = replay(trace, params, spec, POLICIES, quiet=quiet)
        all_results[trace.name] = results
        title = (
            f"{trace.name}: {trace.total:,.0f} requests over {trace.duration / 3600:.1f} h, "
            f"bin {trace.bin_seconds:g} s, capacity {capacity:.3f} req/s per replica"
        )
        print(table(results, title=title) + "\n", flush=True)
    print("GPU-hours vs the optimum, and share of requests served within the SLO:")
    print(summary(all_results))
    print(f"\nwall time: {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
