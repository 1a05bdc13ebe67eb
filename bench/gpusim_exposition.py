"""Microbenchmark of the GPU emulator's /metrics and tick at N emulated GPUs, without a cluster.

Prometheus scrapes the emulator every 5 s with a 4 s timeout; at 5,000 GPUs one Python process
must render every series in time while it also ticks. This builds a Simulator over an in-memory
cluster (whole H100s, 64 per node like bench/nodepools-scale.yaml, one single-GPU workload per
pod, every replica Ready, all loaded or, with --loaded, a share of them), serves it with the
real GpusimServer on a free port, and measures (medians of --repeat runs):

- tick: what the tick thread does per tick, pod allocation already done: one
  `Simulator.step()`, plus the render of /metrics where the server renders it once per tick
  (a `GpusimServer.exposition`); before that, each scrape rendered it;
- scrape: one `GET /metrics` over HTTP, the emulator idle;
- scrape+tick: `GET /metrics` while another thread ticks back to back (the worst case for the
  GIL and the simulator's lock), median and max.

Usage: python bench/gpusim_exposition.py [--sizes 100,1000,5000] [--repeat 5] [--loaded 1]
    [--baseline REV]
--loaded 0.003 loads 30 workloads in 10,000, as the scale benchmark's latency samples do: the
rest stay idle, and read the same from tick to tick.
With --baseline REV it also runs the same measurements on REV's e2e/ (exported with
`git archive` to a temporary directory, in a subprocess) and prints both side by side.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from hostinfo import cpu_model

REPO = Path(__file__).resolve().parents[1]
GPUS_PER_NODE = 64


def measure(n: int, repeat: int, tree: Path, loaded: float = 1.0) -> dict[str, float]:
    """Figures for n GPUs and n pods, with the e2e package found first on sys.path."""
    from gpusizer.catalog import load_catalog

    import e2e
    from e2e.gpusim.exposition import ExporterOptions
    from e2e.gpusim.model import ModelConfig
    from e2e.gpusim.server import GpusimServer
    from e2e.gpusim.sim import Simulator
    from e2e.gpusim.testing import FakeClusterSource, gpu_node, gpu_pod

    assert Path(e2e.__file__).resolve().is_relative_to(tree), (e2e.__file__, tree)
    catalog = load_catalog()
    source = FakeClusterSource()
    nodes = math.ceil(n / GPUS_PER_NODE)
    for i in range(nodes):
        name = f"gpu-{i:03d}"
        source.nodes[name] = gpu_node(catalog, name, "h100-80gb", GPUS_PER_NODE)
    for i in range(n):
        source.add_pod(gpu_pod(f"w{i}-0", f"gpu-{i // GPUS_PER_NODE:03d}", workload=f"w{i}"))
    now = [0.0]
    sim = Simulator(source, catalog, ModelConfig(startup_seconds=0), clock=lambda: now[0])
    for i in range(math.ceil(n * loaded)):
        sim.set_load(("llm", f"w{i}"), 1.0 + (i % 17) * 0.7)  # 10-130 % of a replica
    started = time.perf_counter()
    sim.step()  # allocates every pod's GPU
    first_tick = time.perf_counter() - started

    server = GpusimServer(("127.0.0.1", 0), sim, ExporterOptions())
    # The tick thread's work after each step, where /metrics is rendered per tick (see `tick`).
    exposition = getattr(server, "exposition", None)
    then = exposition.body if exposition is not None else lambda: None

    def tick() -> float:
        now[0] += 1.0
        begin = time.perf_counter()
        sim.step()
        then()
        return time.perf_counter() - begin

    ticks = [tick() for _ in range(repeat)]
    server.serve_in_thread()
    url = f"http://127.0.0.1:{server.server_address[1]}/metrics"

    def scrape() -> tuple[float, int]:
        begin = time.perf_counter()
        with urllib.request.urlopen(url, timeout=60) as response:
            size = len(response.read())
        return time.perf_counter() - begin, size

    try:
        idle = [scrape() for _ in range(repeat)]
        stop = threading.Event()

        def ticking() -> None:
            while not stop.is_set():
                tick()

        ticker = threading.Thread(target=ticking, daemon=True)
        ticker.start()
        busy = [scrape()[0] for _ in range(repeat * 2)]
        stop.set()
        ticker.join()
    finally:
        server.shutdown()
        server.server_close()
    return {
        "gpus": nodes * GPUS_PER_NODE,
        "pods": n,
        "bytes": idle[0][1],
        "first_tick_s": first_tick,
        "tick_s": statistics.median(ticks),
        "scrape_s": statistics.median(t for t, _ in idle),
        "scrape_ticking_s": statistics.median(busy),
        "scrape_ticking_max_s": max(busy),
    }


COLUMNS = [
    ("first_tick_s", "1st tick"),
    ("tick_s", "tick"),
    ("scrape_s", "scrape"),
    ("scrape_ticking_s", "scrape+tick"),
    ("scrape_ticking_max_s", "max"),
]


def table(results: dict[str, list[dict[str, float]]]) -> str:
    labels = list(results)
    head = f"{'pods':>6} {'gpus':>6} {'MB':>6}  " + "  ".join(
        f"{title + ' ' + label:>{max(12, len(title) + len(label) + 1)}}"
        for _, title in COLUMNS
        for label in labels
    )
    lines = [head, "-" * len(head)]
    for row in zip(*results.values(), strict=True):
        first = row[0]
        cells = "  ".join(
            f"{entry[key]:>{max(12, len(title) + len(label) + 1)}.3f}"
            for key, title in COLUMNS
            for label, entry in zip(labels, row, strict=True)
        )
        lines.append(
            f"{first['pods']:>6.0f} {first['gpus']:>6.0f} {first['bytes'] / 1e6:>6.2f}  " + cells
        )
    return "\n".join(lines)


def run_baseline(rev: str, sizes: str, repeat: int, loaded: float) -> list[dict[str, float]]:
    """The same figures on REV's emulator, in a subprocess that imports only REV's e2e/."""
    with tempfile.TemporaryDirectory(prefix="gpusim-baseline-") as tree:
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", rev, "e2e"], check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
        command = [sys.executable, __file__, "--sizes", sizes, "--repeat", str(repeat)]
        command += ["--loaded", str(loaded)]
        out = subprocess.run(
            [*command, "--json", "--tree", tree],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    result: list[dict[str, float]] = json.loads(out)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100,1000,5000")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--loaded", type=float, default=1.0, help="share of workloads with load")
    parser.add_argument("--baseline", metavar="REV", help="also measure REV's e2e/gpusim")
    parser.add_argument("--tree", type=Path, default=REPO, help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.path.insert(0, str(args.tree))
    sizes = [int(s) for s in args.sizes.split(",")]
    results: dict[str, list[dict[str, Any]]] = {}
    if args.baseline:
        results[args.baseline] = run_baseline(args.baseline, args.sizes, args.repeat, args.loaded)
    current = [measure(n, args.repeat, args.tree.resolve(), args.loaded) for n in sizes]
    if args.json:
        print(json.dumps(current))
        return
    results["now"] = current
    print(
        f"{cpu_model()}, {os.cpu_count()} cores, Python {platform.python_version()}; seconds, "
        f"median of {args.repeat} (scrape+tick: of {2 * args.repeat}, and their max); "
        f"{args.loaded:.1%} of workloads loaded"
    )
    print(table(results))


if __name__ == "__main__":
    main()
