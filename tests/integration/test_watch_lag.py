"""A watch that lags behind the API server (its connection left silent by a partition): the
conflicting write that shows it sends the next decisions to the API server until the watch
catches up."""

from __future__ import annotations

import time
from typing import Any

from gpusizer.actuate.target_view import TargetView
from gpusizer.api.v1alpha1 import Server
from gpusizer.clock import FailingSince, fetch_cycle
from gpusizer.cluster import ClusterView
from gpusizer.memory import Memory
from gpusizer.reconcile import reconcile
from gpusizer.settings import PrometheusSettings
from gpusizer.signals.health import PrometheusHealth
from gpusizer.signals.prometheus import PrometheusSource
from gpusizer.signals.reader import SnapshotReader

from tests.fakes import FakeTargets, services, workload
from tests.integration.conftest import Exporter

DEMAND = 'gateway_pending_requests{namespace="llm",service="chat"} 3\n'
SPEC = {
    "targetRef": {"name": "chat"},
    "replicas": {"min": 0, "max": 4, "targetGPUUtilization": 70},
    "scaleToZero": {"enabled": True, "wakeQuery": "sum(gateway_pending_requests)"},
    "metrics": {"server": "none"},
    "rightSizing": {"mode": "Off"},
}


def watch_showing(target: TargetView) -> ClusterView:
    return ClusterView({}, {}, targets={"Deployment": {("llm", "chat"): target}})


async def test_a_write_that_finds_the_watch_behind_reads_the_api_server_until_it_catches_up(
    prometheus: str, exporter: Exporter
) -> None:
    exporter.set(DEMAND)
    source = PrometheusSource(PrometheusSettings(url=prometheus, timeout_seconds=5))
    # the API server's copy: already woken to one replica by an earlier write
    live = TargetView(replicas=1, selector="app=chat", resource_version="6")
    target = FakeTargets({("llm", "chat"): live})
    turn_services, memory = services(source, target), Memory()

    async def decide(view: ClusterView, status: Any) -> Any:
        cycle = await fetch_cycle(
            SnapshotReader(source, Server, 0), PrometheusHealth(), _no_autoscalers, FailingSince()
        )
        return await reconcile(
            workload(SPEC, status), view, cycle, turn_services, memory, time.time()
        )

    behind = watch_showing(TargetView(replicas=0, selector="app=chat", resource_version="5"))
    # the watch still shows zero replicas: demand wakes it, and the write meets the live one
    first = await decide(behind, None)
    assert (target.reads, target.writes) == (0, [])
    ready = next(c for c in first.status_patch["conditions"] if c["type"] == "Ready")
    assert "changed to 1 replicas" in ready["message"]

    # the watch has shown nothing newer: the decision reads the live target instead
    second = await decide(behind, first.status_patch)
    assert target.reads == 1
    assert second.status_patch["currentReplicas"] == 1
    assert target.writes == [], "one replica serves the demand; nothing to write"

    # once the watch shows a newer version, it is trusted again
    await decide(watch_showing(live), second.status_patch)
    assert target.reads == 1


async def _no_autoscalers() -> dict[Any, str]:
    return {}
