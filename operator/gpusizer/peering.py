"""Several operator replicas under one kopf peering: which one acts, and saying so."""

from __future__ import annotations

import asyncio
import datetime
import logging
import random
from collections.abc import Mapping
from typing import Any

from kubernetes import client as k8s

log = logging.getLogger(__name__)


def peering_priority(started: float, tiebreak: int | None = None) -> int:
    """The older replica wins: kopf pauses every replica when peers share a priority (then
    none acts), and a replica that starts later (a rolling update) waits for the one in charge
    to leave instead of taking over mid-cycle."""
    tiebreak = random.randrange(1000) if tiebreak is None else tiebreak
    return -int(started * 1000) * 1000 + tiebreak


def peers_ahead(status: Mapping[str, Any], priority: int, now: datetime.datetime) -> list[str]:
    """The live replicas of a kopf peering object's status with a higher priority than ours."""
    ahead = []
    for identity, peer in status.items():
        if not isinstance(peer, Mapping) or int(peer.get("priority") or 0) <= priority:
            continue
        try:
            seen = datetime.datetime.fromisoformat(str(peer.get("lastseen")))
        except ValueError:
            continue
        if seen.tzinfo is None:
            seen = seen.replace(tzinfo=datetime.UTC)
        if seen + datetime.timedelta(seconds=float(peer.get("lifetime") or 60)) > now:
            ahead.append(str(identity))
    return ahead


async def report_peering(
    client: k8s.ApiClient, name: str, priority: int, period_seconds: float
) -> None:
    """kopf says nothing when a replica starts paused behind another: log when this replica is
    paused and when it takes over, from the ClusterKopfPeering's status."""
    api = k8s.CustomObjectsApi(client)
    paused: bool | None = None
    while True:
        try:
            obj = await asyncio.to_thread(
                api.get_cluster_custom_object, "kopf.dev", "v1", "clusterkopfpeerings", name
            )
        except Exception as exc:  # namespaced peering, or no access: kopf still does its job
            log.debug("not reporting the peering state of %s: %s", name, exc)
            return
        ahead = peers_ahead(obj.get("status") or {}, priority, datetime.datetime.now(datetime.UTC))
        if bool(ahead) != paused:
            paused = bool(ahead)
            if paused:
                log.info("paused: %s of peering %s is in charge", ", ".join(ahead), name)
            else:
                log.info("active: this replica is in charge for peering %s", name)
        await asyncio.sleep(period_seconds)
