"""The load model: arrivals, one queue per workload, replicas serving at their slice's speed.

Pure: no clock reads, no I/O. `tick(now, replicas)` advances it to `now` and says which pods to
mark Ready and which crash with a CUDA out-of-memory error; `restart` restarts a server.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpusizer.catalog import Slice

from e2e.gpusim.cluster import PodInfo, WorkloadKey
from e2e.gpusim.traces import ConstantRate, RateSource, TraceRate

log = logging.getLogger(__name__)

PREFIX = "gpusim.gpusizer.io/"
CAPACITY_RPS = PREFIX + "capacity-rps"
MEMORY_MIB = PREFIX + "memory-mib"
STARTUP_SECONDS = PREFIX + "startup-seconds"
MODEL_NAME = PREFIX + "model-name"
OUTPUT_TOKENS = PREFIX + "output-tokens"
PROMPT_TOKENS = PREFIX + "prompt-tokens"
SLICE_SPEED = PREFIX + "slice-speed"


@dataclass(frozen=True)
class ModelConfig:
    capacity_rps: float = 10.0
    """Requests/s one replica serves on a full H100-80GB (relative throughput 1.0)."""
    startup_seconds: float = 5.0
    memory_mib: int = 16384
    """Default model memory: an 8B model in FP16 with a small KV cache."""
    oom_backoff_seconds: float = 10.0
    """First CrashLoopBackOff delay after an OOM; doubles per restart, capped at 300 s."""
    max_batch: int = 16
    """Concurrent sequences of a fully busy replica (vllm:num_requests_running)."""
    output_tokens: float = 200.0
    """Output tokens generated per request."""
    prompt_tokens: float = 600.0
    """Prompt tokens per request."""


@dataclass(frozen=True)
class Replica:
    pod: PodInfo
    slice: Slice | None
    """None when the node's GPU or the resource is not in the catalog: such a pod never serves."""


@dataclass
class ReplicaState:
    """What one pod is doing, as of the last tick."""

    capacity_rps: float = 0.0
    memory_need_mib: int = 0
    ready: bool = False
    oom: bool = False
    utilisation: float = 0.0
    waiting: float = 0.0
    running: float = 0.0
    kv_cache_usage: float = 0.0
    success_total: float = 0.0
    generation_tokens_total: float = 0.0
    prompt_tokens_total: float = 0.0
    """The server's counters: they start from zero again when it restarts."""
    ooms: int = 0
    next_oom_at: float | None = None
    startup_seconds: float = 0.0
    output_tokens: float = 0.0  # per request
    prompt_tokens: float = 0.0
    # the pod and slice the figures above were read from: read again only when either changes
    # (its annotations, at every tick for every pod, were a large part of a tick)
    read_from: tuple[PodInfo, Slice | None] | None = None
    down_until: float | None = None
    """A restarted server is not ready before this, whatever its pod says yet."""


@dataclass
class WorkloadState:
    rate: RateSource = field(default_factory=lambda: ConstantRate(0.0))
    queue: float = 0.0
    ready_replicas: int = 0
    served_rps: float = 0.0
    served_total: float = 0.0
    output_tokens_total: float = 0.0
    prompt_tokens_total: float = 0.0
    """What it served since the emulator started, whatever its servers' restarts: ground truth."""

    @property
    def gateway_pending(self) -> float:
        """Requests held by the gateway: all of the queue while no replica is ready."""
        return self.queue if self.ready_replicas == 0 else 0.0


@dataclass(frozen=True)
class TickResult:
    mark_ready: list[PodInfo]
    ooms: list[PodInfo]


def slice_speed(annotations: Mapping[str, str], slice_name: str) -> float:
    """How much faster than the catalog says a slice serves this workload, from
    `slice-speed: "mig-2g.20gb=0.7,gpu-l4=1.2"` (1 for slices it does not name); a bad entry
    is logged and ignored."""
    for entry in annotations.get(SLICE_SPEED, "").split(","):
        name, _, factor = entry.strip().partition("=")
        if name.strip() != slice_name:
            continue
        try:
            value = float(factor)
        except ValueError:
            value = -1.0
        if value > 0:
            return value
        log.warning("annotation %s entry %r is not <slice>=<positive factor>", SLICE_SPEED, entry)
    return 1.0


def annotation(annotations: Mapping[str, str], key: str, default: float) -> float:
    """A positive number from an annotation; a bad value falls back to the default, loudly."""
    raw = annotations.get(key)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value < 0:
        log.warning("annotation %s=%r is not a non-negative number; using %s", key, raw, default)
        return default
    return value


class LoadModel:
    def __init__(self, config: ModelConfig | None = None) -> None:
        self.config = config or ModelConfig()
        self.workloads: dict[WorkloadKey, WorkloadState] = {}
        self.replicas: dict[str, ReplicaState] = {}
        self._last: float | None = None

    def workload(self, key: WorkloadKey) -> WorkloadState:
        state = self.workloads.get(key)
        if state is None:  # not setdefault: that would make a state at every call
            state = self.workloads[key] = WorkloadState()
        return state

    def set_rate(self, key: WorkloadKey, rate: RateSource) -> None:
        self.workload(key).rate = rate

    def capacity(self, replica: Replica) -> float:
        if replica.slice is None:
            return 0.0
        annotations = replica.pod.annotations
        base = annotation(annotations, CAPACITY_RPS, self.config.capacity_rps)
        speed = slice_speed(annotations, replica.slice.name)
        return base * replica.slice.relative_throughput * speed * replica.pod.count

    def restart(self, uid: str, now: float) -> bool:
        """The server of pod `uid` restarts: its counters start from zero, and it is not ready
        for its start-up time. False when the pod is not emulated."""
        state = self.replicas.get(uid)
        if state is None:
            return False
        state.success_total = state.generation_tokens_total = state.prompt_tokens_total = 0.0
        state.ready = False
        state.down_until = now
        return True

    def _tokens(self, pod: PodInfo) -> tuple[float, float]:
        """Output and prompt tokens per request."""
        return (
            annotation(pod.annotations, OUTPUT_TOKENS, self.config.output_tokens),
            annotation(pod.annotations, PROMPT_TOKENS, self.config.prompt_tokens),
        )

    def memory_need(self, pod: PodInfo) -> int:
        return int(annotation(pod.annotations, MEMORY_MIB, self.config.memory_mib))

    def fits(self, replica: Replica) -> bool:
        if replica.slice is None:
            return False
        return self.memory_need(replica.pod) <= replica.slice.memory_mib * replica.pod.count

    def tick(self, now: float, replicas: Sequence[Replica]) -> TickResult:
        dt = 0.0 if self._last is None else max(0.0, now - self._last)
        start = now - dt
        self._last = now
        live = [r for r in replicas if not r.pod.terminating]
        known = self.replicas
        self.replicas = {r.pod.uid: known.get(r.pod.uid) or ReplicaState() for r in live}
        result = TickResult(mark_ready=[], ooms=[])
        by_workload: dict[WorkloadKey, list[Replica]] = {}
        for replica in live:
            by_workload.setdefault(replica.pod.workload, []).append(replica)
            self._lifecycle(now, replica, result)
        for key in by_workload:
            self.workload(key)
        for key, state in self.workloads.items():
            self._serve(state, by_workload.get(key, []), start, now)
        return result

    def _lifecycle(self, now: float, replica: Replica, result: TickResult) -> None:
        pod, state = replica.pod, self.replicas[replica.pod.uid]
        read_from = state.read_from
        if read_from is None or read_from[0] is not pod or read_from[1] is not replica.slice:
            state.capacity_rps = self.capacity(replica)
            state.memory_need_mib = self.memory_need(pod)
            state.oom = replica.slice is not None and not self.fits(replica)
            state.startup_seconds = annotation(
                pod.annotations, STARTUP_SECONDS, self.config.startup_seconds
            )
            state.output_tokens, state.prompt_tokens = self._tokens(pod)
            state.read_from = (pod, replica.slice)
        if pod.running_since is None or replica.slice is None:
            state.ready = False
            return
        startup = state.startup_seconds
        if state.oom:
            state.ready = False
            if state.next_oom_at is None:
                state.next_oom_at = pod.running_since + startup
            if now >= state.next_oom_at:
                state.ooms += 1
                backoff = min(300.0, self.config.oom_backoff_seconds * 2 ** (state.ooms - 1))
                state.next_oom_at = now + backoff + startup
                result.ooms.append(pod)
            return
        ready_at = max(pod.running_since, state.down_until or 0.0) + startup
        state.ready = now >= ready_at
        if state.ready and not pod.ready:
            result.mark_ready.append(pod)

    def _serve(
        self, workload: WorkloadState, replicas: list[Replica], start: float, now: float
    ) -> None:
        dt = now - start
        ready = [r for r in replicas if self.replicas[r.pod.uid].ready]
        capacity = sum(self.replicas[r.pod.uid].capacity_rps for r in ready)
        available = workload.queue + workload.rate.arrivals(start, now)
        served = min(available, capacity * dt)
        workload.queue = available - served
        workload.ready_replicas = len(ready)
        workload.served_rps = served / dt if dt > 0 else 0.0
        workload.served_total += served
        if isinstance(workload.rate, TraceRate) and workload.rate.finished(now):
            workload.rate = ConstantRate(0.0)
        for replica in replicas:
            state = self.replicas[replica.pod.uid]
            if not state.ready or capacity <= 0:
                state.utilisation = state.waiting = state.running = state.kv_cache_usage = 0.0
                continue
            share = state.capacity_rps / capacity
            output, prompt = state.output_tokens, state.prompt_tokens
            state.success_total += served * share
            state.generation_tokens_total += served * share * output
            state.prompt_tokens_total += served * share * prompt
            workload.output_tokens_total += served * share * output
            workload.prompt_tokens_total += served * share * prompt
            state.utilisation = served / (capacity * dt) if dt > 0 else 0.0
            state.waiting = workload.queue * share
            state.running = state.utilisation * self.config.max_batch
            # KV cache fills with running sequences and, once full, with queued ones.
            backlog = state.waiting / self.config.max_batch
            state.kv_cache_usage = min(1.0, 0.05 + 0.85 * state.utilisation + 0.1 * backlog)
