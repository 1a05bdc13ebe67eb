"""What reading the savings ledger back costs a Prometheus that holds a week of the operator's
series: the twelve queries of `signals.queries.ledger_queries` (24 h and 7 d) over N workloads.

It writes a week of every ledger series of N workloads (the counters and gauges the operator
exports per workload, one sample per `--scrape` seconds, as the chart's ServiceMonitor scrapes),
backfills them with `promtool tsdb create-blocks-from openmetrics`, starts a real Prometheus on
those blocks, and asks each ledger query `--rounds` times (the windows interleaved) with
`stats=all`: Prometheus's evaluation time (median) and the samples it read. A query reads every
sample of each workload's series in its window, so both grow with the fleet: it prints them
scaled to `--fleet` workloads too, and the Prometheus cores that costs at a read every minute
(the right-sizing period) and every ten minutes (`OperatorSettings.ledger_period_seconds`).

Usage: python bench/ledger_cost.py [--workloads 20] [--scrape 30] [--rounds 5] [--fleet 10000]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO

import requests
from hostinfo import machine

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gpusizer.ledger import WINDOWS  # noqa: E402
from gpusizer.report.metrics import HELD_COUNTERS, HELD_GAUGES  # noqa: E402
from gpusizer.signals.queries import ledger_queries  # noqa: E402

from tests.support import start_prometheus, wait_for_prometheus  # noqa: E402

END = 1_764_979_200  # a fixed end, so that the blocks and the answers do not depend on the clock
SPAN = max(WINDOWS.values())


def write_series(out: IO[str], workloads: int, scrape: int) -> None:
    """A week of every series the operator exports for the ledger (`report.metrics`), for
    `workloads` workloads, one sample per `scrape` s."""
    times = range(END - SPAN, END, scrape)
    kinds = [*((c, "counter") for c in HELD_COUNTERS), *((g, "gauge") for g in HELD_GAUGES)]
    for metric, kind in kinds:
        out.write(f"# TYPE {metric} {kind}\n")
        exposed = f"{metric}_total" if kind == "counter" else metric
        for w in range(workloads):
            labels = f'{{namespace="bench",name="w{w:05d}"}}'
            for t in times:
                value = (t - times.start) * 0.5 if kind == "counter" else 1 + (t // 3600 + w) % 3
                out.write(f"{exposed}{labels} {value} {t}\n")
    out.write("# EOF\n")


def measure(url: str, workloads: int, rounds: int) -> dict[str, dict[str, float]]:
    """Per window: the evaluation seconds (the median of `rounds`, summed over its queries)
    and the samples its queries read."""
    timings: dict[tuple[str, str], list[float]] = {}
    samples: dict[tuple[str, str], int] = {}
    at = END - 1
    for _ in range(rounds):
        for window, seconds in WINDOWS.items():
            for name, promql in ledger_queries(seconds).items():
                answer = requests.get(
                    f"{url}/api/v1/query",
                    params={"query": promql, "time": str(at), "stats": "all"},
                    timeout=600,
                ).json()
                if answer["status"] != "success" or len(answer["data"]["result"]) != workloads:
                    raise RuntimeError(f"{window}/{name}: {json.dumps(answer)[:500]}")
                stats = answer["data"]["stats"]
                timings.setdefault((window, name), []).append(stats["timings"]["evalTotalTime"])
                samples[(window, name)] = stats["samples"]["totalQueryableSamples"]
    return {
        window: {
            "eval_s": sum(statistics.median(t) for (w, _), t in timings.items() if w == window),
            "samples": sum(n for (w, _), n in samples.items() if w == window),
        }
        for window in WINDOWS
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--workloads", type=int, default=20, help="workloads whose series are written")
    p.add_argument("--scrape", type=int, default=30, help="seconds between samples (chart: 30)")
    p.add_argument("--rounds", type=int, default=5, help="times each query is asked")
    p.add_argument("--fleet", type=int, default=10000, help="workloads to scale the figures to")
    args = p.parse_args()
    prometheus, promtool = shutil.which("prometheus"), shutil.which("promtool")
    if prometheus is None or promtool is None:
        print("prometheus and promtool are needed: make prometheus", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="gpusizer-ledger-") as tmp:
        workdir = Path(tmp)
        data = workdir / "series.om"
        with data.open("w") as out:
            write_series(out, args.workloads, args.scrape)
        blocks = [promtool, "tsdb", "create-blocks-from", "openmetrics", str(data)]
        subprocess.run(
            [*blocks, str(workdir / "data")],
            check=True,
            capture_output=True,
        )
        data.unlink()
        (workdir / "prometheus.yml").write_text("global:\n  scrape_interval: 1h\n")
        proc, port = start_prometheus(prometheus, workdir, "--storage.tsdb.retention.time=3650d")
        try:
            url = f"http://127.0.0.1:{port}"
            wait_for_prometheus(proc, url, 120)
            found = measure(url, args.workloads, args.rounds)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    scale = args.fleet / args.workloads
    per_read = sum(w["eval_s"] for w in found.values()) * scale
    print(json.dumps({"machine": machine(), "workloads": args.workloads, "windows": found}))
    for window, figures in found.items():
        seconds, samples = figures["eval_s"], figures["samples"]
        print(
            f"{window}: {seconds:.3f} s of evaluation, {samples:,} samples for {args.workloads} "
            f"workloads; at {args.fleet:,}: {seconds * scale:.1f} s, {samples * scale:,.0f} samples"
        )
    print(
        f"a ledger read at {args.fleet:,} workloads: {per_read:.1f} s of evaluation; "
        f"{per_read / 60:.2f} Prometheus cores read every minute, "
        f"{per_read / 600:.2f} every ten minutes"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
