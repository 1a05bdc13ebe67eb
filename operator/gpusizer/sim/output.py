"""Replay results as a table, as JSON and as a plot of load and replicas over time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib
import numpy as np

from gpusizer.sim.replay import Result
from gpusizer.sim.trace import Trace

matplotlib.use("Agg")

_COLUMNS = ("policy", "GPU-hours", "cost", "within SLO", "dropped", "scale events", "vs optimal")


def as_json(trace: Trace, parameters: dict[str, Any], results: dict[str, Result]) -> dict[str, Any]:
    return {
        "trace": trace.name,
        "parameters": parameters,
        "policies": {name: result.as_json() for name, result in results.items()},
    }


def table(results: dict[str, Result], *, title: str = "") -> str:
    rows = [_COLUMNS]
    for name, r in results.items():
        ratio = "-" if r.vs_optimal is None else f"{r.vs_optimal:.2f}x"
        rows.append(
            (
                name,
                f"{r.gpu_hours:.2f}",
                f"{r.cost:.2f}",
                f"{100 * r.slo_attainment:.2f}%",
                f"{r.run.dropped:.0f}",
                str(r.run.scale_events),
                ratio,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
    lines = [title] if title else []
    for i, row in enumerate(rows):
        cells = [row[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)
        ]
        lines.append("  ".join(cells))
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def plot(
    trace: Trace, tick_seconds: float, capacity_rps: float, results: dict[str, Result], path: Path
) -> None:
    """Load (as replicas' worth of requests) and each policy's replicas over time."""
    from matplotlib import pyplot as plt

    hours = trace.duration > 4 * 3600
    scale = 3600.0 if hours else 60.0
    fig, ax = plt.subplots(figsize=(12, 5))
    for name, r in results.items():
        times = np.arange(len(r.run.replicas)) * tick_seconds / scale
        ax.step(times, r.run.replicas, where="post", label=name, linewidth=0.8, alpha=0.8)
    width = max(trace.bin_seconds, 60.0)
    load = trace.rebinned(width)
    load_times = np.arange(len(load.counts)) * width / scale
    ax.step(
        load_times,
        load.counts / width / capacity_rps,
        where="post",
        color="black",
        linewidth=1.2,
        zorder=10,
        label="load (replicas fully busy)",
    )
    ax.set_xlabel("hours" if hours else "minutes")
    ax.set_ylabel("replicas")
    ax.set_title(f"{trace.name}: load and replicas")
    ax.legend(loc="upper right", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
