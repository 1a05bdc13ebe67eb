"""A workload's measured use over a window, for right-sizing.

Pure: from the window's range queries (read by `reader.HistoryCache`) and the workload's pods.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from gpusizer.policy.slices import Usage
from gpusizer.signals.parse import LabelledValue, PodKey, PodSamples, Problem, pod_key
from gpusizer.signals.pods import PodInfo
from gpusizer.signals.queries import REQUESTS


@dataclass(frozen=True)
class UsageHistory:
    """The window's range queries, per pod and signal, and per MIG instance (`HistoryCache`)."""

    window_seconds: int
    time: float
    signals: dict[str, PodSamples] = field(default_factory=dict)
    errors: dict[str, Problem] = field(default_factory=dict)
    instances: dict[str, list[LabelledValue]] = field(default_factory=dict)
    # the instance series by GPU (UUID), each by query, and the GPUs each pod held an instance
    # of: built once per read of the window (`instances_of`)
    _by_gpu: dict[str, dict[str, list[LabelledValue]]] = field(
        init=False, repr=False, compare=False
    )
    _gpus_of: dict[PodKey, set[str]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_gpu: dict[str, dict[str, list[LabelledValue]]] = {}
        gpus_of: dict[PodKey, set[str]] = {}
        for name, series in self.instances.items():
            for item in series:
                gpu = item.labels.get("UUID")
                if not gpu:
                    continue
                by_gpu.setdefault(gpu, {}).setdefault(name, []).append(item)
                pod = pod_key(item.labels)
                if pod is not None:
                    gpus_of.setdefault(pod, set()).add(gpu)
        object.__setattr__(self, "_by_gpu", by_gpu)
        object.__setattr__(self, "_gpus_of", gpus_of)

    def instances_of(self, pods: Iterable[PodKey]) -> dict[str, list[LabelledValue]]:
        """Per query, the series of every GPU on which one of `pods` held an instance in the
        window, its neighbours' included: what splitting those GPUs' energy needs. Every
        workload's turn asks this, and the window holds a series for every pod that held an
        instance in it, so it grows with every pod that came and went: a turn must cost its
        own GPUs, not all of them (bench/efficiency_turn.py)."""
        found: dict[str, list[LabelledValue]] = {}
        gpus = {gpu for pod in pods for gpu in self._gpus_of.get(pod, ())}
        for gpu in sorted(gpus):
            for name, series in self._by_gpu[gpu].items():
                found.setdefault(name, []).extend(series)
        return found


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
