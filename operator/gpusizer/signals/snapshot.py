"""A read of every workload's signals, and which pods moved between two reads.

Pure: the data one read returned and comparisons between reads; `reader` does the reading.
"""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass, field

from gpusizer.signals.parse import PodKey, PodSamples, Problem, Sample
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
    """Signals taken from their own lane (SLOW_SIGNALS, `reader.read_slow`), not asked now."""

    def asked_for(self, signals: Set[str]) -> bool:
        """Whether the read asked for every one of `signals`, answered or not: it leaves out
        the OPTIONAL_SIGNALS no workload decided on when it began."""
        return all(s in self.signals or s in self.errors for s in signals)


def moved_pods(before: Snapshot | None, after: Snapshot) -> frozenset[PodKey]:
    """Pods whose utilisation or queue moved since the previous read: their workloads'
    decisions may change. A pod that appeared in or left a signal's answer moved, and so did
    every pod of a signal that failed or was not asked for in the previous read. Memory is left
    out: it sizes slices, not replicas."""
    found: set[PodKey] = set()
    for signal, samples in after.signals.items():
        if signal not in REPLICA_SIGNALS:
            continue
        new = samples.samples
        previous = before.signals.get(signal) if before is not None else None
        if previous is None:
            found.update(new)
            continue
        old = previous.samples
        found.update(old.keys() - new.keys())
        for key, sample in new.items():
            if moved(old.get(key), sample):
                found.add(key)
    return frozenset(found)


def moved(was: Sample | None, sample: Sample | None) -> bool:
    """A pod's reading of one signal moved by more than MOVE_FRACTION, or came or went."""
    if was is sample:  # merged into a moved read from the read before: not read again
        return False
    if was is None or sample is None:
        return True
    return abs(sample.value - was.value) > MOVE_FRACTION * max(
        abs(sample.value), abs(was.value), 1.0
    )


Readings = dict[tuple[str, PodKey], Sample | None]
"""A workload's pods' samples of the replica signals, by (signal, pod)."""


def readings(snapshot: Snapshot, pods: tuple[PodKey, ...]) -> Readings:
    """What `pods` showed of the replica signals in `snapshot`: None for a pod without one."""
    return {
        (signal, pod): samples.samples.get(pod)
        for signal, samples in snapshot.signals.items()
        if signal in REPLICA_SIGNALS
        for pod in pods
    }


def drifted(kept: Readings, snapshot: Snapshot) -> bool:
    """Whether any of `kept` moved in `snapshot`, a signal came or went for them, or one of
    them failed: a drift too slow to move at any one read shows here, against the readings of
    the workload's last turn."""
    for (signal, pod), was in kept.items():
        samples = snapshot.signals.get(signal)
        if samples is None or moved(was, samples.samples.get(pod)):
            return True
    signals = {signal for signal, _ in kept}
    return any(signal in REPLICA_SIGNALS and signal not in signals for signal in snapshot.signals)
