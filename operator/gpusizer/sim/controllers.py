"""The controllers replayed: gpusizer's own policy and the baselines, as the real systems behave
with their defaults (see docs/simulate.md and reference/autoscalers.md)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from gpusizer.api.v1alpha1 import WorkloadSizingSpec
from gpusizer.policy.replicas import History, ReplicaCounts, Signals, decide_replicas
from gpusizer.sim.fleet import FleetView, IntArray
from gpusizer.sim.trace import FloatArray

HPA_SYNC_SECONDS = 15.0
HPA_TOLERANCE = 0.1
HPA_DOWN_WINDOW_SECONDS = 300.0
HPA_UP_PODS = 4  # scale-up: max(+4 pods, +100 %) per 15 s
HPA_PERIOD_SECONDS = 15.0
KEDA_POLLING_SECONDS = 30.0
KEDA_COOLDOWN_SECONDS = 300.0


class GpusizerController:
    """The operator's loop: decide_replicas on the fleet's signals, history kept as the operator
    persists it (a scale event only for a change that was made)."""

    holds_requests = True  # scale to zero comes with a gateway that holds requests

    def __init__(self, spec: WorkloadSizingSpec, period_seconds: float = 15.0) -> None:
        self.spec = spec
        self.period_seconds = period_seconds
        self.history = History()

    def decide(self, view: FleetView) -> int:
        counts = ReplicaCounts(
            current=view.current,
            ready=view.ready,
            starting=view.starting,
            unobserved=view.unobserved,
        )
        signals = Signals(
            gpu_utilization=view.gpu_utilization,
            queue_total=view.queue_total,
            wake_demand=view.wake_demand,
        )
        decision = decide_replicas(self.spec, counts, signals, self.history, view.now)
        if decision.desired != view.current:
            self.history = decision.history.with_scale_event(
                view.now, view.current, decision.desired
            )
        else:
            self.history = decision.history
        return decision.desired


@dataclass
class HpaBehavior:
    """HPA's default behaviour: stabilisation (0 s up, 300 s down) and rate limits (up
    max(+4 pods, +100 %) per 15 s, down 100 % per 15 s), then min/max."""

    minimum: int
    maximum: int
    recommendations: list[tuple[float, int]] = field(default_factory=list)
    events: list[tuple[float, int]] = field(default_factory=list)  # (time, signed change)

    def normalize(self, now: float, current: int, recommended: int) -> int:
        window_start = now - HPA_DOWN_WINDOW_SECONDS
        self.recommendations = [(t, n) for t, n in self.recommendations if t > window_start]
        down = max([recommended, *(n for _, n in self.recommendations)])
        self.recommendations.append((now, recommended))
        desired = min(max(current, recommended), down)
        self.events = [(t, d) for t, d in self.events if t > now - HPA_PERIOD_SECONDS]
        if desired > current:
            start = current - sum(d for _, d in self.events if d > 0)
            desired = min(desired, max(current, start + HPA_UP_PODS, 2 * start))
        desired = min(max(desired, self.minimum), self.maximum)
        if desired != current:
            self.events.append((now, desired - current))
        return desired


class HpaController:
    """autoscaling/v2 on a Pods metric of GPU utilisation (prometheus-adapter + DCGM).

    Starting pods are Pending: HPA's groupPods puts them with the unready, which count as 0 %
    when the ready ones say "up" (and the rise is dropped if that flips the direction)."""

    holds_requests = False
    period_seconds = HPA_SYNC_SECONDS

    def __init__(self, target_utilization: float, minimum: int, maximum: int) -> None:
        self.target = target_utilization
        self.behavior = HpaBehavior(max(1, minimum), maximum)

    def decide(self, view: FleetView) -> int:
        if view.current == 0 or view.gpu_utilization is None or view.ready == 0:
            return view.current  # no metrics: HPA reports an error and changes nothing
        ratio = view.gpu_utilization / self.target
        recommended = view.current
        if view.starting > 0 and ratio > 1:
            diluted = ratio * view.ready / view.current
            if diluted > 1 + HPA_TOLERANCE:
                recommended = max(view.current, math.ceil(diluted * view.current))
        elif abs(ratio - 1) > HPA_TOLERANCE:
            recommended = math.ceil(ratio * view.ready)
        return self.behavior.normalize(view.now, view.current, recommended)


class KedaController:
    """A ScaledObject with a Prometheus trigger on queue depth: KEDA decides 0 <-> 1 every
    polling interval (active when the value is above 0, to zero after the cooldown), and the HPA
    it creates scales 1 <-> N on the External metric with an AverageValue target.

    The query is the servers' queue gauge; with no server it is empty, which ignoreNullValues
    turns into 0, so KEDA alone would never wake: its activation is given, in addition, the
    requests an ingress refused during the metric window. Nothing holds requests: what arrives
    with no ready replica is refused."""

    holds_requests = False
    period_seconds = HPA_SYNC_SECONDS

    def __init__(self, threshold: float, maximum: int) -> None:
        self.threshold = threshold
        self.behavior = HpaBehavior(1, maximum)
        self.last_active = 0.0
        self.next_poll = 0.0

    def decide(self, view: FleetView) -> int:
        value = view.queue_total or 0.0  # ignoreNullValues: empty is 0
        current = view.current
        if view.now >= self.next_poll:
            self.next_poll += KEDA_POLLING_SECONDS
            if value + view.refused > 0:
                self.last_active = view.now
                if current == 0:
                    return 1
            elif current > 0 and view.now - self.last_active >= KEDA_COOLDOWN_SECONDS:
                return 0
        if current == 0:
            return 0
        recommended = current
        if abs(value / (self.threshold * current) - 1) > HPA_TOLERANCE:
            recommended = math.ceil(value / self.threshold)
        return self.behavior.normalize(view.now, current, recommended)


class StaticController:
    """A fixed fleet sized for the trace's peak, ready from the start."""

    holds_requests = False
    period_seconds = math.inf

    def __init__(self, replicas: int) -> None:
        self.replicas = replicas

    def decide(self, view: FleetView) -> int:
        return self.replicas


class ScheduleController:
    """Replays a replica count per tick computed in advance (the offline optimum)."""

    holds_requests = True

    def __init__(self, schedule: IntArray, tick_seconds: float) -> None:
        self.schedule = schedule
        self.period_seconds = tick_seconds

    def decide(self, view: FleetView) -> int:
        k = min(round(view.now / self.period_seconds), len(self.schedule) - 1)
        return int(self.schedule[k])


def initial_replicas(rate: float, capacity_rps: float, utilization_percent: float) -> int:
    """Replicas for the opening load at the target utilisation: every online policy starts so."""
    return max(1, math.ceil(rate / (capacity_rps * utilization_percent / 100.0) - 1e-9))


def opening_rate(arrivals: FloatArray, tick: float, horizon: float) -> float:
    """The busiest minute's mean rate within the first `horizon` seconds.

    The horizon is the start-up time plus a minute: no policy can change its ready capacity
    before that, so starting every online policy warm for it scores control, not cold start."""
    minute = max(1, round(60.0 / tick))
    head = arrivals[: max(minute, round(horizon / tick))]
    sums = np.convolve(head, np.ones(minute), mode="valid") if len(head) >= minute else head
    return float(sums.max()) / (minute * tick)
