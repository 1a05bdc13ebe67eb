"""What one workload's turn spends on its efficiency figures (`gpusizer.efficiency.efficiency`),
against how many MIG instance series the right-sizing window holds.

The window's instance queries (`signals.queries.instance_queries`) return a series per MIG
instance and per pod that held it during the window, so where pods come and go the series grow
for as long as the window lasts (an hour by default: `rightSizing.historySeconds`). The operator
computes every workload's figures at every turn (`measurement.Measurer.measure`), so what one
call costs is paid some 60 times a second by the soak's 200 workloads.

Usage: python bench/efficiency_turn.py [--gpus 32] [--holders 1,3,10,30] [--operator-path DIR]
Prints, for each number of pods that held each instance in the window: the instance series and
the microseconds of CPU per call for a workload of two pods on whole GPUs and for one of two
pods on MIG instances. `--operator-path` imports the operator from DIR (a `git archive` of an
older tree's operator/) to compare trees side by side.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
BALANCED = [("1", "1g.10gb"), ("2", "1g.10gb"), ("3", "2g.20gb"), ("4", "3g.40gb")]
H100 = "NVIDIA H100 80GB HBM3"
WINDOW = 3600


def instance_series(gpus: int, holders: int, parse: Any) -> dict[str, list[Any]]:
    """The three instance queries' answers: every instance of `gpus` balanced H100s, each held
    in turn by `holders` pods over the window (the last of them holding it now)."""
    found: dict[str, list[Any]] = {"energy": [], "power": [], "active": []}
    for g in range(gpus):
        for instance, profile in BALANCED:
            for h in range(holders):
                labels = {
                    "UUID": f"GPU-{g:04d}",
                    "GPU_I_ID": instance,
                    "GPU_I_PROFILE": profile,
                    "modelName": H100,
                    "namespace": "soak",
                    "pod": f"w{g:03d}-{instance}-{h}",
                }
                found["energy"].append(parse.LabelledValue(labels, 300.0 * WINDOW / holders * 1e3))
                found["power"].append(parse.LabelledValue(labels, 300.0))
                found["active"].append(parse.LabelledValue(labels, 0.4))
    return found


def per_call_us(call: Any, seconds: float = 0.5) -> float:
    """CPU microseconds per call, over at least `seconds` of calls."""
    calls, start = 0, time.process_time()
    while time.process_time() - start < seconds:
        call()
        calls += 1
    return (time.process_time() - start) / calls * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gpus", type=int, default=32, help="MIG GPUs (the soak's MIG node: 32)")
    p.add_argument("--holders", default="1,3,10,30")
    p.add_argument("--operator-path", default=str(REPO / "operator"))
    args = p.parse_args()
    sys.path.insert(0, args.operator_path)
    catalog_module = importlib.import_module("gpusizer.catalog")
    eff = importlib.import_module("gpusizer.efficiency")
    parse = importlib.import_module("gpusizer.signals.parse")
    queries = importlib.import_module("gpusizer.signals.queries")
    usage = importlib.import_module("gpusizer.signals.usage")
    catalog = catalog_module.load_catalog()
    whole = catalog.slice("gpu-h100", "h100-80gb")
    small = catalog.slice("mig-1g.10gb", "h100-80gb")
    whole_pods = [eff.ServingPod(("soak", f"whole-{i}"), whole, 1, WINDOW) for i in range(2)]
    # the current holders of instance 1 of the first two GPUs
    mig_pods = [eff.ServingPod(("soak", f"w{g:03d}-1-0"), small, 1, WINDOW) for g in range(2)]
    per_pod = {
        name: parse.PodSamples({p.key: parse.Sample(value, 0) for p in whole_pods + mig_pods})
        for name, value in (
            (queries.REQUESTS, 1000.0),
            (queries.OUTPUT_TOKENS, 9000.0),
            (queries.PROMPT_TOKENS, 5000.0),
            (queries.ENERGY, 300.0 * WINDOW * 1e3),
            (queries.POWER, 300.0),
        )
    }
    print(f"operator: {args.operator_path}")
    print("holders  instance series  whole-GPU workload us/call  MIG workload us/call")
    for holders in (int(h) for h in args.holders.split(",")):
        history = usage.UsageHistory(
            WINDOW, 0.0, signals=per_pod, instances=instance_series(args.gpus, holders, parse)
        )
        mig_found = eff.efficiency(history, mig_pods, catalog)
        assert mig_found.joules is not None, mig_found.unknown  # the split found both pods
        whole_us = per_call_us(lambda h=history: eff.efficiency(h, whole_pods, catalog))
        mig_us = per_call_us(lambda h=history: eff.efficiency(h, mig_pods, catalog))
        series = sum(len(v) for v in history.instances.values())
        print(f"{holders:7d}  {series:15d}  {whole_us:26.0f}  {mig_us:20.0f}")


if __name__ == "__main__":
    main()
