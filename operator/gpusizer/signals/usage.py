"""A workload's measured use over a window, for right-sizing.

Pure: from the window's range queries (read by `reader.HistoryCache`) and the workload's pods.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from gpusizer.policy.slices import Usage
from gpusizer.signals.parse import LabelledValue, PodSamples, Problem
from gpusizer.signals.pods import PodInfo
from gpusizer.signals.queries import REQUESTS


@dataclass
class UsageHistory:
    """The window's range queries, per pod and signal, and per MIG instance (`HistoryCache`)."""

    window_seconds: int
    time: float
    signals: dict[str, PodSamples] = field(default_factory=dict)
    errors: dict[str, Problem] = field(default_factory=dict)
    instances: dict[str, list[LabelledValue]] = field(default_factory=dict)


def usage(history: UsageHistory, pods: Sequence[PodInfo], now: float) -> tuple[Usage, list[str]]:
    """A workload's use over the window, from its current pods; problems are listed, and a
    signal any pod lacks is left unknown rather than guessed."""
    problems = [f"{name}: {p.message}" for name, p in history.errors.items()]
    running = [p for p in pods if not p.terminating]
    ready = [p for p in running if p.ready]

    def combine(signal: str, subjects: Sequence[PodInfo], how: str) -> float | None:
        samples = history.signals.get(signal)
        if samples is None or not subjects:
            return None
        values = []
        for pod in subjects:
            sample = samples.samples.get((pod.namespace, pod.name))
            if sample is None:
                return None
            values.append(sample.value)
        if how == "max":
            return max(values)
        if how == "sum":
            return sum(values)
        return sum(values) / len(values)

    peak = None
    memory = history.signals.get("peak_memory")
    if memory is not None:
        seen = [
            memory.samples[(p.namespace, p.name)].value
            for p in running
            if (p.namespace, p.name) in memory.samples
        ]
        peak = max(seen) if seen else None
    mig = [p for p in ready if p.is_mig]
    whole = [p for p in ready if not p.is_mig]
    parts = [
        (combine("mig_utilization", mig, "mean"), len(mig)),
        (combine("utilization", whole, "mean"), len(whole)),
    ]
    utilization = None
    if ready and all(value is not None for value, n in parts if n):
        utilization = sum((value or 0.0) * n for value, n in parts) / len(ready)
    requests = combine(REQUESTS, ready, "sum")
    served = None if requests is None else requests / history.window_seconds
    created = [p.created for p in running if p.created is not None]
    coverage = min(1.0, (now - min(created)) / history.window_seconds) if created else 0.0
    return (
        Usage(
            peak_memory_mib=peak,
            mean_utilization=utilization,
            served_rps=served,
            replicas=len(ready),
            oom_kills=sum(p.oom_kills for p in running),
            coverage=max(0.0, coverage),
        ),
        problems,
    )
