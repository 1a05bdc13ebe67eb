"""The operator's Lease on the real API server: created once, replaced only at the version read,
its MicroTime accepted and read back, a hand-edited field named."""

from __future__ import annotations

import logging
import uuid

import pytest
from gpusizer.api.annotations import PROMETHEUS_OUTAGES_ANNOTATION
from gpusizer.charge import Charge, Step
from gpusizer.lease import KubeLease, LeaseConflict

from .conftest import Cluster

pytestmark = pytest.mark.e2e

NAMESPACE = "default"
WALL = 1_800_000_000.5


def stores(cluster: Cluster) -> tuple[KubeLease, KubeLease]:
    name = f"lease-{uuid.uuid4().hex[:8]}"
    return (
        KubeLease(cluster.api_client(), NAMESPACE, name),
        KubeLease(cluster.api_client(), NAMESPACE, name),
    )


def test_two_replicas_creating_the_lease_at_once_one_holds(cluster: Cluster) -> None:
    first, second = stores(cluster)
    a, b = Charge("replica-a"), Charge("replica-b")
    assert first.read() is None and second.read() is None
    assert a.step(None, True, 0) is Step.ACQUIRE and b.step(None, True, 0) is Step.ACQUIRE
    outages = ((WALL - 30, None), (WALL - 400, WALL - 100.5))
    written = first.write(a.claim(None, WALL, outages))
    with pytest.raises(LeaseConflict):
        second.write(b.claim(None, WALL, ()))  # AlreadyExists
    read = second.read()
    assert read == written
    assert read is not None and read.holder == "replica-a" and read.version
    assert read.renewed == "2027-01-15T08:00:00.500000Z"  # the API server keeps microseconds
    assert read.prometheus_outages == outages
    assert b.step(read, True, 1) is Step.WAIT


def test_a_write_at_a_version_since_replaced_conflicts(cluster: Cluster) -> None:
    first, second = stores(cluster)
    a, b = Charge("replica-a"), Charge("replica-b")
    created = first.write(a.claim(None, WALL, ()))
    renewed = first.write(a.claim(created, WALL + 2, ()))
    assert renewed.version != created.version and renewed.transitions == 0
    with pytest.raises(LeaseConflict):  # b read `created` and writes after a's renewal
        second.write(b.claim(created, WALL + 3, ()))
    freed = first.write(a.released(renewed))
    assert freed.holder == "" and second.read() == freed
    taken = second.write(b.claim(freed, WALL + 4, ()))
    assert (taken.holder, taken.transitions) == ("replica-b", 1)


def test_a_lease_edited_by_hand_is_read_with_the_field_named(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    first, _ = stores(cluster)
    first.write(Charge("replica-a").claim(None, WALL, ()))
    cluster.kubectl(
        "annotate",
        "lease",
        first.name,
        "-n",
        NAMESPACE,
        f"{PROMETHEUS_OUTAGES_ANNOTATION}=yesterday",
    )
    caplog.set_level(logging.WARNING, "gpusizer.lease")
    read = first.read()
    assert read is not None and read.holder == "replica-a"
    assert read.prometheus_outages == ()
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        f"Lease {NAMESPACE}/{first.name}: metadata.annotations"
        f"[{PROMETHEUS_OUTAGES_ANNOTATION}] is not a list of [since, until or null] pairs: "
        "'yesterday'"
    ]
    first.read()
    assert len(caplog.records) == 1  # said once, not at every read
