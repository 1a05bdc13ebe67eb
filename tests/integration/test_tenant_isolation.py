"""A WorkloadSizing's PromQL against the real Prometheus: it sees its own namespace only."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import pytest
from gpusizer.actuate.target_view import TargetView
from gpusizer.api.v1alpha1 import Server
from gpusizer.clock import FailingSince, fetch_cycle
from gpusizer.cluster import ClusterView
from gpusizer.memory import Memory
from gpusizer.reconcile import reconcile
from gpusizer.settings import PrometheusSettings, Tenancy
from gpusizer.signals.health import PrometheusHealth
from gpusizer.signals.parse import Problem
from gpusizer.signals.prometheus import PrometheusSource
from gpusizer.signals.reader import SnapshotReader
from gpusizer.signals.user_queries import restrict
from gpusizer.vocabulary import ConditionType, EventReason, Reason

from tests.fakes import FakeTargets, services, workload
from tests.integration.conftest import Exporter
from tests.unit.test_promql import REWRITES

OTHER = 'gateway_pending_requests{namespace="other",service="chat"} 7\n'
OWN = 'gateway_pending_requests{namespace="llm",service="chat"} 2\n'
WAKE = 'sum(gateway_pending_requests{namespace="other"})'


T = TypeVar("T")


class RecordingSource(PrometheusSource):
    """The real source, remembering every query it sent."""

    def __init__(self, url: str) -> None:
        super().__init__(PrometheusSettings(url=url, timeout_seconds=5))
        self.sent: list[str] = []

    async def query(
        self, promql: str, signal: str, read: Callable[[Any], T], at: float | None = None
    ) -> T | Problem:
        self.sent.append(promql)
        return await super().query(promql, signal, read, at)


def one_target() -> FakeTargets:
    """A scalable target at zero replicas."""
    return FakeTargets({("llm", "chat"): TargetView(0, "app=chat", "1")})


async def no_autoscalers() -> dict[Any, str]:
    return {}


def spec(wake: str) -> dict[str, Any]:
    return {
        "targetRef": {"name": "chat"},
        "replicas": {"min": 0, "max": 4, "targetGPUUtilization": 70},
        "scaleToZero": {"enabled": True, "wakeQuery": wake, "wakeThreshold": 0},
        "metrics": {"server": "none"},
        "rightSizing": {"mode": "Off"},
    }


async def run(
    source: RecordingSource, wake: str, tenancy: Tenancy, target: FakeTargets, status: Any = None
) -> Any:
    """One decision on a fresh cycle; `source.sent` then holds only the workload's queries."""
    cycle = await fetch_cycle(
        SnapshotReader(source, Server, 0), PrometheusHealth(), no_autoscalers, FailingSince()
    )
    source.sent.clear()
    return await reconcile(
        workload(spec(wake), status),
        ClusterView({}, {}),
        cycle,
        services(source, target, tenancy),
        Memory(),
        time.time(),
    )


def condition(outcome: Any, type_: ConditionType) -> dict[str, Any]:
    return next(c for c in outcome.status_patch["conditions"] if c["type"] == type_.value)


async def test_other_namespace_is_not_read_and_the_user_is_told(
    prometheus: str, exporter: Exporter
) -> None:
    exporter.set(OTHER)
    source = RecordingSource(prometheus)

    # the series exist: as written, the query reads the other namespace's 7 ...
    assert await source.scalar(WAKE) == (7.0, None)
    # ... confined, it reads nothing from there: the other namespace has no series in llm
    confined, overridden = restrict(WAKE, "llm")
    assert overridden == ['namespace="other"']
    assert await source.scalar(confined) == (
        None,
        Problem(Reason.NO_SAMPLES, "the query returned no series"),
    )

    source.sent.clear()
    target = one_target()
    outcome = await run(source, WAKE, Tenancy(), target)
    wake_queries = [q for q in source.sent if "gateway_pending_requests" in q]
    assert wake_queries == ['sum(gateway_pending_requests{namespace="llm"})']
    assert target.writes == [], "the other namespace's demand woke it"
    metrics = condition(outcome, ConditionType.METRICS_AVAILABLE)
    assert metrics["status"] == "False" and metrics["reason"] == Reason.QUERY_RESTRICTED.value
    assert metrics["message"].startswith(
        'spec.scaleToZero.wakeQuery: selects namespace="other"; restricted to namespace="llm"'
    )
    restricted = [e for e in outcome.events if e.reason == EventReason.QUERY_RESTRICTED]
    assert [e.type for e in restricted] == ["Warning"]

    # the next cycle, with that status, does not repeat the event
    again = await run(source, WAKE, Tenancy(), target, status=outcome.status_patch)
    assert not [e for e in again.events if e.reason == EventReason.QUERY_RESTRICTED]


async def test_a_query_without_namespace_reads_its_own_only(
    prometheus: str, exporter: Exporter
) -> None:
    exporter.set(OTHER + OWN)
    source = RecordingSource(prometheus)
    query = "sum(gateway_pending_requests)"
    assert await source.scalar(query) == (9.0, None)
    assert await source.scalar(restrict(query, "llm")[0]) == (2.0, None)


async def test_allowed_cross_namespace_query_is_sent_as_written(
    prometheus: str, exporter: Exporter
) -> None:
    exporter.set(OTHER)
    source = RecordingSource(prometheus)
    target = one_target()
    outcome = await run(source, WAKE, Tenancy(allow_cross_namespace=True), target)
    assert WAKE in source.sent
    assert target.writes == [("llm", "chat", 1)], "7 pending requests wake it"
    assert condition(outcome, ConditionType.METRICS_AVAILABLE)["reason"] != (
        Reason.QUERY_RESTRICTED.value
    )


async def test_malformed_query_is_reported_before_anything_is_sent(prometheus: str) -> None:
    source = RecordingSource(prometheus)
    outcome = await run(source, "sum(rate(gateway_pending_requests[5m]", Tenancy(), one_target())
    assert source.sent == []
    ready = condition(outcome, ConditionType.READY)
    assert ready["status"] == "False" and ready["reason"] == Reason.INVALID_SPEC.value
    assert ready["message"].startswith("spec.scaleToZero.wakeQuery: parse error: ")
    assert [e.reason for e in outcome.events] == [EventReason.INVALID_SPEC]


@pytest.mark.parametrize(("query", "rewritten"), [(q, r) for q, r, _ in REWRITES])
async def test_every_rewritten_query_is_promql_prometheus_accepts(
    prometheus: str, query: str, rewritten: str
) -> None:
    source = PrometheusSource(PrometheusSettings(url=prometheus, timeout_seconds=5))
    answer = await source.query(rewritten, "test", lambda result: result)
    # a parse error is a 400 of type bad_data; evaluating on no data may fail otherwise
    assert not isinstance(answer, Problem) or "bad_data" not in answer.message, (
        f"{query} -> {rewritten}: {answer}"
    )
