"""One node's re-partition, step by step, through NVIDIA's mig-manager protocol. Pure.

Cordoned (with the record) -> its GPU pods evicted, PodDisruptionBudgets permitting -> the
`nvidia.com/mig.config` label set -> mig-manager's `nvidia.com/mig.config.state=success` ->
uncordoned. A `failed` state, or none within the deadline, restores the previous config; a
label someone else changed ends gpusizer's part at once. The record (`RepartitionRecord`)
lives on the node, so every step can be taken again by a restarted operator without a second
drain.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from gpusizer.api.partitioning import NodeStep, RepartitionRecord

SUCCESS = "success"
FAILED = "failed"


class Action(StrEnum):
    WAIT = "Wait"
    EVICT = "Evict"  # the GPU pods still on the node
    CONFIGURE = "Configure"  # set the label to the new config
    ROLL_BACK = "RollBack"  # set the label back to the previous config
    FINISH = "Finish"  # uncordon (if we cordoned) and drop the record: the new layout is on
    RESTORED = "Restored"  # uncordon and drop the record: the previous layout is back
    GIVE_UP = "GiveUp"  # uncordon and drop the record: the drain did not finish in time
    ABANDON = "Abandon"  # uncordon and drop the record: someone else changed the label
    STUCK = "Stuck"  # the rollback failed too: leave the node cordoned for a person


@dataclass(frozen=True)
class NodeNow:
    """What the node shows now."""

    label: str | None  # nvidia.com/mig.config
    state: str | None  # nvidia.com/mig.config.state
    gpu_pods: tuple[str, ...]  # namespace/name of its GPU pods not yet terminating
    terminating: int  # its GPU pods on their way out


def next_action(
    record: RepartitionRecord,
    node: NodeNow,
    now: float,
    started: float,
    configure_started: float | None,
    drain_timeout: float,
    reconfigure_timeout: float,
) -> tuple[Action, str]:
    """The next thing to do for a node in flight, and the line that says why."""
    if record.step == NodeStep.DRAINING:
        if node.label != record.from_config:
            return Action.ABANDON, _changed(node, record.from_config)
        waited = now - started
        left = node.gpu_pods or node.terminating
        if left and waited >= drain_timeout:
            return Action.GIVE_UP, (
                f"drain not finished after {drain_timeout:g}s ({len(node.gpu_pods)} GPU pod(s) "
                f"left, {node.terminating} terminating); left as it was"
            )
        if node.gpu_pods:
            return Action.EVICT, f"evicting {len(node.gpu_pods)} GPU pod(s)"
        if node.terminating:
            return Action.WAIT, f"waiting for {node.terminating} GPU pod(s) to terminate"
        return Action.CONFIGURE, f"drained; applying {record.to_config}"
    target = record.to_config if record.step == NodeStep.CONFIGURING else record.from_config
    if node.label != target:
        return Action.ABANDON, _changed(node, target)
    elapsed = now - (configure_started if configure_started is not None else now)
    late = elapsed >= reconfigure_timeout
    if record.step == NodeStep.CONFIGURING:
        if node.state == SUCCESS:
            return Action.FINISH, f"mig-manager applied {record.to_config}"
        if node.state == FAILED:
            return Action.ROLL_BACK, f"mig-manager reported failed for {record.to_config}"
        if late:
            return Action.ROLL_BACK, (
                f"mig-manager did not report success for {record.to_config} within "
                f"{reconfigure_timeout:g}s (state {node.state or 'not set'})"
            )
        return Action.WAIT, f"mig-manager applying {record.to_config} ({node.state or 'queued'})"
    if node.state == SUCCESS:
        return Action.RESTORED, f"restored {record.from_config}: {record.message}"
    if node.state == FAILED or late:
        return Action.STUCK, (
            f"restoring {record.from_config} failed too ({node.state or 'no answer'}) after: "
            f"{record.message}; the node stays cordoned for a person to look at"
        )
    return Action.WAIT, f"restoring {record.from_config} ({node.state or 'queued'})"


def _changed(node: NodeNow, expected: str) -> str:
    return (
        f"nvidia.com/mig.config is {node.label or 'not set'}, not {expected}: someone else "
        "changed it during the re-partition; the node is left to them"
    )
