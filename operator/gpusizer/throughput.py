"""Throughput learned from the fleet: what one fully busy replica serves on each slice a
workload (or another running the same model, image and arguments) has run on, and the rule
that puts those measurements in place of the catalog's estimate.

Pure: from the window's readings, the pods and the measurements the statuses keep.

A measurement is the requests and output tokens per second the serving pods served, over the
utilisation they were busy at: what a replica serves when fully busy. It is taken from the pods
that served through the whole window (a counter that starts inside it is seen from its first
scrape, which counts a pod's first seconds short), only when every serving pod runs on the
slice, and when the utilisation is high enough for its one-percent steps not to dominate.
Utilisation is not linear in throughput on every server (batching serves more at the same busy
share), so the figure is the workload's own at the load it had, which is why it replaces the
catalog only for pairs of slices measured alike.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpusizer.catalog import Slice
from gpusizer.signals.parse import PodSamples
from gpusizer.signals.pods import PodInfo
from gpusizer.signals.queries import OUTPUT_TOKENS, REQUESTS
from gpusizer.signals.usage import UsageHistory

SliceKey = tuple[str, str]  # (slice name, product key), as Slice.key

MIN_UTILIZATION = 10.0
"""Percent: below it a measurement is not taken (GPU_UTIL moves in steps of one percent)."""
DEFAULT_SURPRISE_SHARE = 0.2
"""A move whose measured throughput differs from its prediction by more is reported."""

REQUESTS_UNIT = "requests"
TOKENS_UNIT = "outputTokens"


@dataclass(frozen=True)
class Measurement:
    """What one fully busy replica served on a slice, per second, measured at `utilization`."""

    slice: str
    product: str
    fingerprint: str
    requests_per_second: float
    output_tokens_per_second: float | None
    utilization: float  # percent, the serving pods' mean while ready
    time: float

    @property
    def key(self) -> SliceKey:
        return (self.slice, self.product)

    def rate(self, unit: str) -> float | None:
        return self.output_tokens_per_second if unit == TOKENS_UNIT else self.requests_per_second


def fingerprint(pod_spec: Mapping[str, Any] | None, container: str | None) -> str | None:
    """What makes two workloads serve alike: the GPU container's image, command and arguments
    (the model is one of them). A move changes only resources and the node selector, so a
    workload keeps its fingerprint across slices."""
    for c in (pod_spec or {}).get("containers") or []:
        if container is not None and c.get("name") != container:
            continue
        limits = (c.get("resources") or {}).get("limits") or {}
        if container is None and not any(str(r).startswith("nvidia.com/") for r in limits):
            continue
        what = {k: c.get(k) for k in ("image", "command", "args")}
        return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]
    return None


def measure(
    history: UsageHistory,
    serving: Sequence[PodInfo],
    on: Slice,
    fingerprint_: str,
) -> Measurement | None:
    """The workload's throughput per fully busy replica on `on`, from its serving pods (all on
    `on`) that were ready for the whole window, or None when none was or the window does not
    show it well enough (see the module's docstring)."""
    window, at = float(history.window_seconds), history.time
    util_signal = "mig_utilization" if on.profile is not None else "utilization"
    utilization = history.signals.get(util_signal)
    requests, tokens = history.signals.get(REQUESTS), history.signals.get(OUTPUT_TOKENS)
    if utilization is None or requests is None:
        return None
    whole = [
        (p.namespace, p.name)
        for p in serving
        if p.ready_since is not None and p.ready_since <= at - window
    ]
    measured = [
        key
        for key in whole
        if key in utilization.samples
        and key in requests.samples
        and requests.samples[key].value >= 0
    ]
    if not measured or len(measured) < len(whole):
        return None
    busy = sum(utilization.samples[key].value for key in measured) / 100
    if busy * 100 / len(measured) < MIN_UTILIZATION:
        return None
    has_tokens = tokens is not None and all(key in tokens.samples for key in measured)
    return Measurement(
        slice=on.name,
        product=on.product.key,
        fingerprint=fingerprint_,
        requests_per_second=sum(requests.samples[k].value for k in measured) / window / busy,
        output_tokens_per_second=sum(_rate(tokens, k, window) for k in measured) / busy
        if has_tokens
        else None,
        utilization=busy * 100 / len(measured),
        time=at,
    )


def _rate(samples: PodSamples | None, key: tuple[str, str], seconds: float) -> float:
    if samples is None or key not in samples.samples:
        return 0.0
    return max(0.0, samples.samples[key].value) / seconds


class ThroughputBook:
    """What each workload's status says it measured: each turn reports its workload's, so
    after a restart the book is whole again within one sync period, and a deleted workload's
    measurements go with it. The newest of each slice per fingerprint is kept as it comes:
    a turn reads it without going over every workload."""

    def __init__(self) -> None:
        self._by_workload: dict[tuple[str, str], tuple[Measurement, ...]] = {}
        self._newest: dict[str, dict[SliceKey, Measurement]] = {}

    def learn(self, workload: tuple[str, str], measurements: Iterable[Measurement]) -> None:
        new = tuple(measurements)
        old = self._by_workload.get(workload, ())
        if new == old:
            return
        self._by_workload[workload] = new
        dropped = {m.fingerprint for m in old if m not in new}
        for m in new:
            known = self._newest.setdefault(m.fingerprint, {})
            if m.fingerprint not in dropped and (m.key not in known or known[m.key].time < m.time):
                known[m.key] = m
        self._recount(dropped)

    def forget(self, workload: tuple[str, str]) -> None:
        gone = self._by_workload.pop(workload, ())
        self._recount({m.fingerprint for m in gone})

    def measured(self, fingerprint_: str | None) -> dict[SliceKey, Measurement]:
        """The newest measurement of each slice among the workloads serving alike."""
        return dict(self._newest.get(fingerprint_, {})) if fingerprint_ else {}

    def _recount(self, fingerprints: set[str]) -> None:
        """After a measurement went: rare (a workload deleted or changed its image)."""
        for fingerprint_ in fingerprints:
            newest: dict[SliceKey, Measurement] = {}
            for measurements in self._by_workload.values():
                for m in measurements:
                    if m.fingerprint == fingerprint_ and (
                        m.key not in newest or newest[m.key].time < m.time
                    ):
                        newest[m.key] = m
            self._newest[fingerprint_] = newest


@dataclass(frozen=True)
class Capacities:
    """Measured throughput per fully busy replica, by slice, in one unit for all."""

    per_slice: Mapping[SliceKey, float]
    unit: str

    def ratio(self, current: Slice, other: Slice) -> float | None:
        """How much faster `other` serves than `current`, when both were measured."""
        mine, theirs = self.per_slice.get(current.key), self.per_slice.get(other.key)
        if mine is None or theirs is None or mine <= 0:
            return None
        return theirs / mine


def capacities(measured: Mapping[SliceKey, Measurement]) -> Capacities:
    """Output tokens per second when every measurement has them, else requests per second."""
    unit = TOKENS_UNIT
    if not measured or any(m.output_tokens_per_second is None for m in measured.values()):
        unit = REQUESTS_UNIT
    per_slice = {key: m.rate(unit) for key, m in measured.items()}
    return Capacities({k: v for k, v in per_slice.items() if v is not None and v > 0}, unit)


def predicted_rate(capacity: Capacities, current: Slice, to: Slice) -> float | None:
    """What a fully busy replica on `to` should serve: the current slice's measured figure
    times the measured ratio, or the catalog's when `to` has not been measured."""
    mine = capacity.per_slice.get(current.key)
    if mine is None:
        return None
    ratio = capacity.ratio(current, to)
    if ratio is None:
        ratio = to.relative_throughput / current.relative_throughput
    return mine * ratio


def surprise(predicted: float, measured: float) -> float:
    """By how much the outcome missed the prediction, as a share of the prediction."""
    return measured / predicted - 1 if predicted > 0 else 0.0
