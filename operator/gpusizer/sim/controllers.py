"""The controllers replayed: gpusizer's own policy and the baselines, as the real systems behave
with their defaults (see docs/simulate.md and reference/autoscalers.md)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Any, TypeVar

import numpy as np

from gpusizer.api.v1alpha1 import WorkloadSizingSpec
from gpusizer.policy.replicas import History, ReplicaCounts, Signals, decide_replicas
from gpusizer.sim.fleet import FleetView, IntArray
from gpusizer.sim.trace import FloatArray

HPA_SYNC_SECONDS = 15.0


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
            startup_seconds=view.startup_seconds,
        )
        signals = Signals(
            gpu_utilization=view.gpu_utilization,
            queue_total=view.queue_total,
            wake_demand=view.wake_demand,
            kv_cache_usage=view.kv_cache_usage,
            request_rate=view.request_rate,
        )
        decision = decide_replicas(self.spec, counts, signals, self.history, view.now)
        if decision.desired != view.current:
            self.history = decision.history.with_scale_event(
                view.now, view.current, decision.desired
            )
        else:
            self.history = decision.history
        return decision.desired


@dataclass(frozen=True)
class HpaConfig:
    """An autoscaling/v2 HorizontalPodAutoscaler as the simulator runs it. Defaults are the
    API's (pkg/apis/autoscaling/v2/defaults.go, kube-controller-manager flags); the targets are
    the Pods metrics a user exposes through prometheus-adapter, each AverageValue."""

    target_utilization: float | None = 85.0  # DCGM_FI_DEV_GPU_UTIL per pod, percent
    target_queue: float | None = 4.0  # vllm:num_requests_waiting per pod
    target_kv_cache: float | None = None  # vllm:kv_cache_usage_perc per pod, 0-1
    min_replicas: int = 1
    max_replicas: int = 100
    tolerance: float = 0.1
    scale_up_window_seconds: float = 0.0
    scale_down_window_seconds: float = 300.0
    scale_up_pods: int = 4  # scaleUp policies: Pods 4 and Percent 100 per 15 s, selectPolicy Max
    scale_up_percent: float = 100.0
    scale_down_percent: float = 100.0  # scaleDown policy: Percent 100 per 15 s
    period_seconds: float = 15.0


@dataclass
class HpaBehavior:
    """The HPA controller's normalizeDesiredReplicasWithBehaviors (horizontal.go): the
    recommendation first recorded is the replicas the target had when the HPA first saw it
    (recordInitialRecommendation), then stabilisation over the stored recommendations, then the
    rate limits of the scale events of the last period, then min/max."""

    config: HpaConfig
    recommendations: list[tuple[float, int]] = field(default_factory=list)
    events: list[tuple[float, int]] = field(default_factory=list)  # (time, signed change)

    def normalize(self, now: float, current: int, recommended: int) -> int:
        c = self.config
        if not self.recommendations:
            self.recommendations.append((now, current))  # recordInitialRecommendation
        up_cut, down_cut = now - c.scale_up_window_seconds, now - c.scale_down_window_seconds
        up = min([recommended, *(n for t, n in self.recommendations if t > up_cut)])
        down = max([recommended, *(n for t, n in self.recommendations if t > down_cut)])
        self.recommendations = [
            (t, n) for t, n in self.recommendations if t > min(up_cut, down_cut)
        ]
        self.recommendations.append((now, recommended))
        desired = min(max(current, up), down)
        self.events = [(t, d) for t, d in self.events if t > now - c.period_seconds]
        added = sum(d for _, d in self.events if d > 0)
        deleted = -sum(d for _, d in self.events if d < 0)
        period_start = current - added + deleted
        if desired > current:
            limit = max(
                period_start + c.scale_up_pods,
                math.ceil(period_start * (1 + c.scale_up_percent / 100) - 1e-9),
            )
            desired = min(desired, max(limit, current), c.max_replicas)
        elif desired < current:
            limit = int(period_start * (1 - c.scale_down_percent / 100))
            desired = max(desired, min(limit, current), c.min_replicas)
        if desired != current:
            self.events.append((now, desired - current))
        return desired


def pods_metric_replicas(
    current: int,
    mean: float,
    target: float,
    *,
    observed: int,
    missing: int,
    unready: int,
    tolerance: float,
) -> int:
    """replica_calculator.go calcPlainMetricReplicas for a Pods metric (AverageValue).

    `observed` pods have a sample (their mean is `mean`); `missing` pods are running without
    one (ready after the sample); `unready` pods are Pending (starting). Missing pods count as
    the target on a scale-down and as 0 on a scale-up; unready ones as 0, and only on a
    scale-up. A correction that flips the direction, or lands within the tolerance, keeps the
    current count."""
    ratio = mean / target
    rebalance_unready = unready > 0 and ratio > 1.0
    if not rebalance_unready and missing == 0:
        if abs(1.0 - ratio) <= tolerance:
            return current
        return math.ceil(ratio * observed - 1e-9)
    total, count = mean * observed, observed
    if missing > 0:
        total += target * missing if ratio < 1.0 else 0.0
        count += missing
    if rebalance_unready:
        count += unready
    new_ratio = total / count / target
    if abs(1.0 - new_ratio) <= tolerance or (ratio < 1.0 < new_ratio) or (new_ratio < 1.0 < ratio):
        return current
    return math.ceil(new_ratio * count - 1e-9)


class HpaController:
    """autoscaling/v2 on Pods metrics (prometheus-adapter over DCGM and vLLM): GPU
    utilisation, and optionally the queue and the KV cache; the largest proposal wins.

    Starting pods are Pending (pulling the image, loading weights before the server listens):
    groupPods sets them aside. Ready pods that the sample does not cover have no metric yet:
    missing. With no metric for any ready pod a metric is invalid; invalid metrics never let
    the count fall (computeReplicasForMetrics)."""

    holds_requests = False
    period_seconds = HPA_SYNC_SECONDS

    def __init__(self, config: HpaConfig) -> None:
        self.config = config
        self.behavior = HpaBehavior(config)

    def _metrics(self, view: FleetView) -> list[tuple[float | None, float]]:
        c = self.config
        samples = max(view.observed, 1)
        queue = None if view.queue_total is None else view.queue_total / samples
        pairs = [
            (view.gpu_utilization, c.target_utilization),
            (queue, c.target_queue),
            (view.kv_cache_usage, c.target_kv_cache),
        ]
        return [(value, target) for value, target in pairs if target is not None]

    def decide(self, view: FleetView) -> int:
        c = self.config
        current = view.current
        if current == 0 and c.min_replicas != 0:
            return 0  # ScalingDisabled: the target was scaled to zero by someone else
        if current > c.max_replicas:
            return c.max_replicas
        if current < c.min_replicas:
            return c.min_replicas
        proposals, invalid = [], 0
        for value, target in self._metrics(view):
            if value is None or view.observed <= 0:
                invalid += 1
                continue
            proposals.append(
                pods_metric_replicas(
                    current,
                    value,
                    target,
                    observed=view.observed,
                    missing=view.unobserved,
                    unready=view.starting,
                    tolerance=c.tolerance,
                )
            )
        if not proposals or (invalid and max(proposals) < current):
            return current  # FailedGetPodsMetric: no change
        return self.behavior.normalize(view.now, current, max(proposals))


@dataclass(frozen=True)
class KedaConfig:
    """A KEDA ScaledObject with Prometheus triggers (AverageValue, the default metric type).

    The default is the vLLM production-stack's (tutorials/assets/keda-scaled-object.yaml and
    its Helm chart): `vllm:num_requests_waiting` with threshold 5, minReplicaCount 1,
    pollingInterval 15, cooldownPeriod 360, beside a KV-cache trigger (`sum of
    vllm:kv_cache_usage_perc`, threshold 0.7 per replica, as KEDA users add one). With
    minReplicaCount 0 KEDA itself decides 0 <-> 1; `keepalive` adds the production-stack's
    scale-to-zero trigger on the router's request rate (`rate(...[1m]) > bool 0`, threshold 1),
    which keeps one replica while requests arrive."""

    queue_threshold: float | None = 5.0
    utilization_threshold: float | None = None  # sum of DCGM_FI_DEV_GPU_UTIL, percent
    kv_cache_threshold: float | None = 0.7
    activation_threshold: float = 0.0
    keepalive: bool = False
    min_replicas: int = 1
    max_replicas: int = 100
    polling_interval_seconds: float = 15.0
    cooldown_period_seconds: float = 360.0
    # the HPA KEDA creates: the HPA defaults unless advanced.horizontalPodAutoscalerConfig
    scale_down_window_seconds: float = 300.0
    tolerance: float = 0.1


class KedaController:
    """KEDA decides 0 <-> 1 at each poll (active when a trigger's value is above its
    activationThreshold; to zero after cooldownPeriod without activity) and the HPA it creates
    scales 1 <-> N on External metrics, AverageValue: ceil(value / threshold) outside the
    tolerance (GetExternalPerPodMetricReplicas), with no missing-pod correction.

    The queries are the servers' gauges; with no server they are empty, which
    ignoreNullValues turns into 0, so a queue trigger alone never wakes a workload at zero: its
    activation is also given the requests an ingress refused during the metric window. Nothing
    holds requests: what arrives with no ready replica is refused."""

    holds_requests = False
    period_seconds = HPA_SYNC_SECONDS

    def __init__(self, config: KedaConfig) -> None:
        self.config = config
        self.behavior = HpaBehavior(
            HpaConfig(
                min_replicas=max(1, config.min_replicas),
                max_replicas=config.max_replicas,
                tolerance=config.tolerance,
                scale_down_window_seconds=config.scale_down_window_seconds,
            )
        )
        self.last_active: float | None = None
        self.next_poll = 0.0

    def _triggers(self, view: FleetView) -> list[tuple[float, float]]:
        """(value, threshold) of each trigger; an empty result is 0 (ignoreNullValues)."""
        c = self.config
        samples = max(view.observed, 0)
        triggers = []
        if c.queue_threshold is not None:
            triggers.append((view.queue_total or 0.0, c.queue_threshold))
        if c.utilization_threshold is not None:
            triggers.append(((view.gpu_utilization or 0.0) * samples, c.utilization_threshold))
        if c.kv_cache_threshold is not None:
            triggers.append(((view.kv_cache_usage or 0.0) * samples, c.kv_cache_threshold))
        if c.keepalive:
            triggers.append((1.0 if view.request_rate > 0 else 0.0, 1.0))
        return triggers

    def decide(self, view: FleetView) -> int:
        c = self.config
        current = view.current
        triggers = self._triggers(view)
        if c.min_replicas == 0 and view.now >= self.next_poll:
            self.next_poll = view.now + c.polling_interval_seconds
            active = view.refused > 0 or any(v > c.activation_threshold for v, _ in triggers)
            if active:
                self.last_active = view.now
                if current == 0:
                    return 1
            elif current > 0 and view.now - (self.last_active or 0.0) >= (
                c.cooldown_period_seconds
            ):
                return 0
        if current == 0:
            return 0
        proposals = []
        for value, threshold in triggers:
            proposal = current
            if abs(value / (threshold * current) - 1) > c.tolerance:
                proposal = math.ceil(value / threshold - 1e-9)
            proposals.append(proposal)
        return self.behavior.normalize(view.now, current, max(proposals, default=current))


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


_Config = TypeVar("_Config", HpaConfig, KedaConfig)


def configured(config: _Config, overrides: str) -> _Config:
    """`config` with `name=value,...` overrides: a field's name with dashes for underscores;
    `none` unsets an optional target, `true`/`false` for switches. Unknown names and values
    that do not parse raise ValueError naming them."""
    names = {f.name: f for f in fields(config)}
    changes: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in overrides.split(","))):
        key, _, raw = item.partition("=")
        name = key.strip().replace("-", "_")
        if name not in names or not raw:
            known = ", ".join(n.replace("_", "-") for n in names)
            raise ValueError(f"{key.strip()!r}: expected NAME=VALUE with NAME one of {known}")
        default = getattr(config, name)
        text = raw.strip().lower()
        try:
            if isinstance(default, bool):
                if text not in ("true", "false"):
                    raise ValueError(text)
                changes[name] = text == "true"
            elif text == "none" and "None" in str(names[name].type):
                changes[name] = None
            elif isinstance(default, int) and "float" not in str(names[name].type):
                changes[name] = int(text)
            else:
                changes[name] = float(text)
        except ValueError:
            raise ValueError(f"{key.strip()}={raw.strip()!r} is not a valid value") from None
    return replace(config, **changes)


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
