"""A serving fleet replayed tick by tick: replicas, start-up, one FIFO queue, per-request waits.

The model, in the order a tick applies it:

- A replica requested at t serves from t + startup; it holds (and costs) a GPU from t.
  Scaling down removes starting replicas first (the newest), then ready ones.
- Arrivals are spread evenly inside the tick. With no ready replica they wait at the activator
  if the controller has one (`holds_requests`), up to `max_held` (its maxPendingRequests times
  its replicas; the rest are refused, answered 503), else they are refused: dropped at once.
- Service is a fluid: ready x capacity x tick requests leave the head of the queue.
- A request still waiting drop_after_seconds after it arrived is dropped (the client gave up);
  with an activator, also one still waiting hold_timeout_seconds after (answered 504).
- FIFO makes waits exact without tracking requests: the request that made admitted(t) reach x
  has started service by t + slo iff removed(t + slo) >= x, so the share served within the SLO
  is read off the two cumulative curves afterwards, in numpy.

Controllers see live replica counts (the API server) and metrics as Prometheus would show them:
averaged over a window that ends metric_delay_seconds ago.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt
from tqdm import tqdm

from gpusizer.sim.trace import FloatArray, Trace

IntArray = npt.NDArray[np.int64]
_EPS = 1e-9
_SUBSAMPLES = 4  # points per tick at which waits are measured
_PROGRESS_CHUNK = 5000
# Sequences in flight on a fully busy replica: the mean in flight is this x the busy share, and
# with Poisson arrivals a kernel runs whenever at least one is, 1 - exp(-in flight) of the time.
FULL_BATCH = 16


@dataclass(frozen=True)
class FleetParams:
    capacity_rps: float  # requests per second one replica serves at the latency target
    startup_seconds: float = 120.0
    slo_wait_seconds: float = 5.0
    drop_after_seconds: float = 60.0
    metric_delay_seconds: float = 15.0  # scrape interval plus exporter and query lag
    metric_window_seconds: float = 15.0  # gauges averaged over one scrape interval
    rate_window_seconds: float = 60.0  # counters read as rate(...[1m])
    tick_seconds: float = 1.0
    # GPU utilisation as the busy share (served / capacity), or as DCGM_FI_DEV_GPU_UTIL reads on
    # an LLM server: the share of time a kernel runs, which one request in flight fills
    kernel_active_utilization: bool = False
    max_held: float = math.inf  # what the activator holds while no replica is ready
    hold_timeout_seconds: float = math.inf  # a request held longer is answered 504


@dataclass(frozen=True)
class FleetView:
    """What a controller sees at `now`."""

    now: float
    current: int  # replicas asked for: ready + starting
    ready: int
    starting: int
    unobserved: int  # ready now, but not yet when the metrics were sampled
    gpu_utilization: float | None  # mean percent busy of ready replicas; None with none ready
    queue_total: float | None  # waiting at the servers; None when no server reports
    wake_demand: float  # held at the gateway while no replica is ready
    refused: float  # refused for want of a ready replica during the metric window
    # mean share (0-1) of the KV cache in use on the ready replicas: the running batch's share
    # of a full one, which in this fluid model is the busy share (see docs/simulate.md)
    kv_cache_usage: float | None = None
    request_rate: float = 0.0  # arrivals per second over the rate window, as the metrics show
    startup_seconds: float | None = None  # measured time to Ready; None before any start-up

    @property
    def observed(self) -> int:
        """Ready replicas the metrics sample covers."""
        return self.ready - self.unobserved


class Controller(Protocol):
    period_seconds: float
    holds_requests: bool

    def decide(self, view: FleetView) -> int:
        """Replicas wanted now."""
        ...


@dataclass(frozen=True)
class Run:
    """One controller's replay of one trace."""

    replicas: IntArray  # asked for, per tick
    ready: IntArray  # serving, per tick
    gpu_seconds: float
    arrived: float
    within_slo: float
    dropped: float
    scale_events: int
    cold: float = 0.0  # arrived while no replica was ready: met a cold start (or a refusal)


def tick_arrivals(trace: Trace, tick_seconds: float) -> FloatArray:
    """Requests arriving in each tick."""
    n = math.ceil(trace.duration / tick_seconds - _EPS)
    edges = np.arange(n + 1, dtype=np.float64) * tick_seconds
    return np.diff(trace.cumulative(edges))


def simulate(
    arrivals: FloatArray,
    params: FleetParams,
    controller: Controller,
    initial_replicas: int,
    *,
    label: str = "",
    quiet: bool = True,
) -> Run:
    """Replay per-tick arrivals through the fleet under `controller`; replicas start ready."""
    dt = params.tick_seconds
    n = len(arrivals)
    per_replica = params.capacity_rps * dt
    delay = round(params.metric_delay_seconds / dt)
    window = max(1, round(params.metric_window_seconds / dt))
    rate_window = max(1, round(params.rate_window_seconds / dt))
    holds = controller.holds_requests
    measured_startup: float | None = None
    gives_up = params.drop_after_seconds
    if holds:
        gives_up = min(gives_up, params.hold_timeout_seconds)
    drop_lag = gives_up / dt

    ready = initial_replicas
    starting: deque[float] = deque()
    queue = 0.0
    admitted = [0.0] * (n + 1)  # cumulative, at tick edges
    removed = [0.0] * (n + 1)  # cumulative served + dropped, at tick edges
    served_cum = [0.0] * (n + 1)
    capacity_cum = [0.0] * (n + 1)
    refused_cum = [0.0] * (n + 1)
    arrived_cum = [0.0] * (n + 1)
    queue_end = [0.0] * n
    ready_hist = [0] * n
    replica_hist = [0] * n
    gpu_ticks = 0
    cold = 0.0
    dropped = 0.0
    events = 0
    next_decision = 0.0
    bar = tqdm(total=n, desc=label, unit="tick", disable=quiet, leave=False)
    for k, arriving in enumerate(arrivals.tolist()):
        now = k * dt
        while starting and starting[0] <= now + _EPS:
            starting.popleft()
            ready += 1
            measured_startup = params.startup_seconds
        if now >= next_decision - _EPS:
            next_decision += controller.period_seconds
            seen = max(0, k - delay)
            low = max(0, seen - window)
            capacity = capacity_cum[seen] - capacity_cum[low]
            last_ready = ready_hist[seen - 1] if seen > 0 else ready
            last_queue = queue_end[seen - 1] if seen > 0 else 0.0
            busy = (served_cum[seen] - served_cum[low]) / capacity if capacity > 0 else None
            rate_low = max(0, seen - rate_window)
            view = FleetView(
                now=now,
                current=ready + len(starting),
                ready=ready,
                starting=len(starting),
                unobserved=max(0, ready - last_ready),
                gpu_utilization=None if busy is None else 100.0 * _utilization(busy, params),
                queue_total=last_queue if last_ready > 0 else None,
                wake_demand=last_queue if last_ready == 0 and holds else 0.0,
                refused=refused_cum[seen] - refused_cum[low],
                kv_cache_usage=busy,
                request_rate=(arrived_cum[seen] - arrived_cum[rate_low])
                / (max(1, seen - rate_low) * dt),
                startup_seconds=measured_startup,
            )
            desired = max(0, controller.decide(view))
            current = ready + len(starting)
            if desired != current:
                events += 1
            for _ in range(desired - current):
                starting.append(now + params.startup_seconds)
            excess = current - desired
            while excess > 0 and starting:
                starting.pop()
                excess -= 1
            ready -= max(0, excess)
        refused = 0.0
        arrived_cum[k + 1] = arrived_cum[k] + arriving
        if ready == 0:
            cold += arriving
            if not holds:
                refused, arriving = arriving, 0.0
            else:  # held by the activator, within its bound
                room = max(0.0, params.max_held - queue)
                refused, arriving = max(0.0, arriving - room), min(arriving, room)
        backlog = queue + arriving
        served = min(backlog, ready * per_replica)
        queue = backlog - served
        admitted[k + 1] = admitted[k] + arriving
        gone = removed[k] + served
        limit_at = k + 1 - drop_lag
        if limit_at > 0:
            base = math.floor(limit_at)
            frac = limit_at - base
            limit = admitted[base] + frac * (admitted[min(base + 1, n)] - admitted[base])
            if gone < limit - _EPS:
                dropped += limit - gone
                queue -= limit - gone
                gone = limit
        removed[k + 1] = gone
        served_cum[k + 1] = served_cum[k] + served
        capacity_cum[k + 1] = capacity_cum[k] + ready * per_replica
        refused_cum[k + 1] = refused_cum[k] + refused
        queue_end[k] = queue
        ready_hist[k] = ready
        replica_hist[k] = ready + len(starting)
        gpu_ticks += ready + len(starting)
        if k % _PROGRESS_CHUNK == _PROGRESS_CHUNK - 1:
            bar.update(_PROGRESS_CHUNK)
    bar.close()
    within = _within_slo(np.asarray(admitted), np.asarray(removed), dt, params.slo_wait_seconds)
    return Run(
        replicas=np.asarray(replica_hist, dtype=np.int64),
        ready=np.asarray(ready_hist, dtype=np.int64),
        gpu_seconds=gpu_ticks * dt,
        arrived=float(arrivals.sum()),
        within_slo=within,
        dropped=dropped + refused_cum[n],
        scale_events=events,
        cold=cold,
    )


def _utilization(busy: float, params: FleetParams) -> float:
    if params.kernel_active_utilization:
        return 1.0 - math.exp(-FULL_BATCH * busy)
    return busy


def _within_slo(admitted: FloatArray, removed: FloatArray, dt: float, slo: float) -> float:
    """Admitted requests whose service started within `slo` of their arrival (FIFO)."""
    n = len(admitted) - 1
    edges = np.arange(n + 1, dtype=np.float64) * dt
    offsets = (np.arange(_SUBSAMPLES) + 0.5) / _SUBSAMPLES
    times = (np.arange(n)[:, None] + offsets[None, :]).ravel() * dt
    index = np.interp(times, edges, admitted)
    started = np.interp(times + slo, edges, removed)
    weight = np.repeat(np.diff(admitted) / _SUBSAMPLES, _SUBSAMPLES)
    return float(weight[started >= index - 1e-6 * (1.0 + index)].sum())
