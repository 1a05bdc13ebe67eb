"""Which replica is in charge: the Lease as client-go's leader election judges it, two replicas
sharing one in-memory Lease, and the loop that keeps it."""

from __future__ import annotations

import asyncio
import datetime
import json
import logging

import pytest
from gpusizer.api.annotations import PROMETHEUS_OUTAGES_ANNOTATION
from gpusizer.charge import (
    LEASE_SECONDS,
    RENEW_DEADLINE_SECONDS,
    Charge,
    LeaseRecord,
    OutageSpans,
    Step,
    micro_time,
)
from gpusizer.kube import API_TIMEOUT_SECONDS
from gpusizer.lease import LeaseConflict, keep_charge, lease_body, lease_record
from gpusizer.ports import LeaseStore

from tests.fakes import FakeLease

WALL = 1_800_000_000.0


class Replica:
    """A replica's Charge driven by hand: each `turn` is one pass of `lease.keep_charge`."""

    def __init__(self, name: str, lease: FakeLease) -> None:
        self.charge = Charge(name)
        self.lease = lease
        self.outages: OutageSpans = ()

    def turn(self, now: float, wants: bool = True) -> Step:
        record = self.lease.read()
        step = self.charge.step(record, wants, now)
        try:
            if step in (Step.ACQUIRE, Step.RENEW):
                self.lease.write(self.charge.claim(record, WALL + now, self.outages))
                self.charge.wrote(now)
            elif step is Step.RELEASE and record is not None:
                self.lease.write(self.charge.released(record))
        except LeaseConflict:
            pass
        return step


def test_the_timings_leave_a_write_room_to_land_before_a_takeover() -> None:
    assert RENEW_DEADLINE_SECONDS + API_TIMEOUT_SECONDS < LEASE_SECONDS


def test_one_replica_holds_the_lease_and_the_other_waits() -> None:
    lease = FakeLease()
    a, b = Replica("a", lease), Replica("b", lease)
    assert a.turn(0) is Step.ACQUIRE
    assert a.charge.held(0.5)
    for t in range(1, 60, 2):
        assert b.turn(t) is Step.WAIT
        assert a.turn(t + 1) is Step.RENEW
        assert a.charge.held(t + 1.5) and not b.charge.held(t + 1.5)
    assert lease.record is not None and lease.record.holder == "a"
    assert lease.record.transitions == 0


def test_a_holder_that_stops_renewing_stops_acting_before_the_other_takes_over() -> None:
    lease = FakeLease()
    a, b = Replica("a", lease), Replica("b", lease)
    a.turn(0)
    b.turn(1)  # b first sees a's record at 1
    # a's renewals fail from here on (etcd paused, a partition): by its own clock it stops
    assert a.charge.held(RENEW_DEADLINE_SECONDS - 0.1)
    assert not a.charge.held(RENEW_DEADLINE_SECONDS)
    # b takes over only when a's record has stayed unchanged for the Lease's duration, by b's clock
    assert b.turn(1 + LEASE_SECONDS - 0.1) is Step.WAIT
    assert b.turn(1 + LEASE_SECONDS) is Step.ACQUIRE
    assert b.charge.held(1 + LEASE_SECONDS)
    assert lease.record is not None and (lease.record.holder, lease.record.transitions) == ("b", 1)
    # a comes back: it reads b's record and does not act, nor take it back
    assert a.turn(1 + LEASE_SECONDS + 1) is Step.WAIT
    assert not a.charge.held(1 + LEASE_SECONDS + 1)


def test_a_late_renewal_keeps_the_lease_from_the_other() -> None:
    """The soak's split brain: the holder's renewal came late (etcd paused 9 s); the other
    replica, whose peering said it may lead, must not take over a record that changed."""
    lease = FakeLease()
    a, b = Replica("a", lease), Replica("b", lease)
    a.turn(0)
    b.turn(0.5)
    a.turn(12)  # late, but within the deadline: still in charge
    assert a.charge.held(12)
    for t in range(13, 13 + 2 * LEASE_SECONDS):
        assert b.turn(t) is Step.WAIT
        a.turn(t + 0.5)
    assert not b.charge.held(13 + 2 * LEASE_SECONDS)


def test_of_two_replicas_writing_at_once_one_holds() -> None:
    lease = FakeLease()
    a, b = Charge("a"), Charge("b")
    empty = lease.read()
    assert a.step(empty, True, 0) is Step.ACQUIRE and b.step(empty, True, 0) is Step.ACQUIRE
    lease.write(a.claim(empty, WALL, None))
    a.wrote(0)
    with pytest.raises(LeaseConflict):
        lease.write(b.claim(empty, WALL, None))
    assert a.held(1) and not b.held(1)
    assert b.step(lease.read(), True, 1) is Step.WAIT


def test_a_holder_that_may_no_longer_lead_frees_the_lease_for_the_other_at_once() -> None:
    lease = FakeLease()
    a, b = Replica("a", lease), Replica("b", lease)
    a.turn(0)
    b.turn(1)
    assert a.turn(2, wants=False) is Step.RELEASE  # kopf's peering: a peer is ahead of it
    assert not a.charge.held(2)
    assert b.turn(3) is Step.ACQUIRE  # no need to wait the Lease out
    assert b.charge.held(3)
    assert a.turn(4, wants=False) is Step.WAIT


def test_a_replica_that_may_not_lead_never_takes_the_lease() -> None:
    lease = FakeLease()
    b = Replica("b", lease)
    assert b.turn(0, wants=False) is Step.WAIT
    assert lease.record is None and not b.charge.held(0)
    a = Replica("a", lease)
    a.turn(1)
    a.turn(2, wants=False)  # freed
    assert b.turn(3, wants=False) is Step.WAIT
    assert b.turn(3 + LEASE_SECONDS, wants=False) is Step.WAIT
    assert lease.record is not None and lease.record.holder == ""


def test_a_claim_counts_takeovers_and_carries_the_outages() -> None:
    lease = FakeLease()
    a, b = Replica("a", lease), Replica("b", lease)
    a.outages = ((WALL - 100, None),)
    a.turn(0)
    assert lease.record is not None and lease.record.prometheus_outages == a.outages
    a.outages = ((WALL - 100, WALL - 1),)
    a.turn(2)
    assert (lease.record.transitions, lease.record.prometheus_outages) == (0, a.outages)
    a.turn(4, wants=False)
    b.turn(5)
    assert (lease.record.holder, lease.record.transitions) == ("b", 1)


def test_micro_time_always_has_six_fractional_digits() -> None:
    whole = micro_time(1_800_000_000.0)
    assert whole == "2027-01-15T08:00:00.000000Z"
    parsed = datetime.datetime.strptime(micro_time(1_800_000_000.25), "%Y-%m-%dT%H:%M:%S.%fZ")
    assert parsed.microsecond == 250_000


def test_a_lease_written_is_read_back_the_same() -> None:
    outages = ((WALL - 5, None), (WALL - 300, WALL - 100.25))
    record = LeaseRecord("a", micro_time(WALL), 30, 2, "17", outages)
    body = lease_body("gpusizer-system", "gpusizer", record)
    annotated = body["metadata"]["annotations"][PROMETHEUS_OUTAGES_ANNOTATION]
    assert json.loads(annotated) == [[WALL - 5, None], [WALL - 300, WALL - 100.25]]
    assert lease_record(body) == (record, [])
    freed = lease_body("gpusizer-system", "gpusizer", LeaseRecord("", "", version="18"))
    assert freed["spec"]["holderIdentity"] is None and freed["metadata"]["annotations"] == {}


def test_a_lease_edited_by_hand_is_read_with_each_bad_field_named() -> None:
    body = {
        "metadata": {
            "resourceVersion": "3",
            "annotations": {PROMETHEUS_OUTAGES_ANNOTATION: '[["yesterday", null]]'},
        },
        "spec": {
            "holderIdentity": 7,
            "leaseDurationSeconds": "30",
            "leaseTransitions": -0.5,
            "renewTime": "2027-01-15T08:00:00.000000Z",
        },
    }
    record, problems = lease_record(body)
    assert record == LeaseRecord("", "2027-01-15T08:00:00.000000Z", LEASE_SECONDS, 0, "3", ())
    named = " ".join(problems)
    for field in (
        "spec.holderIdentity",
        "spec.leaseDurationSeconds",
        "spec.leaseTransitions",
        PROMETHEUS_OUTAGES_ANNOTATION,
    ):
        assert field in named
    assert len(problems) == 4


class Watched(FakeLease):
    """Says when a write landed, for the loop's tests to wait on."""

    def __init__(self, record: LeaseRecord | None = None) -> None:
        super().__init__(record)
        self.landed = asyncio.Queue[LeaseRecord]()
        self.loop = asyncio.get_running_loop()

    def write(self, record: LeaseRecord) -> LeaseRecord:
        written = super().write(record)
        self.loop.call_soon_threadsafe(self.landed.put_nowait, written)
        return written


async def test_the_loop_takes_a_free_lease_hands_over_the_outage_and_frees_it_on_exit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("gpusizer.lease.RETRY_SECONDS", 0.01)
    outages = ((WALL - 60, None),)
    predecessor = LeaseRecord("", micro_time(WALL), version="4", prometheus_outages=outages)
    lease = Watched(predecessor)
    store: LeaseStore = lease
    charge = Charge("b")
    took_over: list[LeaseRecord | None] = []
    task = asyncio.create_task(
        keep_charge(charge, store, lambda: True, lambda: outages, took_over.append)
    )
    taken = await asyncio.wait_for(lease.landed.get(), 5)
    assert taken.holder == "b" and taken.prometheus_outages == outages
    renewed = await asyncio.wait_for(lease.landed.get(), 5)
    assert renewed.holder == "b" and renewed.version != taken.version
    assert took_over == [predecessor]  # once, with the record it replaced
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert lease.record is not None and lease.record.holder == ""


async def test_the_loop_says_once_that_the_lease_cannot_be_reached(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr("gpusizer.lease.RETRY_SECONDS", 0.01)
    lease = FakeLease(down=ConnectionRefusedError("connection refused"))
    reads = 0
    loop = asyncio.get_running_loop()
    fifth = loop.create_future()

    def leads() -> bool:  # in the loop's thread
        nonlocal reads
        reads += 1
        if reads == 5:
            loop.call_soon_threadsafe(fifth.set_result, None)
        return True

    caplog.set_level(logging.WARNING, "gpusizer.lease")
    charge = Charge("a")
    task = asyncio.create_task(keep_charge(charge, lease, leads, lambda: None, lambda _: None))
    await asyncio.wait_for(fifth, 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    failures = [r.getMessage() for r in caplog.records if "Lease failed" in r.getMessage()]
    assert failures == ["reading or writing the operator's Lease failed: connection refused"]
