"""What `gpusizer run` registers with kopf."""

from __future__ import annotations

import asyncio
import copy
import inspect
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any, cast

import kopf
import pytest
from gpusizer.api.v1alpha1 import GROUP, PLURAL, VERSION
from gpusizer.clock import CycleClock
from gpusizer.handlers import DECISION_GRACE_SECONDS, register, stopped_or_gone
from gpusizer.memory import Memory
from gpusizer.settings import OperatorSettings, PrometheusSettings
from gpusizer.startup import Runtime, exit_watchdog
from gpusizer.workload import Departures
from kopf._cogs.aiokits import aioenums
from kopf._cogs.structs import bodies, ephemera, finalizers, references
from kopf._core.actions import application
from kopf._core.engines import indexing
from kopf._core.intents.handlers import DaemonHandler, TimerHandler
from kopf._core.reactor import inventory, processing

from tests.fakes import FakeMetrics, FakeStatus, FakeTargets, never_fetched, services


def registered(sync_period_seconds: float = 15, partitioning: bool = True) -> kopf.OperatorRegistry:
    """The handlers `gpusizer run` registers, in a registry of their own."""
    previous = kopf.get_default_registry()
    registry = kopf.OperatorRegistry()
    kopf.set_default_registry(registry)
    try:
        register(
            OperatorSettings(
                PrometheusSettings(url="http://prometheus"),
                sync_period_seconds=sync_period_seconds,
                partitioning=partitioning,
            )
        )
    finally:
        kopf.set_default_registry(previous)
    return registry


def test_settings_read_as_the_command_line_does_unless_told_otherwise() -> None:
    prometheus = PrometheusSettings(url="http://prometheus")
    assert OperatorSettings(prometheus, sync_period_seconds=7).read_period == 2
    assert OperatorSettings(prometheus, sync_period_seconds=1.5).read_period == 1.5
    assert (
        OperatorSettings(prometheus, sync_period_seconds=7, read_period_seconds=3).read_period == 3
    )


def test_workloads_are_driven_by_the_cycle_clock_not_by_timers() -> None:
    registry = registered(sync_period_seconds=7)
    spawned = [h for h in registry._spawning.get_all_handlers() if h.selector.any_name == PLURAL]
    assert not [h for h in spawned if isinstance(h, TimerHandler)]
    daemons = [h for h in spawned if isinstance(h, DaemonHandler)]
    assert [d.id for d in daemons] == ["size_workload"]
    # a failed decision is retried at the next period; one under way when kopf stops the daemon
    # (deleted, paused behind a peer) is given time to finish rather than being cancelled
    assert daemons[0].backoff == 7
    assert daemons[0].cancellation_backoff == DECISION_GRACE_SECONDS > 0


def test_no_handler_is_sent_to_a_thread() -> None:
    """kopf runs a plain function in a worker thread, behind a shielded task, for every event:
    the pod and target indexes see tens of thousands of events while 5,000 workloads start."""
    registry = registered()
    handlers = [
        *registry._activities.get_all_handlers(),
        *registry._indexing.get_all_handlers(),
        *registry._watching.get_all_handlers(),
        *registry._spawning.get_all_handlers(),
    ]
    assert len(handlers) >= 8
    assert [h.id for h in handlers if not inspect.iscoroutinefunction(h.fn)] == []


def workload_body(resource_version: str, finalizer: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "WorkloadSizing",
        "metadata": {
            "name": "chat",
            "namespace": "ns",
            "uid": "u1",
            "resourceVersion": resource_version,
            "generation": 1,
            "finalizers": [finalizer],
            "annotations": {"gpusizer.io/paused": "false"},
            "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {"f:mode": {}}}}],
        },
        "spec": {"targetRef": {"kind": "Deployment", "name": "chat"}},
        "status": {"desiredReplicas": 2},
    }


class TouchedClock:
    def __init__(self) -> None:
        self.touched: list[object] = []

    def touch(self, key: object) -> None:
        self.touched.append(key)


def raw_event(kind: bodies.RawEventType, body: dict[str, Any]) -> bodies.RawEvent:
    """A watch event as kopf's stream hands it over: the body itself, not a copy."""
    return {"type": kind, "object": cast(bodies.RawBody, body)}


async def process(
    events: list[bodies.RawEvent], memo: ephemera.Memo | None = None
) -> list[dict[str, Any]]:
    """Each event through kopf's own event processing with the registered watch handlers and
    a daemon that holds the body; the metadata of the body kopf keeps after each."""
    registry = kopf.OperatorRegistry()
    for handler in registered()._watching.get_all_handlers():
        registry._watching.append(handler)

    @kopf.daemon(GROUP, VERSION, PLURAL, registry=registry)
    async def holds_the_body(stopped: kopf.DaemonStopped, **_: Any) -> None:
        await stopped.wait()

    settings = kopf.OperatorSettings()
    memories = inventory.ResourceMemories()
    if memo is None:
        memo = ephemera.Memo()
        memo.runtime = SimpleNamespace(clock=TouchedClock(), activator_pushed=lambda *_: None)
    kept = []
    for raw in events:
        await processing.process_resource_event(
            lifecycle=kopf.lifecycles.all_at_once,
            indexers=indexing.OperatorIndexers(),
            registry=registry,
            settings=settings,
            memories=memories,
            memobase=memo,
            resource=references.Resource(GROUP, VERSION, PLURAL, namespaced=True),
            raw_event=raw,
            event_queue=asyncio.Queue(),
        )
        body = (await memories.recall(raw["object"])).daemons_memory.live_fresh_body
        assert body is not None  # the daemon runs and holds it
        kept.append(copy.deepcopy(dict(body.metadata)))
    memory = await memories.recall(events[0]["object"])
    for daemon in list(memory.daemons_memory.running_daemons.values()):
        daemon.stopper.set(reason=kopf.DaemonStoppingReason.OPERATOR_EXITING)
        await daemon.task
    return kept


FINALIZER = kopf.OperatorSettings().persistence.finalizer  # kopf spawns only once it is on


def test_kopf_keeps_no_managed_fields_for_a_workloads_daemon() -> None:
    """kopf keeps each WorkloadSizing's latest body while its daemon runs: the event handler
    must strip the very dict kopf keeps, at creation and at every later change. Driven
    through kopf's own event processing, so a kopf that copied the body would fail here."""
    created, changed = asyncio.run(
        process(
            [
                raw_event("ADDED", workload_body("1", FINALIZER)),
                raw_event("MODIFIED", workload_body("2", FINALIZER)),
            ]
        )
    )
    assert "managedFields" not in created and "managedFields" not in changed
    assert changed["resourceVersion"] == "2"  # the body kept is the latest one
    assert changed["annotations"] == {"gpusizer.io/paused": "false"}


def test_each_gpu_partitioning_takes_a_turn_every_sync_period() -> None:
    spawned = registered(sync_period_seconds=7)._spawning.get_all_handlers()
    timers = [h for h in spawned if isinstance(h, TimerHandler)]
    assert [(t.id, t.selector.any_name, t.interval) for t in timers] == [
        ("partition", "gpupartitionings", 7)
    ]


def test_gpu_partitioning_is_not_served_when_only_some_namespaces_are_watched() -> None:
    spawned = registered(partitioning=False)._spawning.get_all_handlers()
    assert [h.id for h in spawned] == ["size_workload"]


def test_an_event_of_a_workload_has_the_clock_ask_it_at_the_next_read() -> None:
    """A waiting workload is asked whether its spec changed only after an event of its
    object (CycleClock.touch): asking every one at every read cost more than the read."""
    clock = TouchedClock()
    pushed: list[tuple[str, str, dict[str, str]]] = []
    memo = ephemera.Memo()
    memo.runtime = SimpleNamespace(
        clock=clock,
        activator_pushed=lambda namespace, name, annotations: pushed.append(
            (namespace, name, dict(annotations))
        ),
    )
    asyncio.run(
        process(
            [
                raw_event("ADDED", workload_body("1", FINALIZER)),
                raw_event("MODIFIED", workload_body("2", FINALIZER)),
            ],
            memo,
        )
    )
    assert clock.touched == [("ns", "chat"), ("ns", "chat")]
    # and the activator's records still reach the workload, at each event
    assert pushed == [("ns", "chat", {"gpusizer.io/paused": "false"})] * 2


async def test_a_workload_carries_no_finalizer_and_its_deletion_ends_its_turns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Driven through kopf's own event processing with the handlers `gpusizer run` registers:
    kopf would put a finalizer on the object (or keep an old one), and a deleted object's
    daemon would go on without one."""
    registry = registered(partitioning=False)
    assert [h.requires_finalizer for h in registry._spawning.get_all_handlers()] == [False]
    patches: list[Any] = []

    async def recorded(*, patch: Any, **_: Any) -> tuple[bool, str | None, None]:
        if patch:
            patches.append(patch)
        return True, None, None

    monkeypatch.setattr(application, "apply", recorded)
    runtime = Runtime(
        services(FakeMetrics(), FakeTargets()),
        Memory(),
        FakeStatus(),
        CycleClock(never_fetched, period_seconds=3600),
        ThreadPoolExecutor(max_workers=1),
    )
    memobase = ephemera.Memo()
    memobase.runtime = runtime
    indexers = indexing.OperatorIndexers()
    indexers.ensure(registry._indexing.get_all_handlers())
    memories = inventory.ResourceMemories()
    settings = kopf.OperatorSettings()

    async def event(kind: bodies.RawEventType, body: dict[str, Any]) -> None:
        await processing.process_resource_event(
            lifecycle=kopf.lifecycles.all_at_once,
            indexers=indexers,
            registry=registry,
            settings=settings,
            memories=memories,
            memobase=memobase,
            resource=references.Resource(GROUP, VERSION, PLURAL, namespaced=True),
            raw_event=raw_event(kind, body),
            event_queue=asyncio.Queue(),
        )

    body = workload_body("1", finalizer="")
    body["metadata"]["finalizers"] = []
    await event(None, body)
    daemons = (await memories.recall(body)).daemons_memory.running_daemons
    assert len(daemons) == 1, "the daemon runs without a finalizer"
    task = next(iter(daemons.values())).task
    assert patches == [], "kopf added a finalizer"

    old = workload_body("2", finalizer=settings.persistence.finalizer)
    await event("MODIFIED", old)  # an object from an operator that put one on
    assert [fn.func for fn in patches[-1].fns] == [finalizers.allow_deletion], "kept it"

    await event("DELETED", old)
    await asyncio.wait_for(task, timeout=10)  # its turns ended with the object


async def test_departures_end_the_right_daemon() -> None:
    departures = Departures()
    first = departures.watch("u1")
    assert departures.watch("u1") is first
    departures.release("u1", first)  # paused behind a peer
    second = departures.watch("u1")  # resumed
    departures.release("u1", first)  # the first daemon's late cleanup takes nothing
    departures.departed("u1")
    assert second.done() and not first.done()
    departures.departed("u2")  # created and deleted before its daemon first ran
    assert departures.watch("u2").done()
    assert not departures.watch("u3").done()
    stopped = aioenums.AsyncFlagWaiter(aioenums.FlagSetter[kopf.DaemonStoppingReason]())
    gone: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    waiting = asyncio.ensure_future(stopped_or_gone(stopped, gone))
    await asyncio.sleep(0)
    assert not waiting.done()
    gone.set_result(None)
    await asyncio.wait_for(waiting, timeout=5)


def test_api_requests_outlast_an_api_server_restart() -> None:
    """kopf stops the operator when a peering or watch request runs out of retries: its own
    pauses added up to 54 s, less than a graceful restart of the API server."""
    registry = registered()
    configure = next(
        h for h in registry._activities.get_all_handlers() if h.id.endswith("configure")
    )
    settings = kopf.OperatorSettings()
    started: list[Any] = []
    memo = ephemera.Memo()
    memo.config = OperatorSettings(PrometheusSettings(url="http://prometheus"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("gpusizer.startup.start", lambda *args: started.append(args))
        asyncio.run(configure.fn(settings=settings, memo=memo, pods_by_namespace={}))
    assert started, "configure built the runtime"
    backoffs = settings.networking.error_backoffs
    assert sum(backoffs if isinstance(backoffs, Iterable) else [backoffs]) >= 300


def test_a_stopped_operator_that_hangs_exits_anyway() -> None:
    exited: list[int] = []
    timer = exit_watchdog(0.05, exited.append)
    timer.join(timeout=5)
    assert exited == [1]
