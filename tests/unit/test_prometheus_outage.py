"""An outage of Prometheus itself is one signal for the fleet, not a storm: a fleet of workloads
is run turn by turn through outages, its statuses fed back from its own patches, and the Events
and status writes counted."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from gpusizer.api.v1alpha1 import Server
from gpusizer.charge import LeaseRecord
from gpusizer.clock import Cycle, CycleClock, FailingSince, fetch_cycle
from gpusizer.cluster import ClusterView
from gpusizer.memory import Memory
from gpusizer.reconcile import Services, reconcile
from gpusizer.report import metrics
from gpusizer.report.status import RefreshBudget
from gpusizer.report.turn import OutageDamping
from gpusizer.signals.health import (
    KEPT_OUTAGES,
    SETTLE_SECONDS,
    Outage,
    PrometheusHealth,
    PrometheusState,
    failed_whole,
)
from gpusizer.signals.parse import PodSamples, Problem, Sample
from gpusizer.signals.queries import GPU_UTIL, queue_signal, request_rate_signal
from gpusizer.signals.reader import SnapshotReader, read_full
from gpusizer.signals.snapshot import Snapshot
from gpusizer.startup import Runtime
from gpusizer.timefmt import iso
from gpusizer.vocabulary import Reason

from tests.fakes import (
    TIMED_OUT,
    FakeMetrics,
    FakeStatus,
    FakeTargets,
    never_fetched,
    services,
    workload,
)
from tests.unit.test_reconcile import DOWN, NOW, NS, pod, snapshot, spec, target
from tests.unit.test_report_metrics import scraped

SYNC = 5.0
DAMPING = OutageDamping(grace_seconds=4 * SYNC, spread_seconds=2 * SYNC)


def at(read: Snapshot, now: float) -> Snapshot:
    """`read` as if taken at `now`, its samples as old as they were."""
    signals = {k: dataclasses.replace(v, read_at=now) for k, v in read.signals.items()}
    return dataclasses.replace(read, time=now, signals=signals)


def aged(read: Snapshot, age: float) -> Snapshot:
    """`read` with every sample `age` seconds old."""
    signals = {
        name: dataclasses.replace(
            samples,
            samples={pod: Sample(s.value, age) for pod, s in samples.samples.items()},
        )
        for name, samples in read.signals.items()
    }
    return dataclasses.replace(read, signals=signals)


@dataclasses.dataclass
class Fleet:
    """`size` workloads at 70 % on two replicas each, decided once per sync period."""

    size: int
    spec: dict[str, Any] = dataclasses.field(default_factory=spec)
    statuses: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    patches: list[tuple[float, str, dict[str, Any]]] = dataclasses.field(default_factory=list)
    events: list[tuple[float, str, str]] = dataclasses.field(default_factory=list)
    health: PrometheusHealth = dataclasses.field(default_factory=PrometheusHealth)
    metrics: FakeMetrics = dataclasses.field(default_factory=FakeMetrics)

    def __post_init__(self) -> None:
        self.names = [f"w{i:03d}" for i in range(self.size)]
        self.pods = {
            n: [pod(f"{n}-0", labels={"app": n}), pod(f"{n}-1", labels={"app": n})]
            for n in self.names
        }
        targets = FakeTargets({(NS, n): target(selector=f"app={n}") for n in self.names})
        self.targets = targets
        self.view = ClusterView({NS: [p for pods in self.pods.values() for p in pods]}, {})
        self.services: Services = dataclasses.replace(
            services(self.metrics, targets), damping=DAMPING, refresh_budget=RefreshBudget()
        )
        self.memory = Memory()

    async def period(
        self, now: float, prometheus_up: bool, age: float | None = None, decide: bool = True
    ) -> None:
        """One full read, its samples `age` seconds old if given, then every workload's turn
        on it unless not `decide` (this replica not in charge: it reads, and writes nothing)."""
        read = self.read(now, prometheus_up)
        if age is not None:
            read = aged(read, age)
        cycle = Cycle(
            read, autoscalers={}, workloads=self.size, prometheus=self.health.observe(read)
        )
        if decide:
            await self.decide(cycle, now)

    def read(self, now: float, prometheus_up: bool) -> Snapshot:
        pods = [p for ps in self.pods.values() for p in ps]
        return at(snapshot(70.0 if prometheus_up else None, pods), now)

    async def decide(self, cycle: Cycle, now: float) -> None:
        """Every workload's turn on `cycle`, its status fed back from its patch."""
        for name in self.names:
            obj = workload(
                {**self.spec, "targetRef": {"name": name}},
                self.statuses.get(name, {}),
                name=name,
                namespace=NS,
            )
            outcome = await reconcile(obj, self.view, cycle, self.services, self.memory, now)
            self.events += [(now, name, e.reason.value) for e in outcome.events]
            if outcome.status_patch:
                self.patches.append((now, name, outcome.status_patch))
                merged = {**self.statuses.get(name, {}), **outcome.status_patch}
                self.statuses[name] = {k: v for k, v in merged.items() if v is not None}

    async def run(
        self,
        start: float,
        seconds: float,
        down: list[tuple[float, float]],
        away: tuple[float, float] | None = None,
    ) -> None:
        """Periods of SYNC from `start`, Prometheus out over `down`, and this replica not in
        charge over `away`."""
        t = start
        while t < start + seconds:
            up = not any(a <= t < b for a, b in down)
            await self.period(t, up, decide=away is None or not away[0] <= t < away[1])
            t += SYNC

    def metrics_flips(self, since: float = 0.0) -> list[tuple[float, str, str]]:
        """(time, workload, new status) of every patch that moved MetricsAvailable."""
        flips, shown = [], dict.fromkeys(self.names, "True")
        for t, name, patch in self.patches:
            for c in patch.get("conditions") or []:
                if c["type"] == "MetricsAvailable" and c["status"] != shown[name]:
                    shown[name] = c["status"]
                    if t >= since:
                        flips.append((t, name, c["status"]))
        return flips


def transitions(fleet: Fleet, name: str, since: float) -> list[str]:
    """The MetricsAvailable statuses a workload's patches moved it to, in order."""
    return [status for _, n, status in fleet.metrics_flips(since) if n == name]


async def test_a_flapping_prometheus_writes_no_condition_and_posts_no_event() -> None:
    fleet = Fleet(size=40)
    await fleet.run(NOW, 60, down=[])  # settled: every status written once
    start = NOW + 60
    # down 15 s out of every 25 s, for five minutes: each outage is shorter than the grace
    outages = [(start + k * 25, start + k * 25 + 15) for k in range(12)]
    await fleet.run(start, 300, down=outages)
    assert fleet.metrics_flips(start) == []
    assert [e for e in fleet.events if e[0] >= start] == []
    # what is written meanwhile is the readings' refresh, once a minute per workload at most
    assert len([t for t, _, _ in fleet.patches if t >= start]) <= fleet.size * (300 / 60 + 1)
    assert metrics.PROMETHEUS_OUTAGES._value.get() >= 12  # one per flap, said for the fleet


async def test_a_long_outage_flips_each_workload_once_each_way_spread_out() -> None:
    fleet = Fleet(size=40)
    await fleet.run(NOW, 60, down=[])
    start, end = NOW + 60, NOW + 180
    await fleet.run(start, 240, down=[(start, end)])
    for name in fleet.names:
        assert transitions(fleet, name, start) == ["False", "True"], name
    assert [e for e in fleet.events if e[0] >= start] == [], "no Event per workload"
    downs = Counter(t for t, _, s in fleet.metrics_flips(start) if s == "False")
    ups = Counter(t for t, _, s in fleet.metrics_flips(start) if s == "True")
    assert min(downs) >= start + DAMPING.grace_seconds
    assert max(downs) <= start + DAMPING.grace_seconds + DAMPING.spread_seconds + SYNC
    assert max(ups) <= end + DAMPING.spread_seconds + SYNC
    # neither end writes the fleet in one round of decisions
    assert max(downs.values()) < fleet.size and max(ups.values()) < fleet.size
    # while it lasts, one status patch per workload (its flip); after it, the readings go out
    # at the budget's pace
    during = [n for t, n, _ in fleet.patches if start <= t < end]
    assert len(during) == fleet.size
    after = [n for t, n, _ in fleet.patches if t >= end]
    assert len(after) <= fleet.size + RefreshBudget().per_second * (240 - 120)


async def test_an_outage_beginning_before_the_last_ones_end_was_shown_ends_quietly() -> None:
    """Seed 27's MetricsRecovered: Prometheus answered again for one read, some workloads'
    statuses had not yet followed that end when it went out again, and when the second outage
    ended their losses, written in the first, came back as their own, with an Event each."""
    fleet = Fleet(size=40)
    await fleet.run(NOW, 60, down=[])
    start = NOW + 60
    first_end = start + 120  # long enough for every status to say it
    await fleet.run(start, 300, down=[(start, first_end), (first_end + SYNC, first_end + 60)])
    assert len(fleet.health.state.outages()) == 2  # two outages, not one
    for name in fleet.names:
        assert transitions(fleet, name, start)[-1] == "True", name
    assert [e for e in fleet.events if e[0] >= start] == []


async def test_a_loss_left_standing_by_an_end_nobody_followed_ends_quietly() -> None:
    """Seed 31's 148 MetricsRecovered: the replica in charge lost the Lease before the first
    outage ended and took it back after the second began, so no status followed the first end;
    when the second ended, the losses written in the first came back as the workloads' own."""
    fleet = Fleet(size=40)
    await fleet.run(NOW, 60, down=[])
    start = NOW + 60
    first_end = start + 120  # long enough for every status to say it
    second = (first_end + 3 * DAMPING.spread_seconds, first_end + 3 * DAMPING.spread_seconds + 60)
    away = (first_end - SYNC, second[0] + SYNC)
    await fleet.run(start, 400, down=[(start, first_end), second], away=away)
    assert all(transitions(fleet, n, start)[0] == "False" for n in fleet.names)
    assert not any(away[0] <= t < away[1] for t, _, _ in fleet.patches)
    for name in fleet.names:
        assert transitions(fleet, name, start)[-1] == "True", name
    assert [e for e in fleet.events if e[0] >= start] == []


async def test_a_loss_from_before_several_short_outages_ends_quietly() -> None:
    """Seed 34's 124 MetricsRecovered: the replica lost the Lease just after a long outage
    ended, and two short ones came and went before it decided again; with two outages kept,
    the long one was forgotten and its losses taken for the workloads' own."""
    fleet = Fleet(size=40)
    await fleet.run(NOW, 60, down=[])
    start = NOW + 60
    long_end = start + 120
    short = [(long_end + 30 * (i + 1), long_end + 30 * (i + 1) + 10) for i in range(3)]
    away = (long_end - SYNC, short[-1][1] + SYNC)
    await fleet.run(start, 360, down=[(start, long_end), *short], away=away)
    assert all(transitions(fleet, n, start)[0] == "False" for n in fleet.names)
    assert len(fleet.health.state.outages()) == 4
    for name in fleet.names:
        assert transitions(fleet, name, start)[-1] == "True", name
    assert [e for e in fleet.events if e[0] >= start] == []


def test_a_replica_keeps_its_last_outages_and_hands_as_many_over() -> None:
    health = PrometheusHealth()
    for i in range(KEPT_OUTAGES + 3):
        health.observe(at(snapshot(None, [pod("chat-0")]), NOW + 20 * i))
        health.observe(at(snapshot(70.0, [pod("chat-0")]), NOW + 20 * i + 10))
    spans = health.state.spans()
    assert len(spans) == KEPT_OUTAGES and spans[0] == (NOW + 20 * (KEPT_OUTAGES + 2), spans[0][1])
    fresh = PrometheusHealth()
    fresh.inherit((*spans, (NOW - 900, NOW - 800)), "replica-a")
    assert fresh.state.spans() == spans


async def known_again(lost: dict[str, Any], prometheus: PrometheusState) -> tuple[list[str], str]:
    """One workload's turn on a read that knows its metrics, MetricsAvailable having been
    `lost`: the Events it posts, and the status its condition is written with."""
    fleet = Fleet(size=1)
    name = fleet.names[0]
    fleet.statuses[name] = {"conditions": [lost]}
    read = at(snapshot(70.0, fleet.pods[name]), NOW)
    cycle = Cycle(read, autoscalers={}, workloads=1, prometheus=prometheus)
    obj = workload({**fleet.spec, "targetRef": {"name": name}}, fleet.statuses[name], name=name)
    outcome = await reconcile(obj, fleet.view, cycle, fleet.services, fleet.memory, NOW)
    shown = [c for c in outcome.status_patch["conditions"] if c["type"] == "MetricsAvailable"]
    return [e.reason.value for e in outcome.events], shown[0]["status"]


def lost_at(moment: float, reason: str) -> dict[str, Any]:
    return {
        "type": "MetricsAvailable",
        "status": "False",
        "reason": reason,
        "message": f"gpuUtilization: {reason}",
        "lastTransitionTime": iso(moment),
    }


async def test_a_workload_unknown_for_its_own_reasons_recovers_with_an_event() -> None:
    """Its False predates the outage: the outage's end is not what brings it back."""
    ended = PrometheusState(Outage(DOWN, since=NOW - 300, until=NOW - 1))
    events, status = await known_again(lost_at(NOW - 600, "NoSamples"), ended)
    assert (events, status) == (["MetricsRecovered"], "True")


async def test_a_loss_between_two_outages_is_the_workloads_own() -> None:
    two = PrometheusState(
        Outage(DOWN, since=NOW - 300, until=NOW - 1), (Outage(DOWN, NOW - 900, NOW - 600),)
    )
    events, status = await known_again(lost_at(NOW - 500, "NoSamples"), two)
    assert (events, status) == (["MetricsRecovered"], "True")
    events, status = await known_again(lost_at(NOW - 700, "PrometheusUnreachable"), two)
    assert events == []


async def test_a_read_known_inside_an_outage_brings_back_its_loss_quietly() -> None:
    """Its False came with the outage (written after the grace, without an Event): a read that
    knows its metrics before the outage is over posts no MetricsRecovered either. The soak
    saw one per workload at each answer of a Prometheus starting again."""
    ongoing = PrometheusState(Outage(DOWN, since=NOW - 300))
    events, status = await known_again(lost_at(NOW - 60, "PrometheusUnreachable"), ongoing)
    assert (events, status) == ([], "True")


async def test_the_workloads_own_queries_wait_for_prometheus() -> None:
    wake = 'sum(gateway_pending_requests{namespace="llm",service="chat"})'
    fleet = Fleet(
        size=3,
        spec=spec(replicas={"min": 0}, scaleToZero={"enabled": True, "wakeQuery": wake}),
    )
    await fleet.run(NOW, 10, down=[])
    asked = len([a for a in fleet.metrics.asked if a[0] == "scalar"])
    assert asked > 0
    await fleet.run(NOW + 10, 30, down=[(NOW + 10, NOW + 40)])
    assert len([a for a in fleet.metrics.asked if a[0] == "scalar"]) == asked


def test_the_refresh_budget_lets_out_its_rate_whatever_is_due() -> None:
    budget = RefreshBudget(per_second=10)
    taken = sum(budget.take(NOW + i * 0.01) for i in range(1000))  # 10 s, 1,000 due
    assert 100 <= taken <= 110


def test_prometheus_health_is_said_once_at_each_end(caplog: pytest.LogCaptureFixture) -> None:
    """Samples are 5 s old when read. The outage ends when Prometheus answers with samples
    taken since it began, not when a restarted one answers with what it had before."""
    health = PrometheusHealth()
    up = snapshot(70.0, [pod("chat-0")])
    down = snapshot(None, [pod("chat-0")])
    moved = dataclasses.replace(up, full=False)
    caplog.set_level(logging.WARNING, "gpusizer.signals.health")
    reads = [(0, up), (1, down), (2, down), (3, moved), (4, down), (5, up), (10, up), (11, up)]
    states = [health.observe(at(s, NOW + t)) for t, s in reads]
    assert [s.down is not None for s in states] == [
        False,
        True,
        True,
        True,
        True,
        True,
        False,
        False,
    ]
    assert states[-1].outage is not None and states[-1].outage.until == NOW + 10
    assert states[1].outage is not None and states[1].outage.problem == DOWN
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert "Prometheus is unavailable" in lines[0] and "PrometheusUnreachable" in lines[0]
    assert "answers again after 9s" in lines[1]
    assert metrics.PROMETHEUS_AVAILABLE._value.get() == 1


def test_a_rate_evaluated_now_does_not_end_an_outage() -> None:
    """A restarted Prometheus answers the request rate over the samples it had before, stamped
    when it evaluates it: the outage lasts until the scraped series are new again (a soak's
    seed 27 otherwise posted a StaleSamples Event for every workload)."""
    health = PrometheusHealth()
    health.observe(at(snapshot(None, [pod("chat-0")]), NOW + 1))
    key = (NS, "chat-0")

    def read(gpu_age: float) -> Snapshot:
        return Snapshot(
            NOW + 10,
            signals={
                GPU_UTIL: PodSamples({key: Sample(70.0, gpu_age)}, read_at=NOW + 10),
                request_rate_signal(Server.VLLM): PodSamples(
                    {key: Sample(3.0, 0)}, read_at=NOW + 10
                ),
            },
        )

    assert health.observe(read(gpu_age=30)).down is not None, "scraped before it began"
    assert health.observe(read(gpu_age=5)).down is None


def test_a_read_that_answered_anything_is_no_outage() -> None:
    partly = snapshot(70.0, [pod("chat-0")])
    partly.errors["queue:vllm"] = DOWN
    assert failed_whole(partly) is None
    assert failed_whole(Snapshot(NOW)) is None  # asked nothing: says nothing
    assert failed_whole(snapshot(None, [])) == DOWN


async def test_a_query_failing_once_is_said_at_the_next_turn_unless_prometheus_is_out() -> None:
    """A workload's own query sent just after Prometheus stopped answering fails before the
    shared read can say the outage is Prometheus's: its first failing turn holds the replicas
    and says nothing; the next says it, unless the outage is by then Prometheus's."""
    wake = 'sum(gateway_pending_requests{namespace="llm",service="chat"})'
    fleet = Fleet(
        size=1,
        spec=spec(replicas={"min": 0}, scaleToZero={"enabled": True, "wakeQuery": wake}),
    )
    fleet.metrics.scalars[wake] = 0.0
    await fleet.run(NOW, 10, down=[])
    fleet.metrics.scalars[wake] = Problem(Reason.QUERY_ERROR, "HTTP Status Code 500")
    await fleet.period(NOW + 10, prometheus_up=True)
    assert fleet.metrics_flips(NOW + 10) == [] and fleet.events == []
    await fleet.period(NOW + 15, prometheus_up=True)
    assert [s for _, _, s in fleet.metrics_flips(NOW + 10)] == ["False"]
    assert [reason for _, _, reason in fleet.events] == ["MetricsUnavailable"]

    fleet.metrics.scalars[wake] = 0.0
    await fleet.run(NOW + 20, 10, down=[])  # known again, then out again: a flap
    await fleet.period(NOW + 30, prometheus_up=True)
    fleet.metrics.scalars[wake] = Problem(Reason.QUERY_ERROR, "HTTP Status Code 500")
    await fleet.period(NOW + 35, prometheus_up=True)  # its own query first
    await fleet.run(NOW + 40, 30, down=[(NOW + 40, NOW + 70)])  # then every query
    assert [reason for t, _, reason in fleet.events if t >= NOW + 30] == []


async def test_a_query_failing_first_after_an_earlier_outage_holds_its_word_too() -> None:
    """Prometheus out, back, and out again a little later (a soak's seed 27): the workload's
    own query failing first must be held as on a Prometheus never out before, not said with an
    Event because an earlier outage is over."""
    wake = 'sum(gateway_pending_requests{namespace="llm",service="chat"})'
    fleet = Fleet(
        size=1,
        spec=spec(replicas={"min": 0}, scaleToZero={"enabled": True, "wakeQuery": wake}),
    )
    fleet.metrics.scalars[wake] = 0.0
    await fleet.run(NOW, 60, down=[(NOW + 10, NOW + 20)])  # an outage, over
    fleet.metrics.scalars[wake] = Problem(Reason.QUERY_ERROR, "HTTP Status Code 500")
    await fleet.period(NOW + 60, prometheus_up=True)  # its own query first
    await fleet.run(NOW + 65, 15, down=[(NOW + 65, NOW + 80)])  # then every query, briefly
    fleet.metrics.scalars[wake] = 0.0
    await fleet.run(NOW + 80, 15, down=[])
    assert [reason for t, _, reason in fleet.events if t >= NOW + 60] == []
    assert fleet.metrics_flips(NOW + 60) == []


async def test_a_short_failure_of_the_autoscaler_list_re_announces_nothing() -> None:
    """While the API server restarts, the list of HPAs fails: every turn holds, and a paused
    workload's status stays Paused, so no Paused Event is posted again when it comes back."""
    fleet = Fleet(size=1)
    name = fleet.names[0]
    paused = {"gpusizer.io/paused": "true"}

    async def turn(now: float, error_since: float | None) -> Any:
        read = at(snapshot(70.0, fleet.pods[name]), now)
        cycle = Cycle(
            read,
            autoscalers={},
            error="listing HPAs and ScaledObjects failed: 503" if error_since else None,
            error_since=error_since,
            workloads=1,
        )
        obj = workload(
            {**fleet.spec, "targetRef": {"name": name}},
            fleet.statuses.get(name, {}),
            paused,
            name=name,
        )
        outcome = await reconcile(obj, fleet.view, cycle, fleet.services, fleet.memory, now)
        fleet.statuses[name] = {
            k: v for k, v in {**fleet.statuses.get(name, {}), **outcome.status_patch}.items() if v
        }
        return outcome

    first = await turn(NOW, None)
    assert [e.reason.value for e in first.events] == ["Paused"]
    during = await turn(NOW + 5, error_since=NOW + 5)
    assert "conditions" not in during.status_patch and during.events == []
    after = await turn(NOW + 10, None)
    assert after.events == [] and "conditions" not in after.status_patch

    long = await turn(NOW + 200, error_since=NOW + 15)  # past the grace: said
    ready = next(c for c in long.status_patch["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "AutoscalerCheckFailed"


def test_an_outage_lasts_until_every_target_was_scraped_again_or_settled() -> None:
    """A restarted Prometheus scrapes its targets one by one: while some pods' samples are
    from before the outage, it goes on (the soak's seed 27 otherwise posted a StaleSamples
    Event for every workload whose target came later), but no longer than SETTLE_SECONDS
    after the first new sample, for a target may be down for a reason of its own."""
    health = PrometheusHealth()
    health.observe(at(snapshot(None, [pod("chat-0")]), NOW + 1))

    def read(now: float, ages: dict[str, float]) -> Snapshot:
        samples = {(NS, name): Sample(70.0, age) for name, age in ages.items()}
        return Snapshot(now, signals={GPU_UTIL: PodSamples(samples, read_at=now)})

    assert health.observe(read(NOW + 10, {"a": 30, "b": 30})).down is not None
    assert health.observe(read(NOW + 15, {"a": 2, "b": 35})).down is not None, "b not yet"
    assert health.observe(read(NOW + 20, {"a": 2, "b": 2})).down is None, "all scraped again"

    health.observe(at(snapshot(None, [pod("chat-0")]), NOW + 100))
    first_new = NOW + 110
    assert health.observe(read(first_new, {"a": 2, "b": 120})).down is not None
    later = first_new + SETTLE_SECONDS - 1
    assert health.observe(read(later, {"a": 2, "b": 180})).down is not None
    settled = health.observe(read(first_new + SETTLE_SECONDS, {"a": 2, "b": 181}))
    assert settled.down is None and settled.outage is not None
    assert settled.outage.until == first_new + SETTLE_SECONDS


@pytest.mark.parametrize("inherited", [True, False])
async def test_a_replica_taking_over_in_an_outage_starts_in_it(inherited: bool) -> None:
    """The replica in charge was killed while Prometheus was out; its successor's first read
    is of a restarted Prometheus answering with samples from before the outage. Starting in
    the outage the Lease names, it holds quietly; starting from nothing (the soak, before the
    Lease), every workload posted StaleSamples."""
    fleet = Fleet(5)
    await fleet.period(NOW - 300, prometheus_up=True)  # the predecessor's statuses
    fleet.memory, fleet.health = Memory(), PrometheusHealth()  # the successor's process
    if inherited:
        fleet.health.inherit(((NOW - 240, None),), "replica-a")
    await fleet.period(NOW, prometheus_up=True, age=250)
    if inherited:
        assert fleet.health.state.down is not None
        assert fleet.events == []
    else:
        assert Counter(e[2] for e in fleet.events) == {"MetricsUnavailable": 5}


def test_the_outages_both_replicas_saw_are_joined_where_they_overlap(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "gpusizer.signals.health")
    health = PrometheusHealth()
    health.observe(at(snapshot(None, [pod("chat-0")]), NOW))  # its own, since it started
    caplog.clear()
    health.inherit(((NOW - 300, None), (NOW - 900, NOW - 600)), "replica-a")
    assert health.state.spans() == ((NOW - 300, None), (NOW - 900, NOW - 600))
    joined = health.state.down
    assert joined is not None and "replica-a" in joined.problem.message  # the earlier's
    assert caplog.records == []  # it said its own already
    fresh = PrometheusHealth()
    fresh.inherit(((NOW - 300, None),), "replica-a")
    inherited = fresh.state.down
    assert inherited is not None and inherited.since == NOW - 300
    assert "replica-a" in inherited.problem.message
    assert [r.getMessage() for r in caplog.records] == [
        f"Prometheus has been unavailable since {iso(NOW - 300)}, as replica replica-a saw it: "
        "every workload holds its replicas until it answers"
    ]


def test_an_ended_outage_inherited_stays_ended_beside_one_going_on() -> None:
    health = PrometheusHealth()
    health.observe(at(snapshot(None, [pod("chat-0")]), NOW))
    health.inherit(((NOW - 300, NOW - 200),), "replica-a")  # over before this one began
    assert health.state.spans() == ((NOW, None), (NOW - 300, NOW - 200))
    fresh = PrometheusHealth()
    handed = ((NOW - 60, NOW - 5), (NOW - 300, NOW - 200), (NOW - 999, NOW - 900))
    fresh.inherit(handed, "a")
    assert fresh.state.down is None
    assert fresh.state.spans() == handed


async def test_samples_gone_stale_after_an_outage_the_statuses_showed_are_its_tail() -> None:
    """Seed 39's 119 MetricsUnavailable Events: an outage long enough for every status to show
    it, then Prometheus killed; restarted, it answered with samples scraped during the outage
    (so the outage ended) but past maxSampleAgeSeconds. Each loss the outage had written gave
    way to StaleSamples, a new reason, with an Event. Within SETTLE_SECONDS of the end the
    outage's loss stands; a failure that lasts longer is the workload's own and said."""
    fleet = Fleet(size=5, spec=spec(metrics={"maxSampleAgeSeconds": 30}))
    await fleet.run(NOW, 60, down=[])
    start = NOW + 60
    shown = start + DAMPING.grace_seconds + DAMPING.spread_seconds + SYNC
    await fleet.run(start, shown - start, down=[(start, shown)])
    assert all(transitions(fleet, n, start) == ["False"] for n in fleet.names)
    back = shown + 10
    for t in range(0, 20, int(SYNC)):  # scraped after the outage began, 35 s before `back`
        await fleet.period(back + t, prometheus_up=True, age=35 + t)
    outage = fleet.health.state.outage
    assert outage is not None and outage.until == back
    assert [e for e in fleet.events if e[0] >= start] == []
    for t in range(20, int(SETTLE_SECONDS) + 20, int(SYNC)):  # stale for longer: its own
        await fleet.period(back + t, prometheus_up=True, age=35 + t)
    assert Counter(e[2] for e in fleet.events) == {"MetricsUnavailable": 5}


async def test_a_successor_taking_over_before_an_outage_end_was_followed_ends_it_quietly() -> None:
    """The replica in charge through a long outage is killed as it ends, before the statuses
    followed; its successor started since. Knowing the outage from the Lease, it brings the
    losses back as the outage's; knowing nothing, it said MetricsRecovered on every workload."""
    fleet = Fleet(size=20)
    await fleet.run(NOW, 60, down=[])
    start, end = NOW + 60, NOW + 180
    await fleet.run(start, end - start + SYNC, down=[(start, end)])
    assert all(transitions(fleet, n, start) == ["False"] for n in fleet.names)
    handed = fleet.health.state.spans()
    fleet.memory, fleet.health = Memory(), PrometheusHealth()  # the successor's process
    fleet.health.inherit(handed, "replica-a")
    await fleet.run(end + 2 * SYNC, 60, down=[])
    assert all(transitions(fleet, n, start) == ["False", "True"] for n in fleet.names)
    assert [e for e in fleet.events if e[0] >= start] == []


@pytest.mark.parametrize("restated", [True, False])
async def test_the_first_turns_after_taking_over_know_the_predecessors_outage(
    restated: bool,
) -> None:
    """Seed 38's 13 MetricsRecovered: the replica in charge wrote its workloads' losses
    quietly, an outage it saw having lasted the grace, and was killed while it went on. The
    standby had seen an outage of its own end a moment before those losses. Taking over, it
    decided every workload at once on the cycle it had read before learning its predecessor's
    outages from the Lease (`Runtime.took_over`): on that cycle, the losses were not an
    outage's, and each came back with an Event."""
    fleet = Fleet(size=10)
    await fleet.run(NOW, 60, down=[])
    start = NOW + 60
    await fleet.run(
        start, DAMPING.grace_seconds + DAMPING.spread_seconds + SYNC, down=[(start, start + 999)]
    )
    assert all(transitions(fleet, n, start) == ["False"] for n in fleet.names)
    losses = min(t for t, _, status in fleet.metrics_flips(start) if status == "False")
    handed = LeaseRecord("replica-a", "", prometheus_outages=fleet.health.state.spans())
    standby = PrometheusHealth()  # the successor's own view: an outage over before the losses
    standby.observe(fleet.read(start + SYNC, prometheus_up=False))
    standby.observe(fleet.read(losses - 1, prometheus_up=True))
    fleet.memory, fleet.health = Memory(), standby
    taking_over = losses + 60
    read = fleet.read(taking_over, prometheus_up=True)
    clock = CycleClock(never_fetched, period_seconds=3600)
    clock.publish(
        Cycle(read, autoscalers={}, workloads=fleet.size, prometheus=standby.observe(read))
    )
    if restated:
        runtime = Runtime(
            fleet.services, fleet.memory, FakeStatus(), clock, ThreadPoolExecutor(max_workers=1)
        )
        runtime.took_over(standby, handed)
        assert runtime.confirming is not None
        await asyncio.wait_for(runtime.confirming, timeout=10)
    assert clock.latest is not None
    await fleet.decide(clock.latest, taking_over)
    if restated:
        assert [e for e in fleet.events if e[0] >= start] == []
    else:
        assert Counter(e[2] for e in fleet.events if e[0] >= start) == {
            "MetricsRecovered": fleet.size
        }


async def test_a_cycle_read_while_this_replica_took_over_carries_its_predecessors_outage() -> None:
    """The Lease can change hands between a read and its cycle's publication (while the list
    of other autoscalers is awaited): the cycle says what is known when it is handed out."""
    read = asyncio.Event()

    class Observing(PrometheusHealth):
        def observe(self, snapshot: Snapshot) -> PrometheusState:
            state = super().observe(snapshot)
            read.set()
            return state

    health = Observing()

    async def taking_over_meanwhile() -> dict[Any, str]:
        await read.wait()  # the list lands after the read
        health.inherit(((NOW - 300, None),), "replica-a")
        return {}

    cycle = await fetch_cycle(
        SnapshotReader(FakeMetrics(), Server, 0), health, taking_over_meanwhile, FailingSince()
    )
    down = cycle.prometheus.down
    assert down is not None and down.since == NOW - 300


@pytest.mark.parametrize("came_back", [True, False])
async def test_a_pod_scaled_up_during_an_outage_is_awaited_after_it(came_back: bool) -> None:
    """chat-1 turned ready while Prometheus was out; the restarted Prometheus has not scraped
    it yet. Right after the outage, that is capacity on its way; with no outage behind it, a
    hole in the data."""
    seen, new = pod("chat-0", labels={"app": "chat"}), pod("chat-1", labels={"app": "chat"})
    new = dataclasses.replace(new, ready_since=NOW - 600)
    outage = Outage(DOWN, NOW - 900, NOW - 5) if came_back else None
    cycle = Cycle(snapshot(70.0, [seen]), autoscalers={}, prometheus=PrometheusState(outage))
    outcome = await reconcile(
        workload(spec(), {}, name="chat", namespace=NS),
        ClusterView({NS: [seen, new]}, {}),
        cycle,
        services(FakeMetrics(), FakeTargets({(NS, "chat"): target(selector="app=chat")})),
        Memory(),
        NOW,
    )
    available = next(
        c for c in outcome.status_patch["conditions"] if c["type"] == "MetricsAvailable"
    )
    assert (available["status"], available["reason"]) == (
        ("True", "MetricsOK") if came_back else ("False", "PartialSamples")
    )


async def test_samples_gone_stale_while_prometheus_was_out_are_its_tail_not_the_workloads() -> None:
    """Seed 28: Prometheus answered 500 for a minute, then was killed; restarted, it answered
    with the samples it had scraped during the 500s, newer than the outage's start (so the
    outage ended) but past maxSampleAgeSeconds, until it scraped again: every workload said
    StaleSamples. Within SETTLE_SECONDS of the end such a failure is held quietly; one that
    lasts longer is the workload's own and said."""
    fleet = Fleet(size=5, spec=spec(metrics={"maxSampleAgeSeconds": 30}))
    await fleet.run(NOW, 60, down=[])
    await fleet.period(NOW + 60, prometheus_up=False)
    back = NOW + 100
    for t in range(0, 20, int(SYNC)):  # scraped at NOW + 65, 35 s before `back`
        await fleet.period(back + t, prometheus_up=True, age=35 + t)
    assert fleet.health.state.outage is not None and fleet.health.state.outage.until == back
    await fleet.run(back + 20, 20, down=[])
    assert [e for e in fleet.events if e[0] >= NOW + 60] == []
    assert fleet.metrics_flips(NOW + 60) == []
    for t in range(0, int(SETTLE_SECONDS) + 20, int(SYNC)):  # stale for longer: its own
        await fleet.period(back + 40 + t, prometheus_up=True, age=35 + t)
    assert Counter(e[2] for e in fleet.events) == {"MetricsUnavailable": 5}


def holding_decisions(fleet: Fleet) -> list[bool]:
    """Whether each workload's last decision was on unknown metrics (it holds its replicas),
    as the operator's gauge says."""
    return [scraped(n, NS).get(("gpusizer_metrics_available", ())) == 0 for n in fleet.names]


@dataclasses.dataclass
class Partly:
    """`fleet` read through `read_full` once per SYNC, every query answering but the GPU
    utilisation's when told to time out."""

    fleet: Fleet
    last: Snapshot | None = None
    t: float = NOW

    def now(self) -> float:
        return self.t

    async def run(self, seconds: float, util_answers: bool, queue: float = 0.0) -> float:
        """Periods for `seconds`, every pod with `queue` requests waiting; returns when they
        began."""
        start, fleet = self.t, self.fleet
        pods = [p for ps in fleet.pods.values() for p in ps]
        while self.t < start + seconds:
            answers: dict[str, PodSamples | Problem] = {
                name: dataclasses.replace(samples, read_at=self.t)
                for name, samples in snapshot(70.0, pods).signals.items()
            }
            waiting = answers[queue_signal(Server.VLLM)]
            answers[queue_signal(Server.VLLM)] = dataclasses.replace(
                waiting, samples={p: Sample(queue, s.age) for p, s in waiting.samples.items()}
            )
            if not util_answers:
                answers[GPU_UTIL] = TIMED_OUT
            fleet.metrics.answers = answers
            read = await read_full(fleet.metrics, [Server.VLLM], last=self.last, wall=self.now)
            self.last = read
            prometheus = fleet.health.observe(read)
            cycle = Cycle(read, autoscalers={}, workloads=fleet.size, prometheus=prometheus)
            await fleet.decide(cycle, self.t)
            self.t += SYNC
        return start


async def test_one_query_timing_out_while_the_rest_answer_writes_nothing_while_fresh() -> None:
    """At 10,000 workloads a busy Prometheus let one query of a read time out: every workload
    said its metrics lost and back, an Event and a status write each way, keeping it busy
    (bench/README.md, "Issue 29"). The samples of the read before stand in while fresh; a
    failure outlasting them is said once each way, after the grace."""
    fleet = Fleet(size=20)
    partly = Partly(fleet)
    await partly.run(60, util_answers=True)
    start = await partly.run(60, util_answers=False)  # shorter than maxSampleAgeSeconds (90)
    assert fleet.metrics_flips(start) == [] and [e for e in fleet.events if e[0] >= start] == []
    assert fleet.health.state.outage is None, "not an outage of Prometheus"
    assert not any(holding_decisions(fleet)), "decided on the samples read before"

    await partly.run(90, util_answers=False)  # the samples it holds go stale: said
    await partly.run(30, util_answers=True)
    for name in fleet.names:
        assert transitions(fleet, name, start) == ["False", "True"], name
    lost = [c for _, _, patch in fleet.patches for c in patch.get("conditions") or []]
    reasons = {
        c["reason"] for c in lost if c["type"] == "MetricsAvailable" and c["status"] == "False"
    }
    assert reasons == {Reason.PROMETHEUS_UNREACHABLE.value}
    said = Counter(reason for when, _, reason in fleet.events if when >= start)
    assert said == {"MetricsUnavailable": fleet.size, "MetricsRecovered": fleet.size}


async def test_a_shared_query_failing_past_its_samples_is_said_after_the_grace() -> None:
    """Past the samples it held, a failing shared query holds every workload's replicas at
    once, and its statuses follow as an outage's do: nothing within the grace, then spread."""
    fleet = Fleet(size=20, spec=spec(metrics={"server": "vllm", "maxSampleAgeSeconds": 10}))
    partly = Partly(fleet)
    await partly.run(60, util_answers=True)
    start = await partly.run(DAMPING.grace_seconds - SYNC, util_answers=False)
    assert all(holding_decisions(fleet)), "past the samples: replicas held"
    assert fleet.metrics_flips(start) == [] and [e for e in fleet.events if e[0] >= start] == []

    await partly.run(DAMPING.spread_seconds + 3 * SYNC, util_answers=False)
    downs = Counter(t for t, _, status in fleet.metrics_flips(start) if status == "False")
    assert sum(downs.values()) == fleet.size
    assert min(downs) >= start + DAMPING.grace_seconds
    assert max(downs.values()) < fleet.size, "not the whole fleet in one round"


async def test_inside_the_grace_the_readings_and_what_follows_them_stand() -> None:
    """A shared query failing past the samples it held is the fleet's, said after the grace:
    until then no workload writes its readings gone, nor its idleness or its limit with them
    (bench/README.md, "Issue 29: a memory read that timed out")."""
    idle = spec(
        metrics={"server": "vllm", "maxSampleAgeSeconds": 10},
        replicas={"min": 2, "targetQueuePerReplica": 4},
        scaleToZero={"idleUtilization": 80},
    )
    fleet = Fleet(size=5, spec=idle)
    partly = Partly(fleet)
    await partly.run(60, util_answers=True)
    idleness = {n: condition(fleet.statuses[n], "ScaledToZero") for n in fleet.names}
    assert {c["reason"] for c in idleness.values()} == {Reason.IDLE.value}
    start = await partly.run(DAMPING.grace_seconds - SYNC, util_answers=False)
    assert all(holding_decisions(fleet)), "past the samples: replicas held"
    written = [patch for when, _, patch in fleet.patches if when >= start]
    assert not [p for p in written if "conditions" in p]
    readings = [p["observation"] for p in written if "observation" in p]
    assert all(r.get("gpuUtilization") is not None for r in readings), readings
    assert {n: condition(fleet.statuses[n], "ScaledToZero") for n in fleet.names} == idleness
    await partly.run(SYNC, util_answers=False, queue=40)  # scaled up on the queue: said
    for name in fleet.names:
        assert fleet.statuses[name]["currentReplicas"] > 2
        assert condition(fleet.statuses[name], "ScaledToZero")["reason"] == Reason.ACTIVE.value

    await partly.run(DAMPING.spread_seconds + 3 * SYNC, util_answers=False)  # said, after
    for name in fleet.names:
        assert fleet.statuses[name]["observation"].get("gpuUtilization") is None
        assert condition(fleet.statuses[name], "ScaledToZero")["reason"] == Reason.ACTIVE.value


def condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == type_)
