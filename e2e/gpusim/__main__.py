"""`python -m e2e.gpusim --kubeconfig K --listen 127.0.0.1:PORT`: run the GPU emulator."""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType

from gpusizer.catalog import load_catalog
from gpusizer.cli import tune_garbage_collector

from e2e.gpusim.exposition import ExporterOptions
from e2e.gpusim.kube import KubeCluster
from e2e.gpusim.migmanager import add_arguments, manager_from
from e2e.gpusim.model import ModelConfig
from e2e.gpusim.openai import OpenAIEndpoints
from e2e.gpusim.server import GpusimServer, ScrapeTargets
from e2e.gpusim.sim import Simulator

log = logging.getLogger("e2e.gpusim")


def _address(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"--listen: expected HOST:PORT, got {value!r}")
    return host, int(port)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    defaults = ModelConfig()
    parser = argparse.ArgumentParser(prog="python -m e2e.gpusim", description=__doc__)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--listen", type=_address, default=("127.0.0.1", 9400))
    parser.add_argument("--hostname-label", choices=["Hostname", "hostname"], default="Hostname")
    parser.add_argument("--exported-labels", action="store_true")
    parser.add_argument("--tick-seconds", type=float, default=1.0)
    parser.add_argument("--catalog", type=Path, default=None, help="catalog override YAML")
    parser.add_argument("--capacity-rps", type=float, default=defaults.capacity_rps)
    parser.add_argument("--startup-seconds", type=float, default=defaults.startup_seconds)
    parser.add_argument("--memory-mib", type=int, default=defaults.memory_mib)
    parser.add_argument("--oom-backoff-seconds", type=float, default=defaults.oom_backoff_seconds)
    add_arguments(parser)
    parser.add_argument("--no-mig-manager", action="store_true")
    parser.add_argument(
        "--targets-file",
        type=Path,
        default=None,
        help="write Prometheus file_sd targets here, one per GPU node and one for the gateway",
    )
    parser.add_argument("--log-level", default="INFO")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    # The informers hold every pod, node and Deployment as JSON; with Python's default
    # thresholds a tick's readings were promoted and full collections of that heap ran every
    # few ticks, with the GIL held against the scrapes (bench/README.md, issue 29).
    tune_garbage_collector()
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    catalog = load_catalog(args.catalog)
    cluster = KubeCluster(args.kubeconfig)
    cluster.start()
    config = ModelConfig(
        capacity_rps=args.capacity_rps,
        startup_seconds=args.startup_seconds,
        memory_mib=args.memory_mib,
        oom_backoff_seconds=args.oom_backoff_seconds,
    )
    sim = Simulator(cluster, catalog, config)
    endpoints = OpenAIEndpoints(sim.served)  # each Ready pod's inference server, at its IP
    endpoints.start()
    sim.serve = endpoints.update
    sim.step()
    options = ExporterOptions(
        hostname_label=args.hostname_label, exported_labels=args.exported_labels
    )
    server = GpusimServer(args.listen, sim, options)
    stop = threading.Event()

    def _stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    then: Callable[[], object]
    if args.targets_file is None:
        # Each tick renders /metrics once, in the tick thread: scrapes only send bytes.
        then = server.exposition.body
    else:
        # Scraped per node, each part rendered at its scrape; /metrics only when asked for.
        targets = ScrapeTargets(args.targets_file, f"{args.listen[0]}:{server.server_port}")

        def then() -> None:
            targets.update(sim.view().nodes)

        then()
    tick = (args.tick_seconds, stop, then)
    threads = [threading.Thread(target=sim.run, args=tick, name="tick", daemon=True)]
    if not args.no_mig_manager:
        manager = manager_from(args, cluster, catalog)
        threads.append(
            threading.Thread(target=manager.run, args=(1.0, stop), name="migmgr", daemon=True)
        )
    for thread in threads:
        thread.start()
    server.serve_in_thread()
    log.info("serving on http://%s:%d", *server.server_address[:2])
    stop.wait()
    server.shutdown()
    endpoints.stop()
    cluster.stop()


if __name__ == "__main__":
    main()
