"""The soak's judge (e2e/soak/checker.py) on made-up audit events: each wrong action it must
flag, and the right ones it must let pass."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from e2e.soak.audit import Action, parse
from e2e.soak.checker import Checker, Rules

REPO = Path(__file__).resolve().parents[2]
T = 1_800_000_000.0


def checker(**rules: Any) -> Checker:
    found = Checker(
        {
            "w": Rules("w", minimum=1, maximum=6, **rules),
            "z": Rules("z", minimum=0, maximum=4, scale_to_zero=True),
        },
        grace_seconds=10,
        owed_bound_seconds=60,
    )
    found.set_replicas("w", 3)
    found.set_replicas("z", 1)
    return found


def scale(name: str, replicas: int, t: float, code: int = 200) -> Action:
    return Action(
        t,
        "update",
        "deployments",
        "scale",
        "soak",
        name,
        code,
        request={"spec": {"replicas": replicas}},
        response={"spec": {"replicas": replicas}} if code == 200 else None,
    )


def reshape(name: str, state: str, started: str, t: float, template: bool = True) -> Action:
    record = json.dumps({"state": state, "started": started})
    request: dict[str, Any] = {"metadata": {"annotations": {"gpusizer.io/reshape": record}}}
    if template:
        request["spec"] = {"replicas": 2, "template": {"spec": {}}}
    return Action(t, "patch", "deployments", "", "soak", name, 200, request=request)


def rules_broken(c: Checker) -> list[str]:
    return [w.rule for w in c.wrong]


def test_a_right_write_passes_and_moves_the_replicas() -> None:
    c = checker()
    c.observe(scale("w", 5, T))
    c.observe(scale("w", 4, T + 30))
    assert c.wrong == [] and c.writes == 2 and c.replicas["w"] == 4


@pytest.mark.parametrize("why", ["in Recommend", "paused", "owned by an HPA"])
def test_any_write_to_a_workload_left_alone_is_wrong(why: str) -> None:
    c = checker(hands_off=why)
    c.observe(scale("w", 4, T))
    assert rules_broken(c) == ["hands off"] and why in c.wrong[0].detail


def test_outside_min_and_max_is_wrong_and_zero_only_with_scale_to_zero() -> None:
    c = checker()
    c.observe(scale("w", 7, T))
    c.observe(scale("w", 0, T + 10))
    c.observe(scale("z", 0, T + 20))
    assert rules_broken(c) == ["bounds", "bounds"]


def test_scale_down_or_to_zero_on_unknown_metrics_is_wrong_after_the_grace() -> None:
    c = checker()
    window = c.window("unknown", "prometheus-500", T)
    c.observe(scale("w", 2, T + 5))  # decided on a read from before the fault
    c.observe(scale("w", 3, T + 20))  # a scale-up on what it still knows is no harm
    c.observe(scale("w", 2, T + 30))
    c.observe(scale("z", 0, T + 30))
    window.end = T + 40
    c.observe(scale("w", 1, T + 50))
    assert rules_broken(c) == ["unknown metrics", "unknown metrics"]
    assert "scale to zero" in c.wrong[1].detail and "prometheus-500" in c.wrong[0].detail


def test_a_slice_change_to_fewer_replicas_is_no_scale_down() -> None:
    """A rollback at the reshape deadline restores 1 whole GPU from 2 slices."""
    c = checker()
    c.window("unknown", "node-scrape-down", T, names={"w"})
    c.observe(reshape("w", "RolledBack", "t1", T + 30))
    assert c.wrong == [] and c.replicas["w"] == 2


def test_unknown_metrics_of_some_workloads_only() -> None:
    c = checker()
    c.window("unknown", "node-scrape-down", T, names={"z"})
    c.observe(scale("w", 2, T + 30))
    assert c.wrong == []


def test_a_write_while_the_spec_is_invalid_is_wrong() -> None:
    c = checker()
    window = c.window("invalid", "invalid-spec", T, names={"w"})
    c.observe(scale("w", 4, T + 15))
    window.end = T + 20
    c.observe(scale("w", 5, T + 25))
    assert rules_broken(c) == ["invalid spec"]


def test_a_write_that_changes_nothing_is_a_second_write_for_one_decision() -> None:
    c = checker()
    c.observe(scale("w", 4, T))
    c.observe(scale("w", 4, T + 1))
    assert rules_broken(c) == ["duplicate"]


def test_a_write_lost_from_the_audit_log_by_a_killed_api_server_is_no_duplicate() -> None:
    c = checker()
    c.observe(scale("w", 4, T))
    c.audit_may_have_lost(T + 10)  # a PUT to 5 lands, and the API server dies unaudited
    c.observe(scale("w", 4, T + 9))  # audited before the kill, read after it
    c.observe(scale("w", 4, T + 12))
    c.observe(scale("w", 4, T + 20))
    assert rules_broken(c) == ["duplicate"], "judged again from the first write after the kill"
    assert c.writes == 4 and c.replicas["w"] == 4


def test_conflicts_and_failures_change_nothing_and_are_counted() -> None:
    c = checker()
    c.observe(scale("w", 4, T, code=409))
    c.observe(scale("w", 4, T, code=500))
    assert c.wrong == [] and c.conflicts == 1 and c.failed_writes == 1 and c.replicas["w"] == 3


def test_only_a_list_answered_counts_as_listed_again() -> None:
    c = checker()
    c.observe(Action(T, "list", "pods", "", "", "", 200))
    c.observe(Action(T + 1, "list", "nodes", "", "", "", 429))
    assert c.lists == [(T, "pods")]


def test_a_reshape_started_while_one_is_in_flight_is_wrong() -> None:
    c = checker()
    c.observe(reshape("w", "InProgress", "t1", T))
    c.observe(reshape("w", "Done", "t1", T + 60, template=False))
    c.observe(reshape("w", "InProgress", "t2", T + 120))
    c.observe(reshape("w", "InProgress", "t3", T + 130))
    assert rules_broken(c) == ["reshape twice"]


def test_a_scale_up_owed_too_long_is_wrong_unless_a_fault_excused_it() -> None:
    c = checker()  # w: 3 replicas of 10 rps at 70 % (+10 %) serve 23.1 rps
    for i in range(10):
        c.demand(T + 10 * i, "w", 30.0, 10.0)
    assert rules_broken(c) == ["scale-up owed"]

    excused = checker()
    held = excused.window("held", "apiserver-restart", T)
    held.end = T + 100
    for i in range(10):
        excused.demand(T + 10 * i, "w", 30.0, 10.0)
    assert excused.wrong == []
    assert excused.owed_at(T + 50) == {"w": None}

    met = checker()
    for i in range(3):
        met.demand(T + 10 * i, "w", 30.0, 10.0)
    met.observe(scale("w", 5, T + 25))
    met.demand(T + 30, "w", 30.0, 10.0)
    assert met.wrong == [] and met.owed_at(T + 5) == {"w": T + 30}


def test_nothing_is_owed_while_a_replica_waits_for_a_place() -> None:
    """The scale-up was written, or the cluster has no room for more of its slice."""
    c = checker()
    for i in range(10):
        c.demand(T + 10 * i, "w", 30.0, 10.0, unplaced=True)
    assert c.wrong == [] and c.owed_at(T + 50) == {}


def test_a_workload_at_zero_owes_a_wake_when_asked() -> None:
    c = checker()
    c.set_replicas("z", 0)
    for i in range(10):
        c.demand(T + 10 * i, "z", 1.0, 10.0)
    assert rules_broken(c) == ["scale-up owed"]


def test_an_audit_line_reads_as_the_action_it_was() -> None:
    line = json.dumps(
        {
            "kind": "Event",
            "apiVersion": "audit.k8s.io/v1",
            "stage": "ResponseComplete",
            "verb": "update",
            "user": {"username": "system:serviceaccount:gpusizer-system:gpusizer"},
            "objectRef": {
                "resource": "deployments",
                "namespace": "soak",
                "name": "w",
                "subresource": "scale",
            },
            "responseStatus": {"code": 200},
            "requestObject": {"kind": "Scale", "spec": {"replicas": 4}},
            "responseObject": {"kind": "Scale", "spec": {"replicas": 4}},
            "stageTimestamp": "2027-01-15T08:00:00.123456Z",
        }
    )
    action = parse(line)
    assert action is not None
    assert (action.verb, action.subresource, action.name, action.replicas_requested()) == (
        "update",
        "scale",
        "w",
        4,
    )
    assert action.time == pytest.approx(1_800_000_000.123456)
    assert parse(line.replace("ResponseComplete", "RequestReceived")) is None
    assert parse("{not json") is None


def test_the_soak_judges_without_the_operators_code() -> None:
    """Not one module of the operator is loaded by the soak, its judge included."""
    code = (
        "import sys, e2e.soak.__main__; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'gpusizer'))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert loaded.stdout.strip() == "[]"
