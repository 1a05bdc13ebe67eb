"""Request-rate sources: a constant rate, or a recorded trace replayed faster than real time."""

from __future__ import annotations

import bisect
import csv
import itertools
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Protocol


class RateSource(Protocol):
    def rate(self, t: float) -> float:
        """Requests per second at time t."""
        ...

    def arrivals(self, t0: float, t1: float) -> float:
        """Requests arriving in [t0, t1): the integral of the rate, so ticks may be uneven."""
        ...


@dataclass(frozen=True)
class ConstantRate:
    rps: float

    def rate(self, t: float) -> float:
        return self.rps

    def arrivals(self, t0: float, t1: float) -> float:
        return self.rps * max(0.0, t1 - t0)


@dataclass(frozen=True)
class Trace:
    """Bins of a trace file: start offsets (s) and request counts; the last bin's width repeats."""

    starts: tuple[float, ...]
    requests: tuple[float, ...]

    @property
    def bin_width(self) -> float:
        return self.starts[1] - self.starts[0] if len(self.starts) > 1 else 1.0

    @cached_property
    def prefix(self) -> tuple[float, ...]:
        """Requests before each bin."""
        return (0.0, *itertools.accumulate(self.requests))

    @property
    def duration(self) -> float:
        return self.starts[-1] - self.starts[0] + self.bin_width


def load_trace(path: Path) -> Trace:
    """Parse `timestamp_s,requests[,...]` with a header; any bin width, increasing timestamps."""
    starts: list[float] = []
    requests: list[float] = []
    with path.open(newline="") as handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header is None or header[:2] != ["timestamp_s", "requests"]:
            raise ValueError(f"{path}: the header must start with timestamp_s,requests")
        for line, row in enumerate(reader, start=2):
            if not row:
                continue
            try:
                start, count = float(row[0]), float(row[1])
            except (ValueError, IndexError) as err:
                raise ValueError(f"{path}:{line}: bad row {row!r}") from err
            if (starts and start <= starts[-1]) or count < 0:
                raise ValueError(f"{path}:{line}: timestamps must increase, counts be >= 0")
            starts.append(start)
            requests.append(count)
    if not starts:
        raise ValueError(f"{path}: no rows")
    return Trace(tuple(starts), tuple(requests))


@dataclass(frozen=True)
class TraceRate:
    """A trace started at `start` (wall time), `speedup` times faster, counts times `scale`,
    from `offset` seconds into the trace (its own time), and over again from its start when
    `loop` is set (workloads replaying one trace, each shifted, for as long as a test runs).

    Arrivals are spread evenly inside each bin, so the rate is piecewise constant.
    """

    trace: Trace
    start: float
    speedup: float = 1.0
    scale: float = 1.0
    offset: float = 0.0
    loop: bool = False

    def _bin_end(self, i: int) -> float:
        starts = self.trace.starts
        return starts[i + 1] if i + 1 < len(starts) else starts[i] + self.trace.bin_width

    def _cumulative(self, offset: float) -> float:
        """Requests from the trace start up to `offset` seconds of trace time."""
        starts = self.trace.starts
        offset += starts[0]
        i = bisect.bisect_right(starts, offset) - 1
        if i < 0:
            return 0.0
        done = self.trace.prefix[i]
        width = self._bin_end(i) - starts[i]
        fraction = min(1.0, (offset - starts[i]) / width)
        return done + self.trace.requests[i] * fraction

    def _trace_time(self, t: float) -> float:
        """Seconds of trace time replayed by wall time `t`, counted from the trace's start and
        over all its loops."""
        return max(0.0, (t - self.start) * self.speedup) + self.offset

    def _requests_until(self, trace_time: float) -> float:
        duration = self.trace.duration
        if not self.loop:
            return self._cumulative(trace_time)
        loops, within = divmod(trace_time, duration)
        return loops * self.trace.prefix[-1] + self._cumulative(within)

    def rate(self, t: float) -> float:
        if t < self.start:
            return 0.0
        trace_time = self._trace_time(t)
        if self.loop:
            trace_time %= self.trace.duration
        offset = trace_time + self.trace.starts[0]
        i = bisect.bisect_right(self.trace.starts, offset) - 1
        if i < 0 or offset >= self._bin_end(i):
            return 0.0
        width = self._bin_end(i) - self.trace.starts[i]
        return self.trace.requests[i] / width * self.speedup * self.scale

    def arrivals(self, t0: float, t1: float) -> float:
        a = self._requests_until(self._trace_time(t0))
        b = self._requests_until(self._trace_time(t1))
        return (b - a) * self.scale

    def finished(self, t: float) -> bool:
        return not self.loop and self._trace_time(t) >= self.trace.duration
