"""The offline optimum: the fewest GPU-hours that serve the trace within the SLO, knowing it all."""

from __future__ import annotations

import math

import numpy as np

from gpusizer.sim.fleet import FleetParams, IntArray
from gpusizer.sim.trace import FloatArray


def optimal_schedule(arrivals: FloatArray, params: FleetParams) -> IntArray:
    """Replicas to ask for at each tick, with perfect foresight.

    1. Ready replicas per tick, forward and greedy: in tick k the fleet must finish everything
       that arrived by (end of tick k) - slo, so it needs ceil(that backlog / per-replica
       service in a tick) ready replicas, and uses them fully (work-conserving), which carries
       the queue over into the next tick. Fewer in any tick misses a deadline; more can save at
       most as many replica-ticks later as it costs now, so the greedy count is minimal for
       every prefix of the trace.
    2. Start-up: a replica that must serve at tick k is asked for startup seconds earlier and
       paid from then. Stacking the per-tick counts into layers (layer j is busy where the count
       is >= j), a layer is held at tick k iff it is busy somewhere in [k, k + startup]: that
       both starts it in time and keeps it through any idle gap shorter than a restart (keeping
       costs the gap, a restart costs the start-up). The number of layers held at k is the
       sliding maximum of the counts over that window.

    Replicas never serve while they wait through a gap, so the bound is exact only up to one
    tick of rounding; it is still what no online policy, which must also guess, can beat.
    """
    dt = params.tick_seconds
    per_replica = params.capacity_rps * dt
    n = len(arrivals)
    cumulative = np.concatenate(([0.0], np.cumsum(arrivals)))
    edges = np.arange(n + 1, dtype=np.float64) * dt
    due = np.interp(edges[1:] - params.slo_wait_seconds, edges, cumulative)
    ahead = max(1, round(params.startup_seconds / dt))
    ticks_to = np.arange(1, ahead + 1, dtype=np.float64) * per_replica
    needed = [0] * n
    removed = 0.0
    for k, arrived in enumerate(cumulative[1:].tolist()):
        window = due[k : k + ahead]
        rate = float(((window - removed) / ticks_to[: len(window)]).max())
        ready = max(0, math.ceil(rate - 1e-9))
        needed[k] = ready
        removed = min(arrived, removed + ready * per_replica)
    return _sliding_max(np.asarray(needed, dtype=np.int64), ahead)


def _sliding_max(values: IntArray, ahead: int) -> IntArray:
    """max(values[k : k + ahead + 1]) for every k, by doubling windows (log ahead passes)."""
    result = values.copy()
    span = 1
    while span <= ahead:
        step = min(span, ahead + 1 - span)
        shifted = np.concatenate((result[step:], np.zeros(step, dtype=np.int64)))
        result = np.maximum(result, shifted)
        span += step
    return result
