"""Peering: the oldest replica is in charge, and a paused replica can tell who is."""

from __future__ import annotations

import datetime

from gpusizer.peering import peering_priority, peers_ahead

NOW = datetime.datetime(2026, 11, 21, 12, 0, tzinfo=datetime.UTC)


def test_an_older_replica_has_the_higher_priority_whatever_the_tiebreak() -> None:
    older = peering_priority(1_800_000_000.000, tiebreak=0)
    newer = peering_priority(1_800_000_000.001, tiebreak=999)
    assert older > newer
    assert peering_priority(1_800_000_000.0, 1) != peering_priority(1_800_000_000.0, 2)


def test_peers_ahead_are_live_and_of_higher_priority() -> None:
    def seen(seconds_ago: float) -> str:
        return (NOW - datetime.timedelta(seconds=seconds_ago)).isoformat()

    status = {
        "older": {"priority": 10, "lifetime": 60, "lastseen": seen(5)},
        "dead": {"priority": 10, "lifetime": 60, "lastseen": seen(61)},
        "younger": {"priority": 1, "lifetime": 60, "lastseen": seen(1)},
        "garbage": {"priority": 10, "lastseen": "yesterday"},
        "odd": "x",
    }
    assert peers_ahead(status, 5, NOW) == ["older"]
    assert peers_ahead(status, 10, NOW) == []
