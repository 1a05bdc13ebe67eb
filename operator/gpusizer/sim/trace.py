"""Request traces for replay: the shared CSV format and Prometheus range-query exports.

A trace is held as its cumulative arrival curve with knots at the bin edges: arrivals are spread
evenly inside a bin, so the curve is linear between knots and can be read at any time, which is
what lets the simulator use any tick and any bin width.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]

PEAK_WINDOW_SECONDS = 60.0


@dataclass(frozen=True)
class Trace:
    """Requests per bin, bins of equal width counted from the start of the trace."""

    name: str
    bin_seconds: float
    counts: FloatArray

    @property
    def duration(self) -> float:
        return self.bin_seconds * len(self.counts)

    @property
    def total(self) -> float:
        return float(self.counts.sum())

    def cumulative(self, times: FloatArray) -> FloatArray:
        """Requests arrived by each time (linear inside a bin: arrivals spread evenly)."""
        edges = np.arange(len(self.counts) + 1, dtype=np.float64) * self.bin_seconds
        cum = np.concatenate(([0.0], np.cumsum(self.counts)))
        return np.interp(times, edges, cum)

    def rebinned(self, bin_seconds: float) -> Trace:
        """The same arrivals in wider (or narrower) bins, spread evenly again inside each."""
        n = math.ceil(self.duration / bin_seconds - 1e-9)
        edges = np.arange(n + 1, dtype=np.float64) * bin_seconds
        return Trace(self.name, bin_seconds, np.diff(self.cumulative(edges)))

    def peak_rate(self) -> float:
        """The busiest minute's mean rate (req/s): the busiest bin's when bins are a minute or
        longer. A minute, not a second, because a second's burst is what the queue absorbs and
        the SLO allows; sizing on it would make every fleet look idle."""
        if self.bin_seconds >= PEAK_WINDOW_SECONDS:
            return float(self.counts.max()) / self.bin_seconds
        step = self.bin_seconds
        times = np.arange(0.0, self.duration + step / 2, step)
        cum = self.cumulative(times)
        width = max(1, round(PEAK_WINDOW_SECONDS / step))
        if len(cum) <= width:
            return self.total / self.duration
        return float((cum[width:] - cum[:-width]).max()) / (width * step)


def load_trace(path: Path) -> Trace:
    """A `timestamp_s,requests,...` CSV or a Prometheus /api/v1/query_range JSON export."""
    text = path.read_text()
    if path.suffix == ".json" or text.lstrip().startswith("{"):
        return _from_prometheus(path.stem, json.loads(text))
    return _from_csv(path.stem, text)


def _bins(name: str, times: list[float], counts: list[float]) -> Trace:
    if len(times) < 2:
        raise ValueError(f"{name}: a trace needs at least two time bins")
    start = times[0]
    step = float(np.median(np.diff(times)))
    if step <= 0:
        raise ValueError(f"{name}: timestamps must increase")
    index = np.rint((np.asarray(times) - start) / step).astype(np.int64)
    binned = np.zeros(int(index[-1]) + 1)
    np.add.at(binned, index, np.asarray(counts, dtype=np.float64))
    return Trace(name, step, binned)


def _from_csv(name: str, text: str) -> Trace:
    rows = csv.reader(line for line in text.splitlines() if line.strip())
    header = next(rows)
    if header[:2] != ["timestamp_s", "requests"]:
        raise ValueError(f"{name}: expected a header starting with timestamp_s,requests")
    times: list[float] = []
    counts: list[float] = []
    for row in rows:
        times.append(float(row[0]))
        counts.append(float(row[1]))
    return _bins(name, times, counts)


def _from_prometheus(name: str, payload: dict[str, Any]) -> Trace:
    """One series of request rates (req/s) per step: NaN or missing steps count as no
    requests, since an export's gaps are scrape gaps, not load."""
    result = payload.get("data", {}).get("result", [])
    if payload.get("data", {}).get("resultType") != "matrix" or len(result) != 1:
        raise ValueError(f"{name}: expected a query_range matrix with exactly one series")
    values = result[0]["values"]
    times = [float(t) for t, _ in values]
    rates = [float(v) for _, v in values]
    step = float(np.median(np.diff(times))) if len(times) > 1 else 1.0
    counts = [0.0 if math.isnan(r) else r * step for r in rates]
    return _bins(name, times, counts)
