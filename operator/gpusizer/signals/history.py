"""Measured use over a window, for right-sizing: a few range-function queries for every pod
at once, refreshed far less often than the replica signals."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gpusizer.api.v1alpha1 import Server
from gpusizer.policy.slices import Usage
from gpusizer.signals.parse import PodSamples, Problem
from gpusizer.signals.pods import PodInfo
from gpusizer.signals.source import PrometheusSource, SignalFailed

BY_POD = "namespace, pod, exported_namespace, exported_pod"
PEAK_QUANTILE = 0.99

SERVED_COUNTERS: dict[Server, str] = {
    Server.VLLM: "vllm:request_success_total",
    Server.TRITON: "nv_inference_request_success",
}


def history_queries(window_seconds: int) -> dict[str, tuple[str, float, str]]:
    """signal -> (PromQL, scale, how a pod's series combine)."""
    w = f"[{window_seconds}s]"
    queries = {
        "peak_memory": (
            f"max by ({BY_POD}) (quantile_over_time({PEAK_QUANTILE}, DCGM_FI_DEV_FB_USED{w}))",
            1.0,
            "max",
        ),
        "utilization": (f"avg by ({BY_POD}) (avg_over_time(DCGM_FI_DEV_GPU_UTIL{w}))", 1.0, "mean"),
        "mig_utilization": (
            f'avg by ({BY_POD}) (avg_over_time(DCGM_FI_PROF_GR_ENGINE_ACTIVE{{GPU_I_ID!=""}}{w}))',
            100.0,
            "mean",
        ),
    }
    for server, counter in SERVED_COUNTERS.items():
        queries[f"served:{server.value}"] = (
            f"sum by ({BY_POD}) (rate({counter}{w}))",
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
    """Single-flight per window length, refreshed every `period_seconds`."""

    def __init__(
        self,
        prometheus: PrometheusSource,
        period_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._prometheus = prometheus
        self._period = period_seconds
        self._clock = clock
        self._latest: dict[int, tuple[float, UsageHistory]] = {}
        self._inflight: dict[int, asyncio.Task[UsageHistory]] = {}

    async def _fetch(self, window: int) -> UsageHistory:
        wanted = history_queries(window)
        names = list(wanted)
        results = await asyncio.gather(
            *(
                self._prometheus.per_pod(
                    wanted[n][0], f"history:{n}", wanted[n][1], wanted[n][2], timestamps=False
                )
                for n in names
            ),
            return_exceptions=True,
        )
        history = UsageHistory(window_seconds=window, time=time.time())
        for name, outcome in zip(names, results, strict=True):
            if isinstance(outcome, SignalFailed):
                history.errors[name] = outcome.problem
            elif isinstance(outcome, BaseException):
                raise outcome
            else:
                history.signals[name] = outcome
        return history

    async def get(self, window: int) -> UsageHistory:
        cached = self._latest.get(window)
        if cached is not None and self._clock() - cached[0] < self._period:
            return cached[1]
        task = self._inflight.get(window)
        if task is None:
            task = self._inflight[window] = asyncio.create_task(self._fetch(window))
        try:
            history = await asyncio.shield(task)
        finally:
            if self._inflight.get(window) is task and task.done():
                del self._inflight[window]
        self._latest[window] = (self._clock(), history)
        return history


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
