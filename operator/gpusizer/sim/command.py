"""`gpusizer simulate`: replay a trace through the policy and the baselines."""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict
from pathlib import Path

from pydantic import ValidationError

from gpusizer.sim import POLICIES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--trace",
        type=Path,
        required=True,
        help="CSV (timestamp_s,requests,...) or Prometheus query_range JSON with one series",
    )
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--capacity-rps", type=float, help="requests/s one replica serves")
    size.add_argument(
        "--peak-replicas",
        type=int,
        default=8,
        help="size capacity so the busiest minute needs N fully busy replicas (default 8)",
    )
    parser.add_argument("--startup-seconds", type=float, default=120.0)
    parser.add_argument("--slo-wait-seconds", type=float, default=5.0, help="max queueing wait")
    parser.add_argument(
        "--drop-after-seconds",
        type=float,
        default=60.0,
        help="a request waiting this long is dropped (the client times out)",
    )
    parser.add_argument(
        "--metric-delay-seconds",
        type=float,
        default=15.0,
        help="age of the metrics the controllers see",
    )
    parser.add_argument(
        "--gpu-utilization",
        choices=("busy", "kernel-active"),
        default="busy",
        help="utilisation as the busy share, or as DCGM's GPU_UTIL on an LLM server "
        "(the share of time a kernel runs: saturates with one request in flight)",
    )
    parser.add_argument("--bin-seconds", type=float, help="re-bin the trace (e.g. 3 for mooncake)")
    parser.add_argument("--tick-seconds", type=float, help="simulation step (default: bin, <= 5)")
    parser.add_argument(
        "--policy",
        default=",".join(POLICIES),
        help=f"comma-separated subset of {','.join(POLICIES)}",
    )
    parser.add_argument("--spec", type=Path, help="WorkloadSizing YAML (object or spec)")
    for flag, what in (
        ("--hpa", "HPA"),
        ("--keda", "KEDA (vLLM configuration)"),
        ("--keda-queue", "KEDA (queue only, min 0)"),
    ):
        parser.add_argument(
            flag,
            default="",
            metavar="NAME=VALUE,...",
            help=f"{what} settings, e.g. scale-down-window-seconds=120 (docs/simulate.md)",
        )
    parser.add_argument("--price-per-gpu-hour", type=float, default=3.00, help="H100-80GB: 3.00")
    parser.add_argument("--format", choices=("table", "json"), default="table")
    parser.add_argument("--plot", type=Path, help="write a PNG of load and replicas over time")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    # here, not at the top: `gpusizer run` builds this parser too, and numpy and matplotlib
    # were 26 MiB of every operator's memory
    from gpusizer.sim.controllers import configured
    from gpusizer.sim.fleet import FleetParams
    from gpusizer.sim.output import as_json, plot, table
    from gpusizer.sim.replay import (
        Baselines,
        capacity_for_peak,
        default_baselines,
        default_tick,
        load_spec,
        replay,
        with_activator,
    )
    from gpusizer.sim.trace import load_trace

    policies = [p.strip() for p in args.policy.split(",") if p.strip()]
    unknown = [p for p in policies if p not in POLICIES]
    if unknown or not policies:
        print(
            f"unknown policy {', '.join(unknown)}; choose from {','.join(POLICIES)}",
            file=sys.stderr,
        )
        return 2
    if args.slo_wait_seconds >= args.drop_after_seconds:
        print("--slo-wait-seconds must be below --drop-after-seconds", file=sys.stderr)
        return 2
    try:
        trace = load_trace(args.trace)
        spec = load_spec(args.spec)
        defaults = default_baselines(spec)
        baselines = Baselines(
            hpa=configured(defaults.hpa, args.hpa),
            keda=configured(defaults.keda, args.keda),
            keda_queue=configured(defaults.keda_queue, args.keda_queue),
        )
    except (OSError, ValueError, ValidationError) as error:
        print(f"simulate: {error}", file=sys.stderr)
        return 2
    if args.bin_seconds:
        trace = trace.rebinned(args.bin_seconds)
    capacity = args.capacity_rps or capacity_for_peak(trace, args.peak_replicas)
    params = with_activator(
        FleetParams(
            capacity_rps=capacity,
            startup_seconds=args.startup_seconds,
            slo_wait_seconds=args.slo_wait_seconds,
            drop_after_seconds=args.drop_after_seconds,
            metric_delay_seconds=args.metric_delay_seconds,
            tick_seconds=args.tick_seconds or default_tick(trace),
            kernel_active_utilization=args.gpu_utilization == "kernel-active",
        ),
        spec,
    )
    quiet = args.quiet or not sys.stderr.isatty()
    results = replay(
        trace,
        params,
        spec,
        policies,
        baselines=baselines,
        price_per_gpu_hour=args.price_per_gpu_hour,
        quiet=quiet,
    )
    parameters = {
        "capacity_rps": round(capacity, 6),
        "peak_replicas": None if args.capacity_rps else args.peak_replicas,
        "startup_seconds": params.startup_seconds,
        "slo_wait_seconds": params.slo_wait_seconds,
        "drop_after_seconds": params.drop_after_seconds,
        "metric_delay_seconds": params.metric_delay_seconds,
        "activator_max_held": None if math.isinf(params.max_held) else params.max_held,
        "activator_hold_timeout_seconds": (
            None if math.isinf(params.hold_timeout_seconds) else params.hold_timeout_seconds
        ),
        "bin_seconds": trace.bin_seconds,
        "tick_seconds": params.tick_seconds,
        "gpu_utilization": args.gpu_utilization,
        "price_per_gpu_hour": args.price_per_gpu_hour,
        "spec": str(args.spec) if args.spec else "default",
        "baselines": {
            "hpa": asdict(baselines.hpa),
            "keda": asdict(baselines.keda),
            "keda-queue": asdict(baselines.keda_queue),
        },
    }
    if args.format == "json":
        print(json.dumps(as_json(trace, parameters, results), indent=2))
    else:
        print(table(results, title=f"{trace.name} (capacity {capacity:.3f} req/s per replica)"))
    if args.plot:
        plot(trace, params.tick_seconds, capacity, results, args.plot)
    return 0
