"""The soak's faults make their edits through the other faults: an edit sent while the API
server restarts waits for it, instead of leaving the fault half done; and none in a quiet run."""

from __future__ import annotations

import pytest
import urllib3
from kubernetes.client.exceptions import ApiException

from e2e.soak import faults
from e2e.soak.__main__ import parse_args, ready_by_node
from e2e.tests.conftest import KubectlFailed


class ControlPlane:
    """An API server that answers its readiness check once it has failed `down_for` times."""

    def __init__(self, down_for: int = 0) -> None:
        self.down_for = down_for
        self.checks = 0

    def ready(self) -> bool:
        self.checks += 1
        return self.checks > self.down_for


class Edit:
    """Fails with `failures` in turn, then returns "done"."""

    def __init__(self, *failures: Exception) -> None:
        self.failures = list(failures)
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return "done"


def test_an_edit_waits_for_the_api_server_and_retries_what_a_restart_refuses() -> None:
    control_plane = ControlPlane(down_for=3)
    edit = Edit(
        ApiException(status=503, reason="the request has been made before all known HTTP paths"),
        urllib3.exceptions.ProtocolError("Connection aborted", ConnectionResetError()),
        # a killed replica's start mints its token with kubectl (seed 39)
        KubectlFailed(1, ["kubectl", "create", "token"], stderr="connection refused"),
    )
    assert faults._through_control_plane(control_plane.ready, edit) == "done"
    assert edit.calls == 4
    assert control_plane.checks == 3 + 4  # down three times, then ready before each attempt


def test_an_edit_the_api_server_refuses_for_itself_is_not_retried() -> None:
    edit = Edit(ApiException(status=422, reason="Unprocessable Entity"))
    with pytest.raises(ApiException):
        faults._through_control_plane(ControlPlane().ready, edit)
    assert edit.calls == 1


def test_an_edit_that_keeps_failing_fails_the_fault() -> None:
    edit = Edit(*(ApiException(status=500) for _ in range(faults.EDIT_ATTEMPTS)))
    with pytest.raises(ApiException):
        faults._through_control_plane(ControlPlane().ready, edit)
    assert edit.calls == faults.EDIT_ATTEMPTS


class Clock:
    """A clock each pause moves on; `answering` says, in turn, whether the API server answers."""

    def __init__(self, *answering: bool) -> None:
        self.now = 0.0
        self.answering = list(answering)

    def ready(self) -> bool:
        return self.answering.pop(0) if len(self.answering) > 1 else self.answering[0]

    def pause(self, seconds: float) -> None:
        self.now += seconds


def test_a_take_over_is_timed_only_while_the_api_server_answers() -> None:
    clock = Clock(*[False] * 60, True)  # a minute away, then back
    polls = iter([False] * 80 + [True])  # taken over 80 s in: 20 s of answering
    faults._wait_while_the_api_answers(
        clock.ready, lambda: next(polls), 30, "a take-over", lambda: clock.now, clock.pause
    )
    assert clock.now == 80

    clock = Clock(True)
    with pytest.raises(TimeoutError, match="30s of the API server answering"):
        faults._wait_while_the_api_answers(
            clock.ready, lambda: False, 30, "a take-over", lambda: clock.now, clock.pause
        )
    assert clock.now == 31


def test_the_pods_a_node_hides_come_from_a_view_read_after_the_fault_began() -> None:
    """Seed 36: a view one tick old still showed w171's pod, deleted half a second before."""

    def pod(node: str, ready: bool = True) -> dict[str, object]:
        return {"node": node, "ready": ready}

    older = [{"name": "w171", "pods": [pod("n7"), pod("n1")], "viewedAt": 99.5}]
    assert ready_by_node(older, since=100.0) is None
    assert ready_by_node(older) == {"n7": {"w171"}, "n1": {"w171"}}
    later = [
        {"name": "w171", "pods": [pod("n1")], "viewedAt": 100.5},
        {"name": "w031", "pods": [pod("n7"), pod("n2", ready=False)], "viewedAt": 100.6},
    ]
    assert ready_by_node(later, since=100.0) == {"n1": {"w171"}, "n7": {"w031"}}


def test_a_quiet_run_is_asked_for_with_zero_and_a_negative_period_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert parse_args(["--fault-every", "0"]).fault_every == 0
    with pytest.raises(SystemExit):
        parse_args(["--fault-every", "-3"])
    assert "--fault-every: -3 is negative; 0 means no faults" in capsys.readouterr().err
