"""Sparse and bursty traces of our own: seeded generators, some shaped by public data.

    python bench/traces.py --out DIR [--traces-dir ../shared/traces]

writes each trace as a `timestamp_s,requests` CSV (the shared format); bench/decision_quality.py
builds them in memory. Every trace is a function of its seed, so the files are not kept.

- `sparse-sessions-*`: an internal assistant over three weeks. People open sessions on weekdays
  (more in the morning and the afternoon, a few in the evening, almost none at night and at
  weekends), and in a session send a request every few minutes (exponential gaps, mean 150 s,
  about 7 requests). `-a` adds a report job at 09:00 on weekdays (20 requests within two
  minutes); `-b` (another seed) has none and twice the sessions.
- `sparse-servegen`: the ServeGen m-large 14-day shape (Alibaba, Apache-2.0, in the shared
  traces) as the envelope of session starts, scaled down to about 4 sessions an hour: a long-tail
  model whose demand follows a real diurnal and weekly pattern.
- `reasoning-long`: a reasoning model with long outputs over 8 hours: requests arrive at about
  0.3 per second with a two-hour swell, each with thousands of output tokens (log-normal, median
  3,000), so a replica serves few per second and each burst of a few requests matters.
- `short-bursts-*`: 4 hours of 1 req/s with bursts of +10 req/s lasting 20-60 s, 2-8 minutes
  apart: every burst is shorter than a GPU start-up.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
from gpusizer.sim.trace import FloatArray, Trace, load_trace

BIN_SECONDS = 5.0
DAY = 86400.0


def _binned(name: str, arrivals: FloatArray, duration: float) -> Trace:
    bins = math.ceil(duration / BIN_SECONDS)
    index = np.minimum((arrivals / BIN_SECONDS).astype(np.int64), bins - 1)
    counts = np.bincount(index[arrivals < duration], minlength=bins).astype(np.float64)
    return Trace(name, BIN_SECONDS, counts)


def _sessions(rng: np.random.Generator, starts: FloatArray) -> FloatArray:
    """Each session: geometric(0.15) requests (mean 6.7), exponential gaps of mean 150 s."""
    arrivals = []
    for start in starts.tolist():
        n = int(rng.geometric(0.15))
        arrivals.append(start + np.concatenate(([0.0], np.cumsum(rng.exponential(150.0, n - 1)))))
    return np.concatenate(arrivals) if arrivals else np.zeros(0)


def _thinned(rng: np.random.Generator, rate: Callable[[FloatArray], FloatArray], peak: float,
             duration: float) -> FloatArray:  # fmt: skip
    """Arrival times of a Poisson process of `rate` (per second), by thinning."""
    n = rng.poisson(peak * duration)
    times = np.sort(rng.uniform(0.0, duration, n))
    return times[rng.uniform(0.0, peak, n) < rate(times)]


def _office_rate(sessions_per_hour: float) -> Callable[[FloatArray], FloatArray]:
    """Session starts per second: weekdays 8-18 h with two humps, evenings, quiet nights and
    weekends (UTC, from the epoch: the simulator's clock starts there)."""

    def rate(t: FloatArray) -> FloatArray:
        hour = (t % DAY) / 3600.0
        weekday = (t // DAY + 3) % 7 < 5  # t = 0 is the epoch, a Thursday
        work = (hour >= 8) & (hour < 18)
        humps = (
            1.0
            + 0.6 * np.exp(-(((hour - 10.5) / 1.5) ** 2))
            + 0.5 * np.exp(-(((hour - 15.0) / 1.5) ** 2))
        )
        evening = (hour >= 18) & (hour < 23)
        per_hour = np.where(
            weekday,
            np.where(work, sessions_per_hour * humps, np.where(evening, 0.15, 0.02)),
            0.08,
        )
        return per_hour / 3600.0

    return rate


def sparse_sessions(seed: int, *, report_job: bool, sessions_per_hour: float) -> Trace:
    rng = np.random.default_rng(seed)
    duration = 21 * DAY
    rate = _office_rate(sessions_per_hour)
    starts = _thinned(rng, rate, 2.0 * sessions_per_hour / 3600.0, duration)
    arrivals = [_sessions(rng, starts)]
    if report_job:
        for day in range(21):
            if (day + 3) % 7 < 5:
                at = day * DAY + 9 * 3600.0 + rng.normal(0.0, 60.0)
                arrivals.append(at + rng.uniform(0.0, 120.0, 20))
    name = f"sparse-sessions-{'a' if report_job else 'b'}"
    return _binned(name, np.sort(np.concatenate(arrivals)), duration)


def sparse_servegen(seed: int, servegen: Trace) -> Trace:
    rng = np.random.default_rng(seed)
    shape = servegen.counts / servegen.counts.mean()
    duration = servegen.duration
    per_second = 4.0 / 3600.0  # sessions per second on average

    def rate(t: FloatArray) -> FloatArray:
        return per_second * shape[np.minimum((t / servegen.bin_seconds).astype(np.int64),
                                             len(shape) - 1)]  # fmt: skip

    starts = _thinned(rng, rate, per_second * float(shape.max()), duration)
    return _binned("sparse-servegen", np.sort(_sessions(rng, starts)), duration)


def reasoning_long(seed: int) -> Trace:
    rng = np.random.default_rng(seed)
    duration = 8 * 3600.0

    def rate(t: FloatArray) -> FloatArray:
        return 0.3 * (1.0 + 0.6 * np.sin(2 * np.pi * t / 7200.0))

    return _binned("reasoning-long", _thinned(rng, rate, 0.5, duration), duration)


def short_bursts(seed: int) -> Trace:
    rng = np.random.default_rng(seed)
    duration = 4 * 3600.0
    edges = []
    t = rng.uniform(60.0, 300.0)
    while t < duration:
        length = rng.uniform(20.0, 60.0)
        edges.append((t, t + length))
        t += length + rng.uniform(120.0, 480.0)

    def rate(x: FloatArray) -> FloatArray:
        busy = np.zeros_like(x)
        for low, high in edges:
            busy[(x >= low) & (x < high)] = 10.0
        return 1.0 + busy

    return _binned(f"short-bursts-{seed}", _thinned(rng, rate, 11.0, duration), duration)


def generated(traces_dir: Path) -> list[Trace]:
    """Every generated trace; sparse-servegen only when the shared ServeGen file is there."""
    traces = [
        sparse_sessions(1, report_job=True, sessions_per_hour=1.0),
        sparse_sessions(2, report_job=False, sessions_per_hour=2.0),
        reasoning_long(3),
        short_bursts(4),
        short_bursts(5),
    ]
    servegen = traces_dir / "servegen-m-large-10min.csv"
    if servegen.exists():
        traces.append(sparse_servegen(6, load_trace(servegen)))
    return traces


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--traces-dir", type=Path, default=Path("../shared/traces"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for trace in generated(args.traces_dir):
        rows = "".join(
            f"{i * trace.bin_seconds:g},{int(c)}\n" for i, c in enumerate(trace.counts.tolist())
        )
        (args.out / f"{trace.name}.csv").write_text("timestamp_s,requests\n" + rows)
        print(f"{trace.name}: {trace.total:,.0f} requests over {trace.duration / 86400:.2f} days")
    return 0


if __name__ == "__main__":
    sys.exit(main())
