"""What the kopf handlers hand to reconcile."""

from __future__ import annotations

import asyncio
import copy
import gc
import inspect
import socket
import threading
import weakref
from typing import Any

import kopf
import pytest
import urllib3
from gpusizer.api.v1alpha1 import GROUP, PLURAL, VERSION
from gpusizer.handlers import (
    DECISION_GRACE_SECONDS,
    OnePerKey,
    OperatorSettings,
    Workload,
    drop_managed_fields,
    instrument,
    register,
)
from gpusizer.reconcile import ClusterView, Cycle, CycleClock, Dependencies, Outcome
from gpusizer.signals.discovery import NodeInfo
from gpusizer.signals.source import PrometheusSettings, Snapshot
from kopf._cogs.structs import ephemera, references
from kopf._core.engines import indexing
from kopf._core.intents.handlers import DaemonHandler, TimerHandler
from kopf._core.reactor import inventory, processing
from kubernetes import client as k8s


def test_one_value_per_key_reads_an_index_without_copying_it() -> None:
    first = NodeInfo("gpu-a", "NVIDIA-H100-80GB-HBM3", {"nvidia.com/gpu": 8}, True)
    index: dict[str, list[NodeInfo]] = {"gpu-a": [first], "gpu-gone": []}
    nodes = OnePerKey(index)  # type: ignore[arg-type]  # a kopf.Index is a mapping of stores
    assert nodes["gpu-a"] is first
    assert nodes.get("gpu-gone") is None and nodes.get("cpu") is None
    assert list(nodes) == ["gpu-a", "gpu-gone"] and len(nodes) == 2
    index["gpu-b"] = [first]
    assert "gpu-b" in nodes  # a view: later index updates show


def registered(sync_period_seconds: float = 15) -> kopf.OperatorRegistry:
    """The handlers `gpusizer run` registers, in a registry of their own."""
    previous = kopf.get_default_registry()
    registry = kopf.OperatorRegistry()
    kopf.set_default_registry(registry)
    try:
        register(
            OperatorSettings(
                PrometheusSettings(url="http://prometheus"),
                sync_period_seconds=sync_period_seconds,
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


def test_a_workload_is_urgent_when_a_pod_it_read_moved_or_it_read_none() -> None:
    body = kopf.Body({})
    logger = kopf.LocalObjectLogger(body=body, settings=kopf.OperatorSettings())
    workload = Workload("ns", "chat", body, logger)
    moved = Cycle(Snapshot(time=0.0), autoscalers={}, moved=frozenset({("ns", "chat-1")}))
    assert workload.urgent(moved)  # not decided yet
    workload.pods = (("ns", "chat-0"),)
    assert not workload.urgent(moved)
    workload.pods = (("ns", "chat-0"), ("ns", "chat-1"))
    assert workload.urgent(moved)


def test_a_workload_changed_when_a_pod_it_read_moved_or_its_spec_changed() -> None:
    raw: dict[str, Any] = {"metadata": {"generation": 3}}
    body = kopf.Body(raw)
    logger = kopf.LocalObjectLogger(body=body, settings=kopf.OperatorSettings())
    workload = Workload("ns", "chat", body, logger, pods=(("ns", "chat-0"),), generation=3)
    still = Cycle(Snapshot(time=0.0), autoscalers={}, moved=frozenset({("ns", "other-0")}))
    moved = Cycle(Snapshot(time=0.0), autoscalers={}, moved=frozenset({("ns", "chat-0")}))
    assert not workload.changed(still)
    assert workload.changed(moved)
    raw["metadata"]["generation"] = 4  # kopf keeps the body current from the watch
    assert workload.changed(still)


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


async def test_a_workload_keeps_no_cycle_while_its_status_is_written_or_it_waits() -> None:
    # a cycle's snapshot is megabytes at 5,000 workloads; decisions waiting for their status
    # writes, or for the next cycle, each kept the one they had decided on
    async def no_fetch() -> Cycle:
        raise AssertionError("cycles are published by the test")

    clock = CycleClock(no_fetch, period_seconds=3600)
    body = kopf.Body(
        {
            "metadata": {"generation": 1},
            "spec": {
                "targetRef": {"name": "chat"},
                "replicas": {"min": 1, "max": 2, "targetGPUUtilization": 70},
                "mode": "Off",
            },
        }
    )
    workload = Workload(
        "ns", "chat", body, kopf.LocalObjectLogger(body=body, settings=kopf.OperatorSettings())
    )
    deps = Dependencies(
        prometheus=None,  # type: ignore[arg-type]  # mode Off reads no metrics
        targets=None,  # type: ignore[arg-type]  # nor a target
        rightsizing=None,  # type: ignore[arg-type]
    )
    writer = FirstWriteWaits()
    decide = workload.decide
    decided_twice = asyncio.Event()
    outcomes: list[Outcome | None] = []

    async def counted(*args: Any) -> Outcome | None:
        outcomes.append(await decide(*args))
        if len(outcomes) == 2:
            decided_twice.set()
        return outcomes[-1]

    workload.decide = counted  # type: ignore[method-assign]
    stop: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    clock.publish(Cycle(Snapshot(time=1.0), autoscalers={}))
    following = asyncio.create_task(
        workload.follow(clock, stop, ClusterView({}, {}), deps, writer)  # type: ignore[arg-type]
    )
    await asyncio.wait_for(writer.writing.wait(), timeout=10)
    first = weakref.ref(clock._latest)  # type: ignore[arg-type]
    clock.publish(Cycle(Snapshot(time=2.0), autoscalers={}))
    gc.collect()
    assert first() is None, "kept while its status was written"

    writer.release.set()
    # the second decision, on cycle 2; it waits for cycle 3 by the time this resumes
    await asyncio.wait_for(decided_twice.wait(), timeout=10)
    second = weakref.ref(clock._latest)  # type: ignore[arg-type]
    clock.publish(Cycle(Snapshot(time=3.0), autoscalers={}))
    gc.collect()
    assert second() is None, "kept while waiting for the next cycle"

    stop.set_result(None)
    await asyncio.wait_for(following, timeout=10)
    ready = next(c for c in writer.patches[0]["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "ModeOff"  # it did decide, and wrote what it decided


def test_workloads_are_driven_by_the_cycle_clock_not_by_timers() -> None:
    registry = registered(sync_period_seconds=7)
    spawned = registry._spawning.get_all_handlers()
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


def test_dropping_managed_fields_keeps_everything_else() -> None:
    event: dict[str, Any] = {"type": "MODIFIED", "object": workload_body("7", "f")}
    expected = copy.deepcopy(event)
    del expected["object"]["metadata"]["managedFields"]
    drop_managed_fields(event)
    assert event == expected


@pytest.mark.parametrize(
    "event",
    [{}, {"object": None}, {"object": "text"}, {"object": {"metadata": ["x"]}}, {"object": {}}],
)
def test_dropping_managed_fields_of_a_malformed_event_changes_nothing(
    event: dict[str, Any],
) -> None:
    before = copy.deepcopy(event)
    drop_managed_fields(event)
    assert event == before


def test_kopf_keeps_no_managed_fields_for_a_workloads_daemon() -> None:
    """kopf keeps each WorkloadSizing's latest body while its daemon runs: the event handler
    must strip the very dict kopf keeps, at creation and at every later change. Driven
    through kopf's own event processing, so a kopf that copied the body would fail here."""
    registry = kopf.OperatorRegistry()
    for handler in registered()._watching.get_all_handlers():
        registry._watching.append(handler)

    @kopf.daemon(GROUP, VERSION, PLURAL, registry=registry)
    async def holds_the_body(stopped: kopf.DaemonStopped, **_: Any) -> None:
        await stopped.wait()

    async def kept_after(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        settings = kopf.OperatorSettings()
        memories = inventory.ResourceMemories()
        kept = []
        for raw in events:
            await processing.process_resource_event(
                lifecycle=kopf.lifecycles.all_at_once,
                indexers=indexing.OperatorIndexers(),
                registry=registry,
                settings=settings,
                memories=memories,
                memobase=ephemera.Memo(),
                resource=references.Resource(GROUP, VERSION, PLURAL, namespaced=True),
                raw_event=raw,  # type: ignore[arg-type]  # a RawEvent is this dict
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

    finalizer = kopf.OperatorSettings().persistence.finalizer  # kopf spawns only once it is on
    created, changed = asyncio.run(
        kept_after(
            [
                {"type": "ADDED", "object": workload_body("1", finalizer)},
                {"type": "MODIFIED", "object": workload_body("2", finalizer)},
            ]
        )
    )
    assert "managedFields" not in created and "managedFields" not in changed
    assert changed["resourceVersion"] == "2"  # the body kept is the latest one
    assert changed["annotations"] == {"gpusizer.io/paused": "false"}


def test_a_request_to_a_silent_api_server_gives_up() -> None:
    """The client waits forever by default: a request the API server never answers (cut off
    by a restart or a partition) must end, with an error the caller reports."""
    silent = socket.create_server(("127.0.0.1", 0))  # connects, never answers
    configuration = k8s.Configuration(host=f"http://127.0.0.1:{silent.getsockname()[1]}")
    configuration.retries = False  # one attempt: the operator's client retries reads thrice
    client = k8s.ApiClient(configuration)
    instrument(client, timeout_seconds=0.2)
    outcome: list[BaseException] = []

    def request() -> None:
        try:
            k8s.CoreV1Api(client).list_namespace()
        except BaseException as exc:  # whatever ends it is the outcome
            outcome.append(exc)

    caller = threading.Thread(target=request, daemon=True)
    caller.start()
    caller.join(timeout=30)
    silent.close()  # resets the connection: a caller still waiting ends now
    assert not caller.is_alive() and outcome, "the request still waited after 30 s"
    assert isinstance(outcome[0], urllib3.exceptions.ReadTimeoutError), outcome
