"""What `gpusizer run` registers with kopf."""

from __future__ import annotations

import asyncio
import copy
import gc
import inspect
import json
import sys
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import kopf
import pytest
from gpusizer.api.v1alpha1 import GROUP, PLURAL, VERSION
from gpusizer.clock import Cycle, CycleClock
from gpusizer.cluster import ClusterView
from gpusizer.handlers import register
from gpusizer.memory import Memory
from gpusizer.report.turn import Outcome
from gpusizer.settings import OperatorSettings, PrometheusSettings
from gpusizer.signals.health import PrometheusHealth
from gpusizer.signals.pods import WHOLE_GPU_RESOURCE
from gpusizer.signals.snapshot import Snapshot
from gpusizer.startup import Runtime, exit_watchdog
from gpusizer.workload import Turns, Workload
from kopf._cogs.structs import bodies, ephemera, finalizers, references
from kopf._core.actions import application
from kopf._core.engines import indexing, posting
from kopf._core.intents.handlers import TimerHandler
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


@pytest.mark.parametrize(("sync", "quiet_every"), [(5, 4), (15, 4), (30, 2), (60, 1), (90, 1)])
def test_a_quiet_workload_waits_four_sync_periods_within_a_minute(
    sync: float, quiet_every: int
) -> None:
    settings = OperatorSettings(PrometheusSettings(url="http://p"), sync_period_seconds=sync)
    assert settings.quiet_every == quiet_every


def test_workloads_take_their_turns_in_the_fleet_not_in_kopf_daemons_or_timers() -> None:
    """A daemon per workload kept a task, futures and their contexts for each: about half
    the heap at 5,000 workloads (bench/README.md, "the heap at 5,000, owner by owner")."""
    registry = registered(sync_period_seconds=7)
    spawned = [h for h in registry._spawning.get_all_handlers() if h.selector.any_name == PLURAL]
    assert spawned == []
    watched = [h for h in registry._watching.get_all_handlers() if h.selector.any_name == PLURAL]
    assert [h.id.rsplit(".", 1)[-1] for h in watched] == ["workload_event"]


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
            "finalizers": [finalizer] if finalizer else [],
            "annotations": {"gpusizer.io/paused": "false"},
            "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {"f:mode": {}}}}],
        },
        "spec": {"targetRef": {"kind": "Deployment", "name": "chat"}},
        "status": {"desiredReplicas": 2},
    }


def raw_event(kind: bodies.RawEventType, body: dict[str, Any]) -> bodies.RawEvent:
    """A watch event as kopf's stream hands it over: the body itself, not a copy."""
    return {"type": kind, "object": cast(bodies.RawBody, body)}


def runtime(list_workloads: Callable[[Iterable[str]], set[str]] | None = None) -> Runtime:
    return Runtime(
        services(FakeMetrics(), FakeTargets()),
        Memory(),
        FakeStatus(),
        CycleClock(never_fetched, period_seconds=3600),
        ThreadPoolExecutor(max_workers=1),
        list_workloads=list_workloads,
    )


WORKLOAD_SIZINGS = references.Resource(GROUP, VERSION, PLURAL, namespaced=True)
PODS = references.Resource("", "v1", "pods", namespaced=True)


class Kopf:
    """Events through kopf's own processing, with the handlers `gpusizer run` registers and
    the runtime in its memo; the patches kopf would apply, recorded."""

    def __init__(
        self, monkeypatch: pytest.MonkeyPatch, in_memo: Runtime, partitioning: bool = False
    ) -> None:
        self.registry = registered(partitioning=partitioning)
        self.runtime = in_memo
        self.patches: list[Any] = []
        self.memobase = ephemera.Memo()
        self.memobase.runtime = in_memo
        self.indexers = indexing.OperatorIndexers()
        self.indexers.ensure(self.registry._indexing.get_all_handlers())
        self.memories = inventory.ResourceMemories()
        self.settings = kopf.OperatorSettings()
        self.posted: asyncio.Queue[posting.K8sEvent] = asyncio.Queue()

        async def recorded(*, patch: Any, **_: Any) -> tuple[bool, str | None, None]:
            if patch:
                self.patches.append(patch)
            return True, None, None

        monkeypatch.setattr(application, "apply", recorded)

    async def event(
        self,
        kind: bodies.RawEventType,
        body: dict[str, Any],
        resource: references.Resource = WORKLOAD_SIZINGS,
    ) -> None:
        await processing.process_resource_event(
            lifecycle=kopf.lifecycles.all_at_once,
            indexers=self.indexers,
            registry=self.registry,
            settings=self.settings,
            memories=self.memories,
            memobase=self.memobase,
            resource=resource,
            raw_event=raw_event(kind, body),
            event_queue=self.posted,
        )


FINALIZER = kopf.OperatorSettings().persistence.finalizer  # put on by earlier versions


async def test_the_body_a_workload_keeps_has_no_managed_fields(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The fleet keeps each WorkloadSizing's latest body: the event handler must strip the
    very dict kept, at creation and at every later change."""
    kopf_ = Kopf(monkeypatch, runtime())
    kept = []
    for kind, version in (("ADDED", "1"), ("MODIFIED", "2")):
        await kopf_.event(kind, workload_body(version, FINALIZER))
        workload = kopf_.runtime.fleet.get(("ns", "chat"))
        assert workload is not None
        kept.append(copy.deepcopy(workload.body["metadata"]))
    created, changed = kept
    assert "managedFields" not in created and "managedFields" not in changed
    assert changed["resourceVersion"] == "2"  # the body kept is the latest one
    assert changed["annotations"] == {"gpusizer.io/paused": "false"}


async def test_the_body_a_workload_lets_go_of_is_freed_without_a_collection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A body kept from one event to the next outlives the young collections. Kept as kopf's
    Body (a cycle with its views), it waited for a full collection once let go: at 10,000
    workloads hundreds of MiB did (bench/README.md, "Issue 29: what the bursts leave
    resident")."""
    kopf_ = Kopf(monkeypatch, runtime())
    await kopf_.event("ADDED", workload_body("1", FINALIZER))
    workload = kopf_.runtime.fleet.get(("ns", "chat"))
    assert workload is not None
    kept = workload.body
    gc.disable()
    try:
        await kopf_.event("MODIFIED", workload_body("2", FINALIZER))
        kopf_.patches.clear()  # each holds kopf's Body of its event, as kopf does until applied
        assert workload.body is not kept and workload.body["metadata"]["resourceVersion"] == "2"
        assert sys.getrefcount(kept) == 2, "nothing but this test (and the call) holds it"
    finally:
        gc.enable()


async def test_workloads_keep_their_bodies_with_shared_strings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each event is decoded apart, with its own copy of every key: shared, a kept
    WorkloadSizing took about half the memory (gpusizer.compact)."""
    kopf_ = Kopf(monkeypatch, runtime())
    for name in ("chat", "embed"):
        body = workload_body("1", "")
        body["metadata"].update(name=name, uid=name)
        await kopf_.event("ADDED", json.loads(json.dumps(body)))
    chat, embed = (kopf_.runtime.fleet.get(("ns", name)) for name in ("chat", "embed"))
    assert chat is not None and embed is not None
    assert next(iter(chat.body["status"])) is next(iter(embed.body["status"]))
    assert chat.body["spec"]["targetRef"]["kind"] is embed.body["spec"]["targetRef"]["kind"]


async def test_the_pod_indexes_keep_one_pod_info_a_pod(monkeypatch: pytest.MonkeyPatch) -> None:
    """kopf calls each pod index with one event's body in turn; each kept a PodInfo of its
    own, with its own copies of the pod's strings (kube.IndexedPods)."""
    kopf_ = Kopf(monkeypatch, runtime(), partitioning=True)
    for version, phase in (("1", "Pending"), ("2", "Running")):
        pod = {
            "metadata": {
                "name": "chat-1",
                "namespace": "ns",
                "uid": "p1",
                "resourceVersion": version,
                "labels": {"app": "chat"},
            },
            "spec": {
                "containers": [{"name": "vllm", "resources": {"limits": {WHOLE_GPU_RESOURCE: "1"}}}]
            },
            "status": {"phase": phase},
        }
        await kopf_.event("MODIFIED", json.loads(json.dumps(pod)), PODS)
        indices = kopf_.indexers.indices
        (by_namespace,) = indices["pods_by_namespace"]["ns"]
        (by_label,) = indices["pods_by_label"][("ns", "app", "chat")]
        (gpu,) = indices["gpu_pods"]["ns/chat-1"]
        assert by_namespace.phase == phase and by_label is by_namespace
        if version == "1":  # kopf keeps a value equal to the one before (a GpuPod has no phase)
            assert gpu.name is by_namespace.name and gpu.uid is by_namespace.uid


def test_each_gpu_partitioning_takes_a_turn_every_sync_period() -> None:
    spawned = registered(sync_period_seconds=7)._spawning.get_all_handlers()
    timers = [h for h in spawned if isinstance(h, TimerHandler)]
    assert [(t.id, t.selector.any_name, t.interval) for t in timers] == [
        ("partition", "gpupartitionings", 7)
    ]


def test_gpu_partitioning_is_not_served_when_only_some_namespaces_are_watched() -> None:
    spawned = registered(partitioning=False)._spawning.get_all_handlers()
    assert spawned == []


async def test_an_event_of_a_workload_has_the_next_read_ask_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A waiting workload is asked whether its spec changed only after an event of its
    object (Fleet.touch): asking every one at every read cost more than the read."""
    kopf_ = Kopf(monkeypatch, runtime())
    await kopf_.event("ADDED", workload_body("1", FINALIZER))
    assert kopf_.runtime.fleet._touched == set(), "a newcomer takes its first turn anyway"
    await kopf_.event("MODIFIED", workload_body("2", FINALIZER))
    assert kopf_.runtime.fleet._touched == {("ns", "chat")}


DEPLOYMENTS = references.Resource("apps", "v1", "deployments", namespaced=True)


async def test_an_event_of_a_pod_or_a_target_tells_the_fleet(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A quiet workload that read the pod or scales the target waits no more (fleet.py)."""
    memo = runtime()
    pods: list[tuple[str, str]] = []
    targets: list[tuple[str, str, str]] = []
    monkeypatch.setattr(memo.fleet, "touch_pod", pods.append)
    monkeypatch.setattr(memo.fleet, "touch_target", targets.append)
    kopf_ = Kopf(monkeypatch, memo)
    pod = {
        "metadata": {"name": "chat-1", "namespace": "ns", "uid": "p1", "resourceVersion": "1"},
        "status": {"phase": "Running"},
    }
    await kopf_.event("MODIFIED", pod, PODS)
    deployment = {
        "kind": "Deployment",
        "metadata": {"name": "chat", "namespace": "ns", "uid": "d1", "resourceVersion": "1"},
        "spec": {"replicas": 2},
    }
    await kopf_.event("MODIFIED", deployment, DEPLOYMENTS)
    assert (pods, targets) == ([("ns", "chat-1")], [("ns", "Deployment", "chat")])


async def test_an_activator_record_that_changed_asks_for_a_turn_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    memo = runtime()
    nudged: list[tuple[str, str]] = []
    monkeypatch.setattr(memo.fleet, "nudge", nudged.append)
    kopf_ = Kopf(monkeypatch, memo)
    held = workload_body("1", FINALIZER)
    held["metadata"]["annotations"]["activator.gpusizer.io/a-1"] = '{"pending": 1}'
    await kopf_.event("ADDED", held)  # its first turn reads the record
    await kopf_.event("MODIFIED", copy.deepcopy(held))  # the same record: no news
    assert nudged == []
    await kopf_.event("MODIFIED", workload_body("3", FINALIZER))  # the record gone
    assert nudged == [("ns", "chat")]


class PostingTurns(Turns):
    async def decide(self, workload: Workload, cycle: Cycle) -> Outcome | None:
        kopf.event(
            kopf.Body(cast(bodies.RawBody, workload.body)),
            type="Normal",
            reason="Posted",
            message="from a turn",
        )
        return None


async def test_turns_post_events_through_the_queue_kopf_gives_its_handlers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """kopf sets its event queue for its handlers only: a turn started anywhere else failed
    to post any Event."""
    memo = runtime()
    memo.turns = PostingTurns(ClusterView({}, {}), memo.services, memo.memory, FakeStatus())
    kopf_ = Kopf(monkeypatch, memo)
    posting.settings_var.set(kopf_.settings)  # kopf sets it before any of its tasks starts
    await kopf_.event("ADDED", workload_body("1", ""))
    memo.clock.publish(Cycle(Snapshot(time=1.0), autoscalers={}))
    try:
        event = await asyncio.wait_for(kopf_.posted.get(), timeout=10)
    finally:
        for task in memo.tasks:
            task.cancel()
    assert (event.reason, event.ref["name"]) == ("Posted", "chat")


async def test_a_workload_carries_no_finalizer_and_its_deletion_ends_its_turns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """kopf would put a finalizer on the object (or keep an old one) if any handler asked
    for one; none does, and the DELETED event takes it out of the fleet."""
    kopf_ = Kopf(monkeypatch, runtime())
    await kopf_.event(None, workload_body("1", finalizer=""))
    assert kopf_.runtime.fleet.get(("ns", "chat")) is not None
    assert kopf_.patches == [], "kopf added a finalizer"

    old = workload_body("2", finalizer=kopf_.settings.persistence.finalizer)
    await kopf_.event("MODIFIED", old)  # an object from an operator that put one on
    assert [fn.func for fn in kopf_.patches[-1].fns] == [finalizers.allow_deletion], "kept it"

    await kopf_.event("DELETED", old)
    assert kopf_.runtime.fleet.get(("ns", "chat")) is None
    assert kopf_.runtime.fleet._clock.listeners == 0


async def test_the_deletion_of_an_old_object_leaves_the_one_created_again_under_its_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kopf_ = Kopf(monkeypatch, runtime())
    await kopf_.event(None, workload_body("1", ""))
    again = workload_body("3", "")
    again["metadata"]["uid"] = "u2"  # deleted and created again while a watch was down
    await kopf_.event(None, again)
    await kopf_.event("DELETED", workload_body("2", ""))  # the old one's late event
    workload = kopf_.runtime.fleet.get(("ns", "chat"))
    assert workload is not None and workload.uid == "u2"


async def test_a_replica_taking_over_drops_those_deleted_while_it_was_paused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """kopf lists again when it resumes a paused replica's watches, and never says what the
    new list lacks: such a workload would write its target before finding itself gone."""
    listed: list[list[str]] = []

    def list_workloads(namespaces: Iterable[str]) -> set[str]:
        listed.append(list(namespaces))
        return {"u1"}

    memo = runtime(list_workloads)
    settings = kopf.OperatorSettings()
    for name, uid in (("kept", "u1"), ("deleted", "u2")):
        body = kopf.Body({"metadata": {"name": name, "namespace": "ns", "uid": uid}})
        memo.saw("ns", name, body, kopf.LocalObjectLogger(body=body, settings=settings))
    nudged: list[tuple[str, str]] = []
    monkeypatch.setattr(memo.fleet, "nudge", nudged.append)
    memo.took_over(PrometheusHealth(), None)
    assert memo.fleet.held, "no turn starts before the list says who exists"
    assert memo.confirming is not None
    await asyncio.wait_for(memo.confirming, timeout=10)
    assert listed == [["ns"]]
    assert [w.name for w in memo.fleet] == ["kept"]
    assert not memo.fleet.held and nudged == [("ns", "kept")]


async def test_a_replica_taking_over_whose_list_fails_says_so_and_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def refused(namespaces: Iterable[str]) -> set[str]:
        raise ConnectionRefusedError("connection refused")

    memo = runtime(refused)
    body = kopf.Body({"metadata": {"name": "w", "namespace": "ns", "uid": "u1"}})
    memo.saw("ns", "w", body, kopf.LocalObjectLogger(body=body, settings=kopf.OperatorSettings()))
    memo.took_over(PrometheusHealth(), None)
    assert memo.confirming is not None
    await asyncio.wait_for(memo.confirming, timeout=10)
    assert not memo.fleet.held and len(memo.fleet) == 1
    assert "listing WorkloadSizings on taking over failed: connection refused" in caplog.text


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
        indexes = {
            name: {}
            for name in (
                "pods_by_namespace",
                "pods_by_label",
                "deployments",
                "statefulsets",
                "activator_ports",
                "gpu_nodes",
            )
        }
        asyncio.run(configure.fn(settings=settings, memo=memo, **indexes))
    assert started, "configure built the runtime"
    backoffs = settings.networking.error_backoffs
    assert sum(backoffs if isinstance(backoffs, Iterable) else [backoffs]) >= 300


def test_a_stopped_operator_that_hangs_exits_anyway() -> None:
    exited: list[int] = []
    timer = exit_watchdog(0.05, exited.append)
    timer.join(timeout=5)
    assert exited == [1]
