"""Joins the cycle's per-pod samples to one workload through the pods its target owns.

Pure. A signal is known only when every ready pod has a fresh, finite sample: a partial view
of a fleet is not a smaller fleet, so it is reported as unknown with the reason.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpusizer.api.v1alpha1 import Server, WorkloadSizingSpec
from gpusizer.policy.replicas import Signals
from gpusizer.signals.parse import PodKey, PodSamples, Problem, Sample
from gpusizer.signals.pods import PodInfo
from gpusizer.signals.queries import (
    GPU_UTIL,
    KV_CACHE,
    MEMORY,
    MIG_UTIL,
    QUEUE_SERIES,
    SERVED_COUNTERS,
    queue_signal,
    request_rate_signal,
)
from gpusizer.signals.snapshot import Snapshot
from gpusizer.vocabulary import Reason


@dataclass(frozen=True)
class SignalProblem:
    signal: str  # the user-facing name: gpuUtilization, queue, wakeQuery, activator
    reason: Reason
    message: str
    # a query shared by every workload, failing since then: said as slowly as an outage
    shared_since: float | None = None

    def __str__(self) -> str:
        return f"{self.signal}: {self.reason.value}: {self.message}"


@dataclass(frozen=True)
class WorkloadSignals:
    signals: Signals
    queue_per_replica: float | None
    memory_peak_mib: float | None
    sample_age_seconds: float | None
    problems: tuple[SignalProblem, ...]
    unobserved: int = 0  # ready pods too new to have samples yet
    unscraped: int = 0  # ready pods decided on an earlier read's samples (reader._carried)


def _not_yet_observed(
    pods: Sequence[PodInfo],
    sources: Callable[[PodInfo], Sequence[PodSamples | Problem | None]],
    max_age: float,
    now: float,
    outage: tuple[float, float] | None,
) -> set[PodKey]:
    """Pods that turned ready less than maxSampleAgeSeconds before a signal was read and that
    it has no sample for: the next scrape will show them, so they are capacity on its way, not
    a hole in the data. A pod that turned ready while Prometheus was out (`outage`: the last
    one's start and end) is counted from when it came back: a restarted Prometheus scrapes its
    targets one by one, and every workload scaled up during the outage said PartialSamples
    until it had (the soak, bench/README.md)."""
    fresh = set()
    for pod in pods:
        if pod.ready_since is None:
            continue
        key = (pod.namespace, pod.name)
        seen_from = pod.ready_since
        if outage is not None and outage[0] <= pod.ready_since < outage[1]:
            seen_from = outage[1]
        if any(
            isinstance(s, PodSamples)
            and key not in s.samples
            and s.read_time(now) - seen_from < max_age
            for s in sources(pod)
        ):
            fresh.add(key)
    return fresh


def _fleet_value(
    name: str,
    pods: Sequence[PodInfo],
    source: dict[PodKey, PodSamples] | PodSamples | Problem | None,
    max_age: float,
    now: float,
) -> tuple[list[tuple[Sample, float]], SignalProblem | None]:
    """A fresh sample, with its age when read, for every pod; or the reason the fleet's value
    is unknown."""
    found: list[tuple[Sample, float]] = []
    missing: list[str] = []
    for pod in pods:
        key = (pod.namespace, pod.name)
        samples = source.get(key) if isinstance(source, dict) else source
        if isinstance(samples, Problem):
            return [], SignalProblem(name, samples.reason, samples.message)
        if samples is None:
            missing.append(pod.name)
            continue
        if key in samples.problems:
            problem = samples.problems[key]
            return [], SignalProblem(name, problem.reason, f"pod {pod.name}: {problem.message}")
        sample = samples.samples.get(key)
        if sample is None:
            missing.append(pod.name)
            continue
        age = sample.age
        if samples.held is not None:  # from a read before the one that failed: aged since
            age += now - samples.read_time(now)
            if age > max_age:
                return [], SignalProblem(
                    name,
                    samples.held.reason,
                    f"{samples.held.message} (the samples read before are past "
                    f"maxSampleAgeSeconds {max_age:g})",
                    samples.held_since,
                )
        if age > max_age:
            return [], SignalProblem(
                name,
                Reason.STALE_SAMPLES,
                f"pod {pod.name}: newest sample is {age:.0f}s old "
                f"(maxSampleAgeSeconds {max_age:g})",
            )
        found.append((sample, age))
    if missing:
        reason = Reason.PARTIAL_SAMPLES if found else Reason.NO_SAMPLES
        shown = ", ".join(missing[:5]) + ("..." if len(missing) > 5 else "")
        return [], SignalProblem(
            name, reason, f"no sample for {len(missing)} of {len(pods)} ready pod(s): {shown}"
        )
    return found, None


def workload_signals(
    spec: WorkloadSizingSpec,
    pods: Sequence[PodInfo],
    snapshot: Snapshot,
    now: float,
    custom_queue: PodSamples | Problem | None = None,
    wake: tuple[float | None, Problem | None] | None = None,
    wake_signal: str = "wakeQuery",
    outage: tuple[float, float] | None = None,
) -> WorkloadSignals:
    """`outage`: the start and end of Prometheus's last outage, if one has ended."""
    max_age = float(spec.metrics.max_sample_age_seconds)
    ready = [p for p in pods if p.ready and not p.terminating]
    problems: list[SignalProblem] = []
    ages: list[float] = []

    def batched(signal: str) -> PodSamples | Problem | None:
        if signal in snapshot.errors:
            return snapshot.errors[signal]
        return snapshot.signals.get(signal)

    queue_source: PodSamples | Problem | None = custom_queue
    if custom_queue is None and spec.metrics.server in QUEUE_SERIES:
        queue_source = batched(queue_signal(spec.metrics.server))
    fresh = _not_yet_observed(
        ready,
        lambda pod: [batched(MIG_UTIL if pod.is_mig else GPU_UTIL), queue_source],
        max_age,
        now,
        outage,
    )
    ready = [p for p in ready if (p.namespace, p.name) not in fresh]
    on_kv = spec.replicas.target_kv_cache_usage is not None
    kv_source = batched(KV_CACHE) if on_kv else None
    unscraped = sum(
        any(
            isinstance(s, PodSamples) and (p.namespace, p.name) in s.carried
            for s in (batched(MIG_UTIL if p.is_mig else GPU_UTIL), queue_source, kv_source)
        )
        for p in ready
    )

    utilization: float | None = None
    if ready:
        per_kind: dict[PodKey, PodSamples] = {}
        for pod in ready:
            source = batched(MIG_UTIL if pod.is_mig else GPU_UTIL)
            if isinstance(source, Problem):
                problems.append(SignalProblem("gpuUtilization", source.reason, source.message))
                break
            if source is not None:
                per_kind[(pod.namespace, pod.name)] = source
        else:
            found, problem = _fleet_value("gpuUtilization", ready, per_kind, max_age, now)
            if problem:
                problems.append(problem)
            else:
                utilization = sum(s.value for s, _ in found) / len(found)
                ages.extend(age for _, age in found)

    queue_total: float | None = None
    has_queue_source = bool(spec.metrics.queue_query) or spec.metrics.server != Server.NONE
    if ready and has_queue_source:
        found, problem = _fleet_value("queue", ready, queue_source, max_age, now)
        if problem:
            problems.append(problem)
        else:
            queue_total = sum(s.value for s, _ in found)
            ages.extend(age for _, age in found)

    kv_cache: float | None = None
    if ready and on_kv:
        found, problem = _fleet_value("kvCacheUsage", ready, kv_source, max_age, now)
        if problem:
            problems.append(problem)
        else:
            kv_cache = sum(s.value for s, _ in found) / len(found)
            ages.extend(age for _, age in found)

    memory_peak: float | None = None
    memory = batched(MEMORY)
    if isinstance(memory, PodSamples):
        values = [
            memory.samples[(p.namespace, p.name)].value
            for p in pods
            if (p.namespace, p.name) in memory.samples
        ]
        memory_peak = max(values) if values else None

    wake_demand: float | None = None
    if wake is not None:
        wake_demand, wake_problem = wake
        if wake_problem is not None:
            problems.append(SignalProblem(wake_signal, wake_problem.reason, wake_problem.message))

    return WorkloadSignals(
        signals=Signals(
            gpu_utilization=utilization,
            queue_total=queue_total,
            wake_demand=wake_demand,
            kv_cache_usage=kv_cache,
            request_rate=_request_rate(spec.metrics.server, ready, batched),
            unknown_reasons=tuple(str(p) for p in problems),
        ),
        queue_per_replica=(queue_total / len(ready)) if queue_total is not None and ready else None,
        memory_peak_mib=memory_peak,
        sample_age_seconds=max(ages) if ages else None,
        problems=tuple(problems),
        unobserved=len(fresh),
        unscraped=unscraped,
    )


def _request_rate(
    server: Server,
    ready: Sequence[PodInfo],
    batched: Callable[[str], PodSamples | Problem | None],
) -> float | None:
    """Requests the workload's ready pods served per second: 0 with none ready, and for a pod
    whose counter has too few samples in the window yet (it only informs the policy's learning
    and its idle rule, never a scale-down on its own); None when it cannot be read."""
    if server not in SERVED_COUNTERS:
        return None
    source = batched(request_rate_signal(server))
    if not isinstance(source, PodSamples):
        return None
    return sum(
        sample.value
        for pod in ready
        if (sample := source.samples.get((pod.namespace, pod.name))) is not None
    )
