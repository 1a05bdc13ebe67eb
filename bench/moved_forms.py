"""What a moved read's query costs Prometheus at N pods, against other forms of it and its parts.

A moved read asks, per replica signal, which pods' values moved since the read before
(`gpusizer.signals.queries.moves_query`): two selections of every pod's series (now and at an
offset), each combined per pod, then a ratio. This runs the GPU emulator over an in-memory
cluster and a real Prometheus scraping it, as bench/full_read.py does, and asks each form
`--repeat` times in turn with `stats=all` (medians: Prometheus' own evaluation time, the whole
answer, series returned):

- `moves`: the operator's query, for GPU utilisation and for vLLM's queue;
- `per-series`: the same test on every GPU's series, the pods' series not combined first
  (a pod then moved when one of its GPUs did);
- its parts: the plain selection, the selection at the offset, the selection combined per pod
  (by the four pod labels, and by namespace and pod alone), the two combined halves' ratio, and
  per-series ratios matched on all labels or on a few.

Usage: python bench/moved_forms.py [--pods 10000] [--repeat 7]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
from pathlib import Path

from full_read import emulated_prometheus, prometheus_query_stats
from hostinfo import cpu_model

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "operator"))

from gpusizer.api.v1alpha1 import Server  # noqa: E402
from gpusizer.settings import DEFAULT_READ_PERIOD_SECONDS  # noqa: E402
from gpusizer.signals.queries import (  # noqa: E402
    GPU_UTIL,
    MOVE_FRACTION,
    MOVE_MARGIN_SECONDS,
    POD_LABELS,
    batched_signals,
    move_floor,
    moves_query,
    pod_query,
    queue_signal,
)

# what `SnapshotReader.read` asks for at the default read period
SINCE_SECONDS = DEFAULT_READ_PERIOD_SECONDS + MOVE_MARGIN_SECONDS
# short name: (the operator's signal, the labels that tell its series apart)
SIGNALS = {
    "gpu": (GPU_UTIL, "namespace, pod, UUID, GPU_I_ID"),
    "queue": (queue_signal(Server.VLLM), "namespace, pod"),
}


def forms() -> dict[str, str]:
    offset = f"offset {round(SINCE_SECONDS * 1000)}ms"
    wanted = batched_signals([Server.VLLM])
    out: dict[str, str] = {}
    for name, (signal, identity) in SIGNALS.items():
        selector, scale, combine = wanted[signal]
        floor = move_floor(signal, scale)
        then = f"{selector} {offset}"
        combined = pod_query(selector, combine, dated=False)
        ratio = f"clamp_min({selector}, {floor:g}) / clamp_min({then}, {floor:g})"
        out[f"{name} moves"] = moves_query(selector, combine, floor, SINCE_SECONDS)
        out[f"{name} per-series"] = f"abs(1 - {ratio}) > {MOVE_FRACTION}"
        out[f"{name} selection"] = selector
        out[f"{name} at offset"] = then
        out[f"{name} by 4 labels"] = combined
        out[f"{name} by 2 labels"] = combined.replace(POD_LABELS, "namespace, pod")
        out[f"{name} combined ratio"] = f"{combined} / {pod_query(then, combine, dated=False)}"
        out[f"{name} series ratio"] = f"{selector} / {then}"
        out[f"{name} ratio on few"] = f"{selector} / on ({identity}) ({then})"
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=10000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    queries = forms()
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in queries}
    with emulated_prometheus(args.pods, "gpusizer-moved-forms-") as (url, _, _):
        for _ in range(args.repeat):  # in turn, so that drift in Prometheus' load hits each
            for name, promql in queries.items():
                runs[name].append(prometheus_query_stats(url, promql))
    print(
        f"{cpu_model()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
        f"{args.pods} pods; medians of {args.repeat}, offset {SINCE_SECONDS:g} s"
    )
    print(f"{'form':<22} {'series':>7} {'eval s':>7} {'all s':>6}")
    for name, results in runs.items():
        print(
            f"{name:<22} {statistics.median(r['series'] for r in results):>7.0f} "
            f"{statistics.median(r['eval_s'] for r in results):>7.3f} "
            f"{statistics.median(r['answer_s'] for r in results):>6.3f}"
        )


if __name__ == "__main__":
    main()
