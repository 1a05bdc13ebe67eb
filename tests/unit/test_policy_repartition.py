"""One node's re-partition step by step: record and node state in, the next action out."""

from __future__ import annotations

import pytest
from gpusizer.api.partitioning import NodeStep, RepartitionRecord
from gpusizer.policy.repartition import Action, NodeNow, next_action

FROM, TO = "all-disabled", "gpusizer-0123456789ab"


def record(step: NodeStep, message: str = "") -> RepartitionRecord:
    return RepartitionRecord(
        partitioning="fleet",
        step=step,
        from_config=FROM,
        to_config=TO,
        cordoned=True,
        started="2026-01-01T00:00:00Z",
        message=message,
    )


DRAINING, CONFIGURING, ROLLING_BACK = (
    NodeStep.DRAINING,
    NodeStep.CONFIGURING,
    NodeStep.ROLLING_BACK,
)


@pytest.mark.parametrize(
    ("step", "label", "state", "pods", "terminating", "elapsed", "action", "says"),
    [
        (DRAINING, FROM, "success", ("llm/a",), 0, 10, Action.EVICT, "evicting 1"),
        (DRAINING, FROM, "success", (), 2, 10, Action.WAIT, "2 GPU pod(s) to terminate"),
        (DRAINING, FROM, "success", (), 0, 10, Action.CONFIGURE, f"applying {TO}"),
        (DRAINING, FROM, "success", ("llm/a",), 0, 100, Action.GIVE_UP, "not finished after"),
        (DRAINING, FROM, "success", (), 1, 100, Action.GIVE_UP, "1 terminating"),
        (DRAINING, "all-balanced", "success", (), 0, 10, Action.ABANDON, "someone else"),
        (CONFIGURING, TO, None, (), 0, 10, Action.WAIT, "queued"),
        (CONFIGURING, TO, "pending", (), 0, 10, Action.WAIT, "pending"),
        (CONFIGURING, TO, "success", (), 0, 10, Action.FINISH, f"applied {TO}"),
        (CONFIGURING, TO, "failed", (), 0, 10, Action.ROLL_BACK, "reported failed"),
        (CONFIGURING, TO, "pending", (), 0, 60, Action.ROLL_BACK, "within 60s"),
        (CONFIGURING, FROM, "success", (), 0, 10, Action.ABANDON, f"not {TO}"),
        (ROLLING_BACK, FROM, "pending", (), 0, 10, Action.WAIT, f"restoring {FROM}"),
        (ROLLING_BACK, FROM, "success", (), 0, 10, Action.RESTORED, "it broke"),
        (ROLLING_BACK, FROM, "failed", (), 0, 10, Action.STUCK, "stays cordoned"),
        (ROLLING_BACK, FROM, None, (), 0, 60, Action.STUCK, "no answer"),
        (ROLLING_BACK, TO, "success", (), 0, 10, Action.ABANDON, "someone else"),
    ],
)
def test_next_action(
    step: NodeStep,
    label: str,
    state: str | None,
    pods: tuple[str, ...],
    terminating: int,
    elapsed: float,
    action: Action,
    says: str,
) -> None:
    got, message = next_action(
        record(step, message="it broke"),
        NodeNow(label, state, pods, terminating),
        now=1000.0 + elapsed,
        started=1000.0,
        configure_started=1000.0,
        drain_timeout=100,
        reconfigure_timeout=60,
    )
    assert got == action, message
    assert says in message


def test_the_record_survives_its_own_annotation() -> None:
    written = record(CONFIGURING).model_copy(update={"configure_started": "2026-01-01T00:01:00Z"})
    assert RepartitionRecord.parse(written.annotation()) == written
    with pytest.raises(ValueError):
        RepartitionRecord.parse('{"step": "Draining"}')
