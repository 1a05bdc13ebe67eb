"""Measured use over a window, for right-sizing: a few range-function queries for every pod
at once, refreshed far less often than the replica signals."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gpusizer.api.v1alpha1 import Server
from gpusizer.policy.slices import Usage
from gpusizer.signals.cache import PeriodicCache
from gpusizer.signals.parse import POD_LABELS, PodSamples, Problem
from gpusizer.signals.pods import PodInfo
from gpusizer.signals.source import PrometheusSource

PEAK_QUANTILE = 0.99

SERVED_COUNTERS: dict[Server, str] = {
    Server.VLLM: "vllm:request_success_total",
    Server.TRITON: "nv_inference_request_success",
}


def history_queries(window_seconds: int) -> dict[str, tuple[str, float, str]]:
    """signal -> (PromQL, scale, how a pod's series combine)."""
    w = f"[{window_seconds}s]"
    by = f"by ({POD_LABELS})"
    queries = {
        "peak_memory": (
            f"max {by} (quantile_over_time({PEAK_QUANTILE}, DCGM_FI_DEV_FB_USED{w}))",
            1.0,
            "max",
        ),
        "utilization": (f"avg {by} (avg_over_time(DCGM_FI_DEV_GPU_UTIL{w}))", 1.0, "mean"),
        "mig_utilization": (
            f'avg {by} (avg_over_time(DCGM_FI_PROF_GR_ENGINE_ACTIVE{{GPU_I_ID!=""}}{w}))',
            100.0,
            "mean",
        ),
    }
    for server, counter in SERVED_COUNTERS.items():
        queries[f"served:{server.value}"] = (
            f"sum {by} (rate({counter}{w}))",
            1.0,
            "sum",
        )
    return queries


@dataclass
class UsageHistory:
    window_seconds: int
    time: float
    signals: dict[str, PodSamples] = field(default_factory=dict)
    errors: dict[str, Problem] = field(default_factory=dict)


class HistoryCache:
    """The window's queries for every pod, at most once per `period_seconds` per window."""

    def __init__(
        self,
        prometheus: PrometheusSource,
        period_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._prometheus = prometheus
        self._cache: PeriodicCache[int, UsageHistory] = PeriodicCache(
            self._fetch, period_seconds, clock
        )

    async def _fetch(self, window: int) -> UsageHistory:
        history = UsageHistory(window_seconds=window, time=time.time())
        history.signals, history.errors = await self._prometheus.per_pod_batch(
            history_queries(window)
        )
        return history

    async def get(self, window: int) -> UsageHistory:
        return await self._cache.get(window)


def usage(
    history: UsageHistory, pods: Sequence[PodInfo], server: Server, now: float
) -> tuple[Usage, list[str]]:
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
    served = combine(f"served:{server.value}", ready, "sum") if server in SERVED_COUNTERS else None
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
