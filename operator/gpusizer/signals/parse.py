"""Turning Prometheus query results into per-pod samples, trusting nothing in them.

Every value is checked: a result that is not the shape Prometheus documents, a value that is
NaN, infinite or not a number, a series without pod labels, all end as a recorded reason, never
as a zero. Pure functions, so hostile input is easy to test.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpusizer.signals.queries import TIMESTAMP_LABEL
from gpusizer.vocabulary import Reason

PodKey = tuple[str, str]  # (namespace, pod)


@dataclass(frozen=True, slots=True)
class Sample:
    """Slotted, smaller: a snapshot holds one per pod and signal (bench/README.md).

    The age is taken when Prometheus answered, not at the decision, which may come later when
    thousands of workloads share one snapshot; and a snapshot may merge samples of several
    reads (`SnapshotReader`), each aged at its own."""

    value: float
    age: float  # seconds from the oldest of the pod's series' samples to the read


@dataclass(frozen=True)
class Problem:
    reason: Reason
    message: str


@dataclass
class PodSamples:
    """One signal for every pod that has it: the per-pod aggregate of its GPUs' series."""

    samples: dict[PodKey, Sample] = field(default_factory=dict)
    problems: dict[PodKey, Problem] = field(default_factory=dict)
    # when Prometheus answered the read that lists every pod with the signal (None: at the
    # decision): a pod turned ready since may not be in it yet
    read_at: float | None = None
    # why a later read did not replace these samples: its query went unanswered, and they
    # stand in for it while they are fresh (reader.read_full, join); since when (wall clock of
    # the first read of the run that failed)
    held: Problem | None = None
    held_since: float | None = None
    # pods the read left out whose samples are an earlier read's, aged since (reader._carried):
    # decided on while fresh, never scaled down on
    carried: frozenset[PodKey] = frozenset()

    def read_time(self, default: float) -> float:
        """When Prometheus answered the read, else `default` (the snapshot's or the decision's
        time)."""
        return default if self.read_at is None else self.read_at


def parse_number(raw: Any) -> float | None:
    """Prometheus encodes sample values as strings; anything else is invalid."""
    if isinstance(raw, bool) or not isinstance(raw, (str, int, float)):
        return None
    try:
        value = float(raw)
    except (ValueError, OverflowError):
        return None
    return value


def pod_key(labels: Mapping[str, Any]) -> PodKey | None:
    """The pod a series belongs to: behind a ServiceMonitor without honorLabels the pod labels
    arrive as exported_pod/exported_namespace, and those name the workload's pod."""
    pod = labels.get("exported_pod") or labels.get("pod")
    namespace = labels.get("exported_namespace") or labels.get("namespace")
    if isinstance(pod, str) and isinstance(namespace, str) and pod and namespace:
        return namespace, pod
    return None


def per_pod(
    result: Any,
    *,
    scale: float = 1.0,
    combine: str = "mean",
    now: float,
) -> PodSamples:
    """Samples per pod from a `pod_query` result: each pod's series (one per pod, or several,
    its GPUs', from another query's shape) and the timestamp twins that say how old its oldest
    sample is (none: `now`, the instant query evaluated it then).

    A pod's series are combined (mean for utilisation, max for memory, sum for queues). If any
    of them is invalid, the pod is a problem, not a partial value. One pass keyed by pod, with
    nothing built per series but what a pod keeps: at 5,000 pods this runs once per signal per
    full read on the event loop, and building a label set per series to pair it with its twin
    was most of a read's CPU (bench/README.md)."""
    out = PodSamples(read_at=now)
    if not isinstance(result, list):
        return out
    oldest: dict[PodKey, float] = {}
    first: dict[PodKey, float | None] = {}
    more: dict[PodKey, list[float | None]] = {}  # pods with several series
    for item in result:
        # a decoded JSON body holds dicts, and checking for dict is cheaper than for Mapping
        if not isinstance(item, dict):
            continue
        labels = item.get("metric")
        point = item.get("value")
        if not isinstance(labels, dict) or not isinstance(point, list) or len(point) != 2:
            continue
        key = pod_key(labels)
        if key is None:
            continue  # GPUs no pod holds: real exporters serve those too
        number = parse_number(point[1])
        if labels.get(TIMESTAMP_LABEL) is not None:
            if number is not None and math.isfinite(number):
                oldest[key] = min(number, oldest.get(key, number))
        elif key in first:
            more.setdefault(key, []).append(number)
        else:
            first[key] = number
    for key, number in first.items():
        value, problem = _combined(
            [number, *more[key]] if key in more else (number,), scale, combine
        )
        if problem is not None:
            out.problems[key] = problem
        else:
            out.samples[key] = Sample(value, now - min(now, oldest.get(key, now)))
    return out


def _combined(
    numbers: Sequence[float | None], scale: float, combine: str
) -> tuple[float, Problem | None]:
    """A pod's value from its series, or the problem with them."""
    scaled = []
    for number in numbers:
        if number is None or not math.isfinite(number):
            return 0.0, Problem(Reason.INVALID_VALUE, f"value {number!r} is not finite")
        scaled.append(number * scale)
    if len(scaled) == 1:
        value = scaled[0]
    elif combine == "max":
        value = max(scaled)
    elif combine == "sum":
        value = sum(scaled)
    else:
        value = sum(scaled) / len(scaled)
    if not math.isfinite(value):  # finite huge values can still overflow when combined
        return 0.0, Problem(Reason.INVALID_VALUE, f"{combine} of {scaled} overflows")
    return value, None


def scalar(result: Any) -> tuple[float | None, Problem | None]:
    """A wake query's single value: a scalar, or a vector of exactly one element."""
    point: Any = None
    if isinstance(result, list) and len(result) == 2 and not isinstance(result[0], Mapping):
        point = result
    elif isinstance(result, list) and len(result) == 1 and isinstance(result[0], Mapping):
        point = result[0].get("value")
    elif isinstance(result, list) and not result:
        return None, Problem(Reason.NO_SAMPLES, "the query returned no series")
    elif isinstance(result, list):
        return None, Problem(
            Reason.INVALID_VALUE, f"the query returned {len(result)} series; it must return one"
        )
    if not isinstance(point, list) or len(point) != 2:
        return None, Problem(Reason.INVALID_VALUE, "the result is not a Prometheus sample")
    number = parse_number(point[1])
    if number is None or not math.isfinite(number):
        return None, Problem(Reason.INVALID_VALUE, f"value {point[1]!r} is not a finite number")
    return number, None


@dataclass(frozen=True, slots=True)
class LabelledValue:
    """One series of a result whose labels matter beyond its pod (a MIG instance's GPU, a
    workload's name)."""

    labels: Mapping[str, str]
    value: float


def labelled_values(result: Any) -> tuple[list[LabelledValue], int]:
    """Every series of an instant vector with a finite value, and how many were dropped (not
    the documented shape, a label that is not text, a value that is not a finite number)."""
    found: list[LabelledValue] = []
    dropped = 0
    for item in result if isinstance(result, list) else ():
        labels = item.get("metric") if isinstance(item, dict) else None
        point = item.get("value") if isinstance(item, dict) else None
        number = parse_number(point[1]) if isinstance(point, list) and len(point) == 2 else None
        if (
            not isinstance(labels, dict)
            or not all(isinstance(v, str) for v in labels.values())
            or number is None
            or not math.isfinite(number)
        ):
            dropped += 1
            continue
        found.append(LabelledValue(labels, number))
    return found, dropped


def pods_missing(expected: Iterable[PodKey], samples: PodSamples) -> list[PodKey]:
    return [key for key in expected if key not in samples.samples]


def merged(base: PodSamples, update: PodSamples) -> PodSamples:
    """`base` with `update`'s pods replaced: a pod is either a sample or a problem."""
    samples = {k: v for k, v in base.samples.items() if k not in update.problems}
    samples.update(update.samples)
    problems = {k: v for k, v in base.problems.items() if k not in update.samples}
    problems.update(update.problems)
    carried = base.carried - update.samples.keys() - update.problems.keys()
    return PodSamples(samples, problems, base.read_at, base.held, base.held_since, carried)
