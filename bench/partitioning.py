"""GPU partitioning: how many H100s hold generated fleets of inference workloads on whole GPUs,
with gpusizer's plan, and with the exact optimum.

    python bench/partitioning.py [--data FILE] [--seed 1] [--out FILE]

Each workload serves one model (weights and KV cache from the model's size, throughput per GPU
calibrated on the measured decode speed of llama2-70b on H100s in
../shared/reference/data/llm-latency-a100-h100.csv, scaled by weight bytes since decode is
bound by memory bandwidth) at a demand drawn low, as measured fleets run.

- whole GPUs: each workload gets whole H100 replicas sized for 70 % utilisation, as a competent
  user runs it without MIG (HPA at a 70 % target).
- gpusizer: right-sizing's own slice choice (`policy.slices.choose_slice`) per workload, then
  the operator's planner (`policy.partitioning.plan_partitions`) run as the operator runs it:
  from the whole-GPU deployment, one node re-partition at a time, workloads moving once their
  slices exist, until nothing changes. `plan_gpus` is the GPUs holding the demand at the end,
  `pods_moved` the pods its drains evicted, `plan_seconds` its slowest plan (each plan timed
  three times, the fastest kept).
- optimum: the fewest H100s holding the same slices, an integer program over every valid MIG
  layout of the GPU (scipy.optimize.milp, HiGHS): exact.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import random
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gpusizer.api.v1alpha1 import RightSizingSpec
from gpusizer.catalog import GPUProduct, Slice, layout_is_valid, load_catalog, valid_layouts
from gpusizer.policy.partitioning import WHOLE, PlanNode, plan_partitions, slices_of
from gpusizer.policy.slices import Offer, Usage, choose_slice
from hostinfo import machine
from scipy.optimize import Bounds, LinearConstraint, milp

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "reference" / "data" / "llm-latency-a100-h100.csv"
CATALOG = load_catalog()
H100 = CATALOG.products["h100-80gb"]
PRODUCT = H100.key
GPUS_PER_NODE = 8
TARGET_UTILIZATION = 70.0
BATCH = 16  # the decode batch the throughput is taken at
MAX_ROUNDS = 400
TIMINGS = 3  # each plan timed this often, the fastest kept: the machine is shared and noisy


@dataclass(frozen=True)
class Model:
    name: str
    params_b: float
    bytes_per_param: float  # 2 FP16/BF16, 1 FP8/INT8, 0.5 INT4
    kv_gib: float  # KV cache and activations the server reserves

    @property
    def weight_bytes(self) -> float:
        return self.params_b * 1e9 * self.bytes_per_param

    @property
    def memory_mib(self) -> float:
        """What DCGM shows as the pod's peak: weights plus the reserved cache."""
        return (self.weight_bytes / 2**20) + self.kv_gib * 1024


SMALL = [
    Model("qwen2.5-0.5b", 0.5, 2, 1),
    Model("llama3.2-1b", 1.2, 2, 1.5),
    Model("llama3.2-3b", 3.2, 2, 2),
    Model("phi3-mini-3.8b", 3.8, 2, 2),
    Model("mistral-7b", 7.2, 2, 3),
    Model("llama3.1-8b", 8.0, 2, 3),
    Model("llama3.1-8b-awq", 8.0, 0.5, 3),
    Model("llama2-13b", 13.0, 2, 4),
]
LARGE = [
    Model("qwen2.5-14b-fp8", 14.8, 1, 5),
    Model("yi-34b-fp8", 34.4, 1, 6),
    Model("llama3.1-70b-awq", 70.6, 0.5, 6),
]
MIXES = {"small": SMALL, "mixed": SMALL + LARGE}


def decode_efficiency(path: Path) -> float:
    """Aggregate decode tokens/s per byte/s of HBM bandwidth per byte of weights, at BATCH:
    measured on llama2-70b (FP16) with tensor parallelism over H100s."""
    rates = []
    with path.open() as f:
        for row in csv.DictReader(f):
            if (row["model"], row["hardware"]) != ("llama2-70b", "h100-80gb"):
                continue
            if int(row["batch_size"]) != BATCH or int(row["prompt_size"]) != 512:
                continue
            tokens_per_second = BATCH * 1000 / float(row["token_time"])
            bandwidth = int(row["tensor_parallel"]) * H100.hbm_bandwidth_gbps * 1e9
            rates.append(tokens_per_second * 70e9 * 2 / bandwidth)
    if not rates:
        raise SystemExit(f"{path}: no llama2-70b rows on h100-80gb at batch {BATCH}")
    return statistics.median(rates)


@dataclass(frozen=True)
class Workload:
    name: str
    model: Model
    tokens_per_second: float
    whole_replicas: int
    slice: Slice
    replicas: int


def offers() -> list[Offer]:
    """Every H100 slice, plenty free: the slice right-sizing would choose with the room."""
    return [Offer(s, 10_000) for s in CATALOG.slices() if s.product.key == PRODUCT]


def generate(mix: str, count: int, efficiency: float, rng: random.Random) -> list[Workload]:
    whole = CATALOG.slice(H100.slice_name, PRODUCT)
    assert whole is not None
    workloads = []
    for i in range(count):
        model = rng.choice(MIXES[mix])
        rate = efficiency * H100.hbm_bandwidth_gbps * 1e9 / model.weight_bytes
        # demand in whole-GPU replicas' worth, low as measured fleets run (log-uniform)
        load = math.exp(rng.uniform(math.log(0.02), math.log(2.0)))
        whole_replicas = max(1, math.ceil(load / (TARGET_UTILIZATION / 100)))
        choice = choose_slice(
            whole,
            Usage(
                peak_memory_mib=model.memory_mib,
                mean_utilization=100 * load / whole_replicas,
                served_rps=None,
                replicas=whole_replicas,
                oom_kills=0,
                coverage=1.0,
            ),
            offers(),
            RightSizingSpec(),
            target_utilization=TARGET_UTILIZATION,
            min_replicas=1,
            now=0.0,
        )
        best = choice.recommended
        assert best is not None, choice.message
        workloads.append(
            Workload(f"{mix}-{i}", model, load * rate, whole_replicas, best.slice, best.replicas)
        )
    return workloads


def kind(slice_: Slice) -> str:
    return WHOLE if slice_.profile is None else slice_.profile.name


def slices_wanted(workloads: list[Workload]) -> Counter[str]:
    wanted: Counter[str] = Counter()
    for w in workloads:
        wanted[kind(w.slice)] += w.replicas
    return wanted


# --- the exact optimum -------------------------------------------------------------------


def maximal_layouts(product: GPUProduct) -> list[tuple[str, ...]]:
    """Every layout the GPU holds to which no instance can be added (the integer program needs
    no other: a smaller one is a maximal one with instances left unused)."""
    assert product.mig is not None
    profiles = sorted(product.mig.profiles)
    return sorted(
        layout
        for layout in valid_layouts(product)
        if not any(layout_is_valid(product, [*layout, p]) for p in profiles)
    )


def optimum(wanted: Counter[str]) -> int:
    """Fewest GPUs whose layouts hold `wanted`: min sum(x) over layouts, integer x >= 0, each
    kind's instances over the chosen layouts at least its demand."""
    kinds = sorted(wanted)
    patterns: list[Counter[str]] = [Counter({WHOLE: 1})]
    patterns += [Counter(layout) for layout in maximal_layouts(H100)]
    a = np.array([[p[k] for p in patterns] for k in kinds], dtype=float)
    result = milp(
        c=np.ones(len(patterns)),
        constraints=LinearConstraint(a, lb=[wanted[k] for k in kinds], ub=np.inf),
        integrality=np.ones(len(patterns)),
        bounds=Bounds(0, np.inf),
    )
    if not result.success:
        raise RuntimeError(f"milp: {result.message}")
    return round(result.fun)


# --- the operator, round after round --------------------------------------------------------


@dataclass
class Node:
    name: str
    layout: list[tuple[str, ...] | None]
    pods: list[tuple[str, str]] = field(default_factory=list)  # (pod, kind)

    def free(self) -> Counter[str]:
        have: Counter[str] = Counter(k for gpu in self.layout for k in slices_of(gpu))
        return have - Counter(k for _, k in self.pods)


@dataclass
class Run:
    gpus: int
    plan_gpus: int
    pods_moved: int
    plan_seconds: float
    rounds: int
    unmet: int


def place(nodes: list[Node], pod: str, want: str) -> bool:
    for node in nodes:
        if node.free()[want] > 0:
            node.pods.append((pod, want))
            return True
    return False


def operate(workloads: list[Workload], nodes_count: int) -> Run:
    """The whole-GPU deployment, then gpusizer: each round the planner's first change is applied
    (maxNodesUnavailable 1), evicted pods come back where their slice is free, and every
    workload whose slices are free moves there (right-sizing's reshape)."""
    nodes = [Node(f"n{i}", [None] * GPUS_PER_NODE) for i in range(nodes_count)]
    pending: list[tuple[str, str]] = []
    for w in workloads:
        for r in range(w.whole_replicas):
            if not place(nodes, f"{w.name}/whole-{r}", WHOLE):
                raise SystemExit(f"the whole-GPU deployment needs more than {nodes_count} nodes")
    moved: set[str] = {w.name for w in workloads if kind(w.slice) == WHOLE}
    pods_moved, slowest, rounds = 0, 0.0, 0
    while rounds < MAX_ROUNDS:
        rounds += 1
        demand: Counter[str] = Counter()
        for w in workloads:
            demand[kind(w.slice)] += w.replicas
            if w.name not in moved:
                demand[WHOLE] += w.whole_replicas
        running = Counter(k for n in nodes for _, k in n.pods)
        plan_nodes = [
            PlanNode(n.name, H100, tuple(n.layout), tuple(p for p, _ in n.pods)) for n in nodes
        ]
        seconds = []
        for _ in range(TIMINGS):
            started = time.perf_counter()
            plan = plan_partitions(
                plan_nodes,
                {(PRODUCT, k): v for k, v in demand.items()},
                running={(PRODUCT, k): v for k, v in running.items()},
            )
            seconds.append(time.perf_counter() - started)
        slowest = max(slowest, min(seconds))
        progress = False
        if plan.changes:
            change = plan.changes[0]
            node = next(n for n in nodes if n.name == change.node)
            pods_moved += len(node.pods)
            pending += node.pods
            node.pods, node.layout = [], list(change.layout)
            progress = True
        pending = [(p, k) for p, k in pending if not place(nodes, p, k)]
        for w in workloads:
            if w.name in moved:
                continue
            want = kind(w.slice)
            if sum(n.free()[want] for n in nodes) >= w.replicas:
                for r in range(w.replicas):
                    place(nodes, f"{w.name}/{want}-{r}", want)
                for n in nodes:
                    n.pods = [(p, k) for p, k in n.pods if not p.startswith(f"{w.name}/whole-")]
                pending = [(p, k) for p, k in pending if not p.startswith(f"{w.name}/whole-")]
                moved.add(w.name)
                progress = True
        if not progress:
            break
    final = plan_partitions(
        [PlanNode(n.name, H100, tuple(n.layout), tuple(p for p, _ in n.pods)) for n in nodes],
        {(PRODUCT, k): v for k, v in slices_wanted(workloads).items()},
    )
    unmet = sum(final.unmet_now.values()) + len(pending) + len(workloads) - len(moved)
    return Run(
        gpus=nodes_count * GPUS_PER_NODE,
        plan_gpus=final.gpus_now,
        pods_moved=pods_moved,
        plan_seconds=slowest,
        rounds=rounds,
        unmet=unmet,
    )


def fleet(mix: str, count: int, efficiency: float, seed: int) -> dict[str, Any]:
    rng = random.Random(f"{seed}-{mix}-{count}")
    workloads = generate(mix, count, efficiency, rng)
    whole = sum(w.whole_replicas for w in workloads)
    nodes = max(GPUS_PER_NODE, math.ceil((whole + GPUS_PER_NODE) / GPUS_PER_NODE))
    run = operate(workloads, nodes)
    wanted = slices_wanted(workloads)
    scratch = plan_partitions(
        [PlanNode(f"n{i}", H100, (None,) * GPUS_PER_NODE) for i in range(nodes)],
        {(PRODUCT, k): v for k, v in wanted.items()},
    )
    return {
        "name": f"{mix}-{count}",
        "gpus": run.gpus,
        "workloads": count,
        "whole_gpus": whole,
        "plan_gpus": run.plan_gpus,
        "optimal_gpus": optimum(wanted),
        "plan_seconds": round(run.plan_seconds, 4),
        "pods_moved": run.pods_moved,
        # printed, not written: the planner packing from scratch, rounds, what stayed unmet
        "_scratch_gpus": scratch.gpus_planned,
        "_rounds": run.rounds,
        "_unmet": run.unmet,
        "_slices": dict(sorted(wanted.items())),
    }


def table(rows: list[dict[str, Any]]) -> str:
    columns = [
        ("fleet", "name"),
        ("gpus", "gpus"),
        ("workloads", "workloads"),
        ("whole", "whole_gpus"),
        ("gpusizer", "plan_gpus"),
        ("optimum", "optimal_gpus"),
        ("vs optimum", None),
        ("vs whole", None),
        ("from scratch", "_scratch_gpus"),
        ("pods moved", "pods_moved"),
        ("slowest plan s", "plan_seconds"),
        ("rounds", "_rounds"),
    ]
    lines = [[c for c, _ in columns]]
    for r in rows:
        cells = []
        for title, key in columns:
            if title == "vs optimum":
                cells.append(f"{r['plan_gpus'] / r['optimal_gpus'] - 1:+.1%}")
            elif title == "vs whole":
                cells.append(f"{r['plan_gpus'] / r['whole_gpus'] - 1:+.1%}")
            else:
                cells.append(str(r[key]))
        lines.append(cells)
    widths = [max(len(line[i]) for line in lines) for i in range(len(columns))]
    return "\n".join(
        "  ".join(c.rjust(w) for c, w in zip(line, widths, strict=True)) for line in lines
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument(
        "--data", type=Path, default=DATA, help="the latency CSV (default: %(default)s)"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--sizes", default="20,50,100,200", help="workloads per fleet")
    parser.add_argument("--out", type=Path, help="write the figures as JSON to this file")
    args = parser.parse_args()
    if not args.data.exists():
        print(f"{args.data} not found: pass --data", file=sys.stderr)
        return 1
    efficiency = decode_efficiency(args.data)
    host = machine()
    print(f"machine: {host['cpu']}, {host['cores']} cores, Python {host['python']}")
    print(
        f"decode: {efficiency:.2f} tokens/s per (byte/s of HBM / byte of weights) at batch "
        f"{BATCH}, from llama2-70b on H100 ({args.data.name}); target utilisation "
        f"{TARGET_UTILIZATION:g} %; seed {args.seed}\n"
    )
    rows = [
        fleet(mix, int(size), efficiency, args.seed)
        for mix in MIXES
        for size in args.sizes.split(",")
    ]
    print(table(rows))
    for r in rows:
        if r["_unmet"]:
            print(
                f"{r['name']}: {r['_unmet']} slice(s) or workload(s) left unplaced", file=sys.stderr
            )
    if args.out:
        public = [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows]
        args.out.write_text(json.dumps({"machine": host, "fleets": public}, indent=2) + "\n")
        print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
