"""A read of every workload's signals, and which pods moved between two reads.

Pure: the data one read returned and comparisons between reads; `reader` does the reading.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpusizer.signals.parse import PodKey, PodSamples, Problem
from gpusizer.signals.queries import MOVE_FRACTION, REPLICA_SIGNALS


@dataclass
class Snapshot:
    """Everything the batched queries of one read returned: a full read, or a full read with
    the pods that moved since merged in (`SnapshotReader`)."""

    time: float
    signals: dict[str, PodSamples] = field(default_factory=dict)
    errors: dict[str, Problem] = field(default_factory=dict)
    full: bool = True  # whether every signal was read for every pod at `time`
    carried: frozenset[str] = frozenset()
    """Signals taken from an earlier read (SLOW_SIGNALS between their reads), not asked now."""


def moved_pods(before: Snapshot | None, after: Snapshot) -> frozenset[PodKey]:
    """Pods whose utilisation or queue moved since the previous read: their workloads'
    decisions may change. A pod that appeared in or left a signal's answer moved, and so did
    every pod of a signal that failed or was not asked for in the previous read. Memory is left
    out: it sizes slices, not replicas."""
    moved: set[PodKey] = set()
    for signal, samples in after.signals.items():
        if signal not in REPLICA_SIGNALS:
            continue
        new = samples.samples
        previous = before.signals.get(signal) if before is not None else None
        if previous is None:
            moved.update(new)
            continue
        old = previous.samples
        moved.update(old.keys() - new.keys())
        for key, sample in new.items():
            was = old.get(key)
            if was is sample:  # merged into a moved read from the read before: not read again
                continue
            if was is None or abs(sample.value - was.value) > MOVE_FRACTION * max(
                abs(sample.value), abs(was.value), 1.0
            ):
                moved.add(key)
    return frozenset(moved)
