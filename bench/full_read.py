"""Where a full read's time goes at N pods: the operator's snapshot against a real Prometheus
scraping the GPU emulator, without Kubernetes.

The emulator (`e2e/gpusim`) runs in a child process over an in-memory cluster: whole H100s, 64
per node as in bench/nodepools-scale.yaml, one single-GPU replica per workload, every replica
Ready and loaded (utilisation 10-130 % of a replica's capacity), a spare node of idle GPUs.
A real Prometheus scrapes it as `cluster-up.sh` does (every 5 s, one target per GPU node). Once
every series is in, it measures `--repeat` full reads, one after the other:

- per query of a full read, from Prometheus (`stats=all`): the evaluation, the time to the
  first byte of the answer (evaluation and encoding), the whole answer, its size and series;
- the operator's side: `gpusizer.signals.reader.read_full` through the operator's
  `PrometheusSource`, wall time and the CPU of this process over it (the emulator is not in
  this process); and the join of every workload's pods to that snapshot
  (`signals.join.workload_signals`), CPU;
- Prometheus' CPU per read (from /proc, less its CPU over as long a time without reads);
- then three more reads under tracemalloc: the Python memory a read's snapshot keeps, and the
  most that was allocated at once during the read (the decoded answers with it), which is
  what the operator's heap must have room for at every read.

Usage: python bench/full_read.py [--pods 5000] [--repeat 10] [--baseline REV] [--profile FILE]
`--baseline REV` runs the same measurements on REV's operator/ (exported with `git archive`,
imported in a subprocess) against the same emulator and Prometheus, just before this tree's
reads, and prints both side by side. `--profile FILE` writes a cProfile of this tree's
reads and joins to FILE (pstats).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import gc
import json
import math
import multiprocessing
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import requests
from hostinfo import cpu_model

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support import start_prometheus  # noqa: E402

GPUS_PER_NODE = 64
TRACED_READS = 3
NAMESPACE = "bench-read"
SCRAPE = "5s"


def emulate(pods: int, targets: Path, port: Any) -> None:
    """The child process: the emulator over an in-memory cluster, ticking every second."""
    from gpusizer.catalog import load_catalog

    from e2e.gpusim.exposition import ExporterOptions
    from e2e.gpusim.model import ModelConfig
    from e2e.gpusim.server import GpusimServer, ScrapeTargets
    from e2e.gpusim.sim import Simulator
    from e2e.gpusim.testing import FakeClusterSource, gpu_node, gpu_pod

    catalog = load_catalog()
    source = FakeClusterSource()
    nodes = math.ceil(pods / GPUS_PER_NODE) + 1  # and a spare node of idle GPUs
    for i in range(nodes):
        name = f"gpu-{i:03d}"
        source.nodes[name] = gpu_node(catalog, name, "h100-80gb", GPUS_PER_NODE)
    for i in range(pods):
        source.add_pod(
            gpu_pod(
                f"w{i:05d}-0",
                f"gpu-{i // GPUS_PER_NODE:03d}",
                workload=f"w{i:05d}",
                namespace=NAMESPACE,
            )
        )
    sim = Simulator(source, catalog, ModelConfig(startup_seconds=0))
    for i in range(pods):
        sim.set_load((NAMESPACE, f"w{i:05d}"), 1.0 + (i % 17) * 0.7)
    sim.step()
    server = GpusimServer(("127.0.0.1", 0), sim, ExporterOptions())
    scrape_targets = ScrapeTargets(targets, f"127.0.0.1:{server.server_port}")
    stop = threading.Event()

    def then() -> None:
        scrape_targets.update(sim.view().nodes)

    then()
    threading.Thread(target=sim.run, args=(1.0, stop, then), daemon=True).start()
    server.serve_in_thread()
    port.put(server.server_port)
    # Prometheus closes a connection now and then mid-answer: the server's tracebacks for
    # those say nothing about the reads measured here
    sys.stderr = open(os.devnull, "w")  # noqa: SIM115
    stop.wait()


def prometheus(workdir: Path, targets: Path) -> tuple[subprocess.Popen[bytes], str]:
    """Prometheus scraping the emulator as cluster-up.sh has it do."""
    binary = shutil.which("prometheus")
    if binary is None:
        sys.exit("prometheus is not installed: run `make prometheus`")
    (workdir / "prometheus.yml").write_text(
        f"global: {{scrape_interval: {SCRAPE}, scrape_timeout: 4s, evaluation_interval: 5s}}\n"
        "scrape_configs:\n"
        "  - job_name: file-sd\n"
        f"    file_sd_configs: [{{files: ['{targets}'], refresh_interval: 5s}}]\n"
    )
    proc, port = start_prometheus(binary, workdir)
    return proc, f"http://127.0.0.1:{port}"


@contextlib.contextmanager
def emulated_prometheus(
    pods: int, prefix: str
) -> Iterator[tuple[str, subprocess.Popen[bytes], Path]]:
    """The emulator over `pods` pods and a real Prometheus scraping it, once every series is in
    and has been scraped twice more: (Prometheus' URL, its process, a scratch directory), all
    stopped and removed on the way out."""
    workdir = Path(tempfile.mkdtemp(prefix=prefix))
    targets = workdir / "targets.json"
    ports: multiprocessing.Queue[int] = multiprocessing.Queue()
    emulator = multiprocessing.Process(target=emulate, args=(pods, targets, ports), daemon=True)
    emulator.start()
    try:
        ports.get(timeout=300)
        prometheus_process, url = prometheus(workdir, targets)
        try:
            wait_for_series(url, pods)
            wait_for_scrapes(url, more=2)
            yield url, prometheus_process, workdir
        finally:
            prometheus_process.terminate()
            prometheus_process.wait(timeout=30)
    finally:
        emulator.terminate()
        shutil.rmtree(workdir, ignore_errors=True)


def instant(url: str, promql: str) -> Any:
    answer = requests.get(f"{url}/api/v1/query", params={"query": promql}, timeout=30).json()
    return answer["data"]["result"]


def wait_for_series(url: str, pods: int, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    wanted = {
        "count(DCGM_FI_DEV_GPU_UTIL)": (math.ceil(pods / GPUS_PER_NODE) + 1) * GPUS_PER_NODE,
        'count(DCGM_FI_DEV_GPU_UTIL{pod!=""})': pods,
        "count(vllm:num_requests_waiting)": pods,
    }
    while True:
        try:
            have = {q: instant(url, q) for q in wanted}
            if all(r and float(r[0]["value"][1]) >= wanted[q] for q, r in have.items()):
                return
        except (requests.RequestException, KeyError, ValueError):
            pass
        if time.monotonic() > deadline:
            raise TimeoutError("Prometheus did not get every series of the emulator")
        time.sleep(1)


def wait_for_scrapes(url: str, more: int, timeout: float = 120) -> None:
    """Until every target has been scraped `more` times again: rates and ages need them."""
    scraped = "min(count_over_time(up[1h]))"  # per target, since Prometheus started
    first = float(instant(url, scraped)[0]["value"][1])
    deadline = time.monotonic() + timeout
    while float(instant(url, scraped)[0]["value"][1]) < first + more:
        if time.monotonic() > deadline:
            raise TimeoutError(f"Prometheus did not scrape every target {more} more times")
        time.sleep(1)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def prometheus_query_stats(url: str, promql: str) -> dict[str, float]:
    """One query's evaluation (Prometheus' own timing), time to first byte, whole answer."""
    started = time.perf_counter()
    response = requests.get(
        f"{url}/api/v1/query", params={"query": promql, "stats": "all"}, timeout=30, stream=True
    )
    first = time.perf_counter()
    body = response.content
    done = time.perf_counter()
    answer = json.loads(body)
    timings = answer["data"].get("stats", {}).get("timings", {})
    return {
        "eval_s": timings.get("evalTotalTime", math.nan),
        "first_byte_s": first - started,
        "answer_s": done - started,
        "mb": len(body) / 1e6,
        "series": len(answer["data"]["result"]),
    }


def measure(url: str, prometheus_pid: int, pods: int, repeat: int, profile: str | None) -> Any:
    """This tree's figures (gpusizer imported from wherever sys.path finds it first)."""
    from gpusizer.api.v1alpha1 import Server, WorkloadSizingSpec
    from gpusizer.settings import PrometheusSettings
    from gpusizer.signals.join import workload_signals
    from gpusizer.signals.pods import PodInfo
    from gpusizer.signals.prometheus import PrometheusSource
    from gpusizer.signals.queries import full_read_queries
    from gpusizer.signals.reader import read_full

    source = PrometheusSource(PrometheusSettings(url=url, timeout_seconds=30))
    spec = WorkloadSizingSpec.model_validate(
        {
            "targetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "w"},
            "replicas": {"min": 1, "max": 4, "targetGPUUtilization": 70},
            "metrics": {"server": "vllm"},
        }
    )
    workload_pods = [
        [
            PodInfo(
                namespace=NAMESPACE,
                name=f"w{i:05d}-0",
                labels={},
                node=None,
                ready=True,
                terminating=False,
                phase="Running",
                gpu_resource="nvidia.com/gpu",
                gpu_container="vllm",
                oom_kills=0,
            )
        ]
        for i in range(pods)
    ]
    queries = {
        name: prometheus_query_stats(url, q.promql) for name, q in full_read_queries(Server).items()
    }
    profiler = cProfile.Profile() if profile else None
    reads: list[dict[str, float]] = []
    loop = asyncio.new_event_loop()
    for _ in range(repeat):
        p0, c0, w0 = cpu_seconds(prometheus_pid), time.process_time(), time.perf_counter()
        if profiler:
            profiler.enable()
        snapshot = loop.run_until_complete(read_full(source, Server))
        w1, c1 = time.perf_counter(), time.process_time()
        now = time.time()
        known = sum(
            workload_signals(spec, p, snapshot, now).signals.gpu_utilization is not None
            for p in workload_pods
        )
        c2 = time.process_time()
        if profiler:
            profiler.disable()
        p1 = cpu_seconds(prometheus_pid)
        reads.append(
            {
                "read_s": w1 - w0,
                "read_cpu_s": c1 - c0,
                "join_cpu_s": c2 - c1,
                "prometheus_cpu_s": p1 - p0,
                "known": known,
                "errors": len(snapshot.errors),
            }
        )
        time.sleep(0.5)
    del snapshot
    traced: list[dict[str, float]] = []
    for _ in range(TRACED_READS):
        gc.collect()
        tracemalloc.start()
        snapshot = loop.run_until_complete(read_full(source, Server))
        held, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        del snapshot
        traced.append({"held_mib": held / 2**20, "peak_mib": peak / 2**20})
    loop.close()
    if profiler and profile:
        profiler.dump_stats(profile)
    return {"queries": queries, "reads": reads, "traced": traced}


def summary(result: dict[str, Any]) -> dict[str, float]:
    reads, traced = result["reads"], result["traced"]
    return {
        **{
            key: statistics.median(r[key] for r in reads)
            for key in ("read_s", "read_cpu_s", "join_cpu_s", "prometheus_cpu_s", "known")
        },
        **{key: statistics.median(r[key] for r in traced) for key in ("held_mib", "peak_mib")},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--baseline", metavar="REV", help="also measure REV's operator/")
    parser.add_argument("--profile", help="cProfile of this tree's reads and joins, to FILE")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    # internal: measure against a running Prometheus, printing JSON (a baseline's subprocess)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--prometheus-pid", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.url:
        print(json.dumps(measure(args.url, args.prometheus_pid, args.pods, args.repeat, None)))
        return
    sys.path.insert(0, str(REPO / "operator"))
    with emulated_prometheus(args.pods, "gpusizer-full-read-") as (
        url,
        prometheus_process,
        workdir,
    ):
        results: dict[str, Any] = {}
        if args.baseline:
            baseline_tree = workdir / "baseline"
            baseline_tree.mkdir()
            archive = subprocess.run(
                ["git", "-C", str(REPO), "archive", args.baseline, "operator"],
                check=True,
                capture_output=True,
            ).stdout
            subprocess.run(["tar", "-x", "-C", str(baseline_tree)], input=archive, check=True)
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--pods",
                    str(args.pods),
                    "--repeat",
                    str(args.repeat),
                    "--url",
                    url,
                    "--prometheus-pid",
                    str(prometheus_process.pid),
                ],
                env={**os.environ, "PYTHONPATH": str(baseline_tree / "operator")},
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            results[args.baseline] = json.loads(out)
        results["now"] = measure(url, prometheus_process.pid, args.pods, args.repeat, args.profile)
    if args.json:
        print(json.dumps(results, indent=1))
        return
    print(
        f"{cpu_model()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
        f"{args.pods} pods; medians of {args.repeat} full reads"
    )
    for label, result in results.items():
        print(f"\n{label}:")
        print(
            f"  {'query':<14} {'series':>7} {'MB':>6} {'eval s':>7} {'1st byte s':>10} {'all s':>6}"
        )
        for name, q in result["queries"].items():
            print(
                f"  {name:<14} {q['series']:>7} {q['mb']:>6.2f} {q['eval_s']:>7.3f} "
                f"{q['first_byte_s']:>10.3f} {q['answer_s']:>6.3f}"
            )
        s = summary(result)
        print(
            f"  full read {s['read_s']:.3f} s wall, {s['read_cpu_s']:.3f} s operator CPU, "
            f"{s['prometheus_cpu_s']:.3f} s Prometheus CPU; join of every workload "
            f"{s['join_cpu_s']:.3f} s CPU ({s['known']:.0f} with known utilisation)"
        )
        print(
            f"  under tracemalloc (median of {TRACED_READS} reads): the snapshot keeps "
            f"{s['held_mib']:.1f} MiB, {s['peak_mib']:.1f} MiB allocated at most during the read"
        )


if __name__ == "__main__":
    main()
