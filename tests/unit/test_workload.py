"""A WorkloadSizing's life in the operator: when it takes a turn, and what it keeps."""

from __future__ import annotations

import asyncio
import gc
import weakref
from typing import Any

import kopf
import pytest
from gpusizer.clock import Cycle, CycleClock
from gpusizer.cluster import ClusterView
from gpusizer.fleet import Fleet
from gpusizer.memory import Memory
from gpusizer.ports import StatusSink
from gpusizer.reconcile import Services
from gpusizer.report.turn import Outcome
from gpusizer.report.writer import WorkloadGone
from gpusizer.signals.queries import KV_CACHE
from gpusizer.signals.snapshot import Snapshot
from gpusizer.workload import Turns, Workload

from tests.fakes import FakeMetrics, FakeStatus, FakeTargets, never_fetched, services, steps_taken


def test_a_workload_is_urgent_when_a_pod_it_read_moved_or_it_read_none() -> None:
    logger = kopf.LocalObjectLogger(body=kopf.Body({}), settings=kopf.OperatorSettings())
    workload = Workload("ns", "chat", {}, logger)
    moved = Cycle(Snapshot(time=0.0), autoscalers={}, moved=frozenset({("ns", "chat-1")}))
    assert workload.urgent(moved)  # not decided yet
    workload.pods = (("ns", "chat-0"),)
    assert not workload.urgent(moved)
    workload.pods = (("ns", "chat-0"), ("ns", "chat-1"))
    assert workload.urgent(moved)


def test_a_workload_changed_when_a_pod_it_read_moved_or_its_spec_changed() -> None:
    raw: dict[str, Any] = {"metadata": {"generation": 3}}
    logger = kopf.LocalObjectLogger(body=kopf.Body(raw), settings=kopf.OperatorSettings())
    workload = Workload("ns", "chat", raw, logger, pods=(("ns", "chat-0"),), generation=3)
    still = Cycle(Snapshot(time=0.0), autoscalers={}, moved=frozenset({("ns", "other-0")}))
    moved = Cycle(Snapshot(time=0.0), autoscalers={}, moved=frozenset({("ns", "chat-0")}))
    assert not workload.changed(still)
    assert workload.changed(moved)
    raw["metadata"]["generation"] = 4  # the body of a later event
    assert workload.changed(still)


def test_an_activator_record_that_changed_asks_for_a_turn_at_once() -> None:
    logger = kopf.LocalObjectLogger(body=kopf.Body({}), settings=kopf.OperatorSettings())
    workload = Workload("ns", "chat", {}, logger)
    record = {"activator.gpusizer.io/a-1": '{"pending": 1}'}
    assert workload.activator_pushed({"gpusizer.io/paused": "false", **record})
    assert not workload.activator_pushed({"other": "changed", **record}), "the same records"
    assert workload.activator_pushed({}), "a record gone (nothing held any more) is news too"


@pytest.mark.parametrize(
    ("spec", "reads"),
    [
        ({"replicas": {"targetGPUUtilization": 70}}, set()),
        ({"replicas": {"targetKVCacheUsage": 80}}, {KV_CACHE}),
        ({"replicas": {"targetKVCacheUsage": 0}}, {KV_CACHE}),
        ({"replicas": "malformed"}, set()),  # its turn says so; the reads need nothing for it
        ({}, set()),
    ],
)
def test_a_workload_on_the_kv_cache_has_the_reads_ask_for_it(
    spec: dict[str, Any], reads: set[str]
) -> None:
    logger = kopf.LocalObjectLogger(body=kopf.Body({}), settings=kopf.OperatorSettings())
    workload = Workload("ns", "chat", {"spec": spec}, logger)
    assert workload.optional_reads == reads


class FirstWriteWaits:
    """A status writer whose first write waits until released, as one does behind thousands
    of others queued for the worker threads."""

    def __init__(self) -> None:
        self.writing = asyncio.Event()
        self.release = asyncio.Event()
        self.patches: list[dict[str, Any]] = []

    async def write(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        self.patches.append(patch)
        if len(self.patches) == 1:
            self.writing.set()
            await self.release.wait()
        return patch


class CountedWorkload(Workload):
    """Says when it has decided twice."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.decisions = 0
        self.decided_once = asyncio.Event()
        self.decided_twice = asyncio.Event()

    async def decide(
        self, cycle: Cycle, view: ClusterView, services: Services, memory: Memory
    ) -> Outcome | None:
        outcome = await super().decide(cycle, view, services, memory)
        self.decisions += 1
        self.decided_once.set()
        if self.decisions == 2:
            self.decided_twice.set()
        return outcome


def mode_off(raw: dict[str, Any]) -> CountedWorkload:
    """A workload in mode Off (it reads and writes nothing but its status) over `raw`."""
    raw.update(
        metadata={"generation": 1},
        spec={
            "targetRef": {"name": "chat"},
            "replicas": {"min": 1, "max": 2, "targetGPUUtilization": 70},
            "mode": "Off",
        },
    )
    logger = kopf.LocalObjectLogger(body=kopf.Body(raw), settings=kopf.OperatorSettings())
    return CountedWorkload("ns", "chat", raw, logger)


def following(
    workload: Workload, writer: StatusSink, decide_every: int = 1
) -> tuple[Fleet[Workload], asyncio.Task[None]]:
    """A fleet of `workload` alone, taking its turns; cycles are published by the test."""
    fleet: Fleet[Workload] = Fleet(CycleClock(never_fetched, period_seconds=3600), decide_every)
    fleet.join(workload)
    # mode Off reads and writes nothing but its status
    turns = Turns(ClusterView({}, {}), services(FakeMetrics(), FakeTargets()), Memory(), writer)
    return fleet, asyncio.create_task(fleet.run(turns.decide, turns.report))


async def test_a_workload_keeps_no_cycle_while_its_status_is_written_or_it_waits() -> None:
    # a cycle's snapshot is megabytes at 5,000 workloads; decisions waiting for their status
    # writes, or for the next cycle, each kept the one they had decided on
    workload = mode_off({})
    writer = FirstWriteWaits()
    fleet, task = following(workload, writer)
    clock = fleet._clock
    clock.publish(Cycle(Snapshot(time=1.0), autoscalers={}))
    await asyncio.wait_for(writer.writing.wait(), timeout=10)
    assert clock.latest is not None
    first = weakref.ref(clock.latest)
    clock.publish(Cycle(Snapshot(time=2.0), autoscalers={}))
    gc.collect()
    assert first() is None, "kept while its status was written"

    writer.release.set()
    # the second decision, on cycle 2; it waits for cycle 3 by the time this resumes
    await asyncio.wait_for(workload.decided_twice.wait(), timeout=10)
    assert clock.latest is not None
    second = weakref.ref(clock.latest)
    clock.publish(Cycle(Snapshot(time=3.0), autoscalers={}))
    gc.collect()
    assert second() is None, "kept while waiting for the next cycle"
    task.cancel()
    ready = next(c for c in writer.patches[0]["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "ModeOff"  # it did decide, and wrote what it decided


async def test_a_spec_change_is_decided_on_at_the_next_read_after_its_event() -> None:
    raw: dict[str, Any] = {}
    workload = mode_off(raw)
    fleet, task = following(workload, FakeStatus(), decide_every=100)
    clock = fleet._clock
    clock.publish(Cycle(Snapshot(time=1.0), autoscalers={}))
    await asyncio.wait_for(workload.decided_once.wait(), timeout=10)
    clock.publish(Cycle(Snapshot(time=2.0), autoscalers={}))  # nothing changed: not asked
    for _ in range(10):  # more passes of the loop than a turn takes
        await steps_taken()
    assert workload.decisions == 1
    raw["metadata"]["generation"] = 2  # the body of its latest event
    fleet.touch(workload.key)  # and the event handler says so
    clock.publish(Cycle(Snapshot(time=3.0), autoscalers={}))
    await asyncio.wait_for(workload.decided_twice.wait(), timeout=10)
    task.cancel()


class GoneWriter:
    """The WorkloadSizing was deleted while no watch said so."""

    def __init__(self) -> None:
        self.patches = 0

    async def write(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        self.patches += 1
        raise WorkloadGone("HTTP 404 Not Found")


async def test_a_workload_found_gone_leaves_the_fleet() -> None:
    writer = GoneWriter()
    workload = mode_off({})
    fleet, task = following(workload, writer)
    fleet._clock.publish(Cycle(Snapshot(time=1.0), autoscalers={}))
    await asyncio.wait_for(workload.decided_once.wait(), timeout=10)
    for _ in range(10):
        await steps_taken()
    task.cancel()
    assert writer.patches == 1
    assert fleet.get(workload.key) is None and fleet._clock.listeners == 0


def test_a_workload_names_the_target_its_spec_scales() -> None:
    logger = kopf.LocalObjectLogger(body=kopf.Body({}), settings=kopf.OperatorSettings())
    raw = {"spec": {"targetRef": {"kind": "StatefulSet", "name": "chat"}}}
    assert Workload("ns", "w", raw, logger).target == ("ns", "StatefulSet", "chat")
    defaulted = {"spec": {"targetRef": {"name": "chat"}}}
    assert Workload("ns", "w", defaulted, logger).target == ("ns", "Deployment", "chat")
    assert Workload("ns", "w", {"spec": {}}, logger).target is None


async def test_what_the_fleet_saw_unchanged_reaches_its_next_turn_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    told: list[float | None] = []
    quiet = [True, False]

    async def turn(*args: Any) -> Outcome:
        told.append(args[6])
        if not quiet:
            raise RuntimeError("a bug")
        return Outcome({}, quiet=quiet.pop(0))

    monkeypatch.setattr("gpusizer.workload.reconcile", turn)
    workload = mode_off({})
    cycle = Cycle(Snapshot(time=1.0), autoscalers={})
    view, memory = ClusterView({}, {}), Memory()
    ports = services(FakeMetrics(), FakeTargets())
    workload.saw_unchanged(5.0)
    await workload.decide(cycle, view, ports, memory)
    assert (told, workload.quiet) == ([5.0], True)
    await workload.decide(cycle, view, ports, memory)
    assert (told, workload.quiet) == ([5.0, None], False)
    workload.quiet = True
    await workload.decide(cycle, view, ports, memory)  # a turn that failed found nothing
    assert not workload.quiet
