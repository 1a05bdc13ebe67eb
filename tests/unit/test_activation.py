"""The operator's side of the activator, pure: what the activator's records on a WorkloadSizing
say (garbage and the records of replicas gone count for nothing), the port each workload gets,
the demand a turn decides on, and the API's rules for the activator, in pydantic as in CEL."""

from __future__ import annotations

from typing import Any

import pytest
from gpusizer.activation import activator_port, wake_demand
from gpusizer.api.annotations import (
    HELD_PREFIX,
    HELD_TTL_SECONDS,
    Held,
    HeldRecord,
    held_key,
    held_requests,
)
from gpusizer.api.crd import crd
from gpusizer.api.v1alpha1 import ACTIVATOR_PORTS, ActivatorSpec, WorkloadSizingSpec
from gpusizer.signals.parse import Problem
from gpusizer.timefmt import iso_millis
from gpusizer.vocabulary import Reason
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

NOW = 1_800_000_000.0


def record(pending: int, since: float, at: float = NOW - 1) -> str:
    return HeldRecord(pending=pending, since=iso_millis(since), at=iso_millis(at)).annotation()


def test_the_live_records_add_up_and_the_earliest_first_request_is_kept() -> None:
    held = held_requests(
        {
            held_key("a-0"): record(3, NOW - 2.5),
            held_key("a-1"): record(2, NOW - 4.25),
            held_key("a-2"): record(0, NOW - 100),  # nothing held: its since says nothing
            "gpusizer.io/paused": "false",
        },
        NOW,
    )
    assert held == Held(pending=5, since=NOW - 4.25)


def test_a_record_not_rewritten_for_the_ttl_is_from_a_replica_gone() -> None:
    gone = held_key("a-1")
    held = held_requests(
        {
            held_key("a-0"): record(1, NOW - 1),
            gone: record(7, NOW - 60, NOW - HELD_TTL_SECONDS - 1),
        },
        NOW,
    )
    assert (held.pending, held.stale) == (1, (gone,))


@given(st.dictionaries(st.text(max_size=30).map(lambda k: HELD_PREFIX + k), st.text(max_size=60)))
def test_garbage_in_the_records_is_never_demand(annotations: dict[str, str]) -> None:
    held = held_requests(annotations, NOW)
    assert held.pending == 0 and held.since is None
    assert set(held.unreadable) | set(held.stale) <= set(annotations)


def test_a_long_replica_name_still_makes_a_valid_key() -> None:
    key = held_key("a" * 80)
    assert key.startswith(HELD_PREFIX) and len(key.removeprefix(HELD_PREFIX)) == 63
    assert held_key("a" * 80) != held_key("a" * 79 + "b")


def test_a_port_recorded_is_kept_a_new_workload_gets_the_lowest_free_one() -> None:
    first = ACTIVATOR_PORTS[0]
    holders = {first: [("ns", "a")], first + 2: [("ns", "c")]}
    assert activator_port(("ns", "a"), first, holders, {}) == first
    assert activator_port(("ns", "b"), None, holders, {}) == first + 1
    # handed out by this process a moment ago, not in any status yet: not given twice
    assert activator_port(("ns", "d"), None, holders, {("ns", "b"): first + 1}) == first + 3
    # two statuses with one port (a restored backup): the one that sorts first keeps it
    both = {first: [("ns", "a"), ("ns", "z")]}
    assert activator_port(("ns", "z"), first, both, {}) == first + 1
    assert activator_port(("ns", "a"), first, both, {}) == first
    # out of the range (edited by hand): a port from the range instead
    assert activator_port(("ns", "e"), 80, {}, {}) == first


def test_when_every_port_is_held_there_is_none() -> None:
    holders = {port: [("ns", f"w{port}")] for port in ACTIVATOR_PORTS}
    assert activator_port(("ns", "new"), None, holders, {}) is None


ON = ActivatorSpec(enabled=True)
DOWN = Problem(Reason.PROMETHEUS_UNREACHABLE, "refused")


@pytest.mark.parametrize(
    ("activator", "replicas", "query", "demand", "reason"),
    [
        (ON, ("10.0.0.7",), None, 4.0, None),
        (ON, ("10.0.0.7",), (2.0, None), 6.0, None),  # another gateway's, plus what is held
        (ON, ("10.0.0.7",), (None, DOWN), None, Reason.PROMETHEUS_UNREACHABLE),
        (ON, (), None, None, Reason.NO_ACTIVATOR),  # nothing would hold a request: unknown
        (ON, None, None, None, Reason.NO_ACTIVATOR),
        (ActivatorSpec(), (), (2.0, None), 2.0, None),  # the activator off: the query alone
    ],
)
def test_the_demand_is_what_is_held_plus_the_wake_query(
    activator: ActivatorSpec,
    replicas: tuple[str, ...] | None,
    query: tuple[float | None, Problem | None] | None,
    demand: float | None,
    reason: Reason | None,
) -> None:
    got = wake_demand(activator, Held(pending=4, since=NOW), replicas, query)
    assert got is not None
    assert got[0] == demand
    assert (got[1].reason if got[1] else None) == reason


def spec(stz: dict[str, Any]) -> dict[str, Any]:
    return {
        "targetRef": {"name": "chat"},
        "replicas": {"min": 0, "max": 2, "targetGPUUtilization": 70},
        "scaleToZero": stz,
    }


@pytest.mark.parametrize(
    ("stz", "field"),
    [
        ({"enabled": True}, "wakeQuery or scaleToZero.activator.enabled is required"),
        ({"enabled": True, "activator": {"enabled": True, "port": 0}}, "port"),
        ({"enabled": True, "activator": {"enabled": True, "maxPendingRequests": 0}}, "maxPending"),
        ({"enabled": True, "activator": {"enabled": True, "holdTimeoutSeconds": 7200}}, "hold"),
        ({"enabled": True, "activator": {"enabled": True, "service": "Not_A_Name"}}, "service"),
        ({"enabled": True, "activator": {"enabled": True, "bogus": 1}}, "bogus"),
    ],
)
def test_pydantic_refuses_a_bad_activator_naming_the_field(stz: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        WorkloadSizingSpec.model_validate(spec(stz))


def test_with_the_activator_no_wake_query_is_needed_and_cel_says_the_same() -> None:
    parsed = WorkloadSizingSpec.model_validate(
        spec({"enabled": True, "activator": {"enabled": True}})
    )
    assert parsed.scale_to_zero.activator.max_pending_requests == 1000
    assert parsed.scale_to_zero.activator.hold_timeout_seconds == 600
    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    stz = schema["properties"]["spec"]["properties"]["scaleToZero"]
    [rule] = stz["x-kubernetes-validations"]
    assert "self.activator.enabled" in rule["rule"] and "wakeQuery" in rule["rule"]
    activator = stz["properties"]["activator"]["properties"]
    assert (activator["port"]["minimum"], activator["port"]["maximum"]) == (1, 65535)
    assert activator["holdTimeoutSeconds"]["maximum"] == 3600
    assert activator["service"]["pattern"].startswith("^(")  # the empty default is valid
