"""What one Prometheus scrape of the operator's /metrics costs at N workloads, without a cluster.

Every workload exports about 35 series (replicas, decisions, conditions, efficiency, what its
pods held, the ledger), so at 10,000 workloads a scrape is some 350,000 lines, rendered by the
Python process that also decides every workload. This fills the operator's per-workload
collector with N workloads as a running operator has them, then asks the operator's metrics
app for /metrics as Prometheus 2.42 does (OpenMetrics preferred, gzip) and prints the CPU
seconds of the answer, its size and the size of the text (medians of --repeat), how much a
scrape allocates at its peak (tracemalloc, one more scrape after the timed ones), and how far
the scrapes raised the process's peak RSS above what the filled collector holds (`VmHWM`).

Usage: python bench/operator_metrics.py [--sizes 1000,5000,10000] [--repeat 3]
                                        [--operator-path DIR]
`--operator-path` imports gpusizer from DIR (a `git archive` of another tree's operator/);
before the operator served its own app (report/scrape.py) it was prometheus_client's
`make_wsgi_app`, which this uses for such a tree. Each size runs in a fresh process.
"""

from __future__ import annotations

import argparse
import gzip
import json
import platform
import random
import statistics
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

from hostinfo import cpu_model

REPO = Path(__file__).resolve().parents[1]
# Prometheus 2.42's Accept header with its default scrape protocols
ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
    "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


def measure(size: int, repeat: int, operator: Path) -> dict[str, Any]:
    sys.path.insert(0, str(operator))
    from gpusizer.api.v1alpha1 import Condition
    from gpusizer.report import metrics
    from prometheus_client import disable_created_metrics, make_wsgi_app

    assert Path(metrics.__file__).resolve().is_relative_to(operator.resolve()), metrics.__file__
    disable_created_metrics()  # as the operator runs
    try:
        from gpusizer.report import scrape

        app, served_by = scrape.app, "gpusizer.report.scrape"
    except ImportError:
        app, served_by = make_wsgi_app(), "prometheus_client.make_wsgi_app"
    fill(metrics, Condition, size)
    environ = {
        "REQUEST_METHOD": "GET",
        "PATH_INFO": "/metrics",
        "QUERY_STRING": "",
        "HTTP_ACCEPT": ACCEPT,
        "HTTP_ACCEPT_ENCODING": "gzip",
    }
    headers: dict[str, str] = {}
    cpu, sent = [], b""
    filled = peak_rss_kib()
    for _ in range(repeat):
        started = time.process_time()
        sent = b"".join(app(environ, lambda status, h: headers.update(h)))
        cpu.append(time.process_time() - started)
    raised = peak_rss_kib() - filled
    tracemalloc.start()
    for _ in app(environ, lambda status, h: None):
        pass
    allocated = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return {
        "size": size,
        "served_by": served_by,
        "content_type": headers.get("Content-Type", ""),
        "cpu_s": round(statistics.median(cpu), 3),
        "gzip_mib": round(len(sent) / 2**20, 2),
        "text_mib": round(len(gzip.decompress(sent)) / 2**20, 1),
        "allocated_mib": round(allocated / 2**20, 1),
        "peak_rss_raised_mib": round(raised / 1024, 1),
    }


def peak_rss_kib() -> int:
    """This process's peak resident set (`VmHWM`), KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise RuntimeError("no VmHWM in /proc/self/status")


def fill(metrics: Any, condition: Any, size: int) -> None:
    """Each workload with what a decided one exports: two decision reasons, a scale write, four
    conditions, every efficiency and held gauge, every held counter, the ledger of two
    windows."""
    rng = random.Random(size)
    types = ("Ready", "MetricsAvailable", "TargetFound", "RightSized")
    conditions = [
        condition(
            type=t, status="True", reason="Decided", last_transition_time="2027-01-01T00:00:00Z"
        )
        for t in types
    ]
    gauges = [*metrics.EFFICIENCY_GAUGES, *metrics.HELD_GAUGES]
    ledger = [
        (f, w, b) for f in metrics.LEDGER_GAUGES for w in ("24h", "7d") for b in ("used", "static")
    ]
    for i in range(size):
        ns, name = f"team-{i % 50:02d}", f"model-{i:05d}"
        metrics.WORKLOADS.decided(ns, name, "ScaleUp", 3, 2, True)
        metrics.WORKLOADS.decided(ns, name, "WithinTolerance", 3, 3, True)
        metrics.WORKLOADS.scale_written(ns, name, "ok")
        metrics.WORKLOADS.set_conditions(ns, name, conditions)
        metrics.WORKLOADS.gauges(ns, name, {g: rng.random() * 100 for g in gauges})
        metrics.WORKLOADS.account(ns, name, {c: rng.random() * 1e6 for c in metrics.HELD_COUNTERS})
        metrics.WORKLOADS.ledger(ns, name, {key: rng.random() * 100 for key in ledger})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,5000,10000")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--operator-path", type=Path, default=REPO / "operator")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a size, in this process
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one, args.repeat, args.operator_path)))
        return
    print(f"{cpu_model()}, Python {platform.python_version()}; operator {args.operator_path}")
    print(
        f"{'workloads':>9} {'served by':<32} {'CPU s':>6} {'gzip MiB':>8} {'text MiB':>8} "
        f"{'alloc MiB':>9} {'RSS+ MiB':>8}  type"
    )
    for size in (int(s) for s in args.sizes.split(",")):
        one = [sys.executable, __file__, "--one", str(size), "--repeat", str(args.repeat)]
        out = subprocess.run(
            [*one, "--operator-path", str(args.operator_path)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        row = json.loads(out)
        print(
            f"{size:>9} {row['served_by']:<32} {row['cpu_s']:>6.2f} {row['gzip_mib']:>8.2f} "
            f"{row['text_mib']:>8.1f} {row['allocated_mib']:>9.1f} "
            f"{row['peak_rss_raised_mib']:>8.1f}  {row['content_type']}"
        )


if __name__ == "__main__":
    main()
