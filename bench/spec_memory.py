"""Memory of the operator's validated specs: bytes per workload for N specs of the scale
benchmark's manifest (bench/scale.py), each validated alone and through `memory.SpecCache`,
which shares the parts that are alike. Traced with tracemalloc, which counts what Python
allocated and still holds, not what the process's RSS rounds it to.

Usage: python bench/spec_memory.py [--workloads 10000]
"""

from __future__ import annotations

import argparse
import json
import sys
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hostinfo import machine

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gpusizer.api.v1alpha1 import WorkloadSizingSpec  # noqa: E402
from gpusizer.memory import SpecCache  # noqa: E402

from bench.scale import workload_sizing  # noqa: E402


def held_bytes(build: Callable[[], Any]) -> int:
    """What `build`'s result holds once built, its garbage gone."""
    tracemalloc.start()
    kept = build()
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del kept
    return held


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--workloads", type=int, default=10_000)
    args = p.parse_args()
    raws = [workload_sizing(f"w{i:05d}")["spec"] for i in range(args.workloads)]

    def alone() -> list[WorkloadSizingSpec]:
        return [WorkloadSizingSpec.model_validate(raw) for raw in raws]

    def cached() -> SpecCache:
        specs = SpecCache()
        for i, raw in enumerate(raws):
            specs.get("bench-scale", f"w{i:05d}", 1, raw)
        return specs

    figures = {name: held_bytes(build) for name, build in (("alone", alone), ("cache", cached))}
    print(json.dumps({"machine": machine(), "workloads": args.workloads}))
    for name, held in figures.items():
        print(f"{name:6} {held / 2**20:7.1f} MiB  {held / args.workloads:7.0f} bytes per workload")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
