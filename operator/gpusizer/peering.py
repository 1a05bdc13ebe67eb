"""Several operator replicas under one kopf peering: which one acts, and saying so."""

from __future__ import annotations

import datetime
import logging
import random
from collections.abc import Mapping
from typing import Any

from kubernetes import client as k8s

from gpusizer.kube import SaidOnce

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


class PeeringView:
    """Which replicas of a kopf peering are alive and ahead of this one, read from the peering
    object's status: kopf pauses this replica while any is, and this replica leads (takes the
    operator's Lease, `lease`) only while none is. It also says so in the log, which kopf does
    not when a replica starts paused behind another."""

    def __init__(
        self, client: k8s.ApiClient, name: str, namespace: str | None, priority: int
    ) -> None:
        self._api = k8s.CustomObjectsApi(client)
        self._name = name
        self._namespace = namespace  # of a KopfPeering; None: the ClusterKopfPeering
        self._priority = priority
        self.ahead: list[str] | None = None  # None until first read
        self._reads = SaidOnce(log, f"reading the peering {name}")

    def leads(self) -> bool:
        """Whether this replica may lead, as the peering object says now (blocking): no live
        replica ahead of it. A failed read keeps the last answer (none: False), said once."""
        try:
            self._refresh()
            self._reads.succeeded()
        except Exception as exc:  # the API server is down, or no access: kopf says the rest
            self._reads.failed(exc)
        return self.ahead is not None and not self.ahead

    def _refresh(self) -> None:
        if self._namespace is None:
            obj = self._api.get_cluster_custom_object(
                "kopf.dev", "v1", "clusterkopfpeerings", self._name
            )
        else:
            obj = self._api.get_namespaced_custom_object(
                "kopf.dev", "v1", self._namespace, "kopfpeerings", self._name
            )
        ahead = peers_ahead(
            obj.get("status") or {}, self._priority, datetime.datetime.now(datetime.UTC)
        )
        if self.ahead is None or bool(ahead) != bool(self.ahead):
            if ahead:
                log.info("paused: %s of peering %s is in charge", ", ".join(ahead), self._name)
            else:
                log.info("active: no replica is ahead of this one in peering %s", self._name)
        self.ahead = ahead
