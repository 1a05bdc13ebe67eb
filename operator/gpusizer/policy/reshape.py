"""The rollout rule for a reshape: finished, still going, or to be rolled back. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum


class Progress(StrEnum):
    DONE = "Done"
    WAITING = "Waiting"
    ROLL_BACK = "RollBack"


@dataclass(frozen=True)
class NewPods:
    """The pods already on the new slice."""

    ready: int
    total: int
    unschedulable: Sequence[str]  # the scheduler's messages for pods it cannot place
    oom_kills: int


def reshape_progress(
    pods: NewPods, wanted: int, started: float, deadline_seconds: float, now: float
) -> tuple[Progress, str]:
    """Done when `wanted` pods are ready on the new slice; rolled back at once when the new
    slice is too small (OOM), or when the deadline passes first, saying what held it up."""
    if pods.ready >= max(1, wanted):
        return Progress.DONE, f"{pods.ready} pod(s) ready on the new slice"
    if pods.oom_kills > 0:
        return Progress.ROLL_BACK, (
            f"pods on the new slice ran out of GPU memory ({pods.oom_kills} OOM restart(s))"
        )
    elapsed = now - started
    if elapsed < deadline_seconds:
        return Progress.WAITING, (
            f"{pods.ready}/{wanted} ready on the new slice after {elapsed:.0f}s "
            f"(deadline {deadline_seconds:g}s)"
        )
    if pods.unschedulable:
        why = f"{len(pods.unschedulable)} pod(s) could not be scheduled: {pods.unschedulable[0]}"
    elif pods.total == 0:
        why = "no pod on the new slice was created"
    else:
        why = f"only {pods.ready}/{wanted} pod(s) became ready"
    return Progress.ROLL_BACK, f"not ready within {deadline_seconds:g}s: {why}"
