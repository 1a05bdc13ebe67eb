"""kopf's indexing gate, patched (gpusizer.indexing_gate): it wakes its waiters when it opens
or closes, and only then; a kind with nothing but indexes does not wait at it."""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import weakref
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import kopf
import pytest
from gpusizer import indexing_gate, main
from gpusizer.settings import OperatorSettings, PrometheusSettings

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from kopf._cogs.aiokits import aiotoggles
from kopf._cogs.structs import ephemera, references
from kopf._core.actions import application
from kopf._core.engines import indexing
from kopf._core.intents import registries
from kopf._core.reactor import inventory, processing
from kopf_gate import listed  # a start as kopf's

from tests.fakes import steps_taken

KOPF_METHODS = ("make_toggle", "drop_toggle", "drop_toggles")


@pytest.fixture
def kopfs(monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    """kopf's methods, as they are before the test and come back after it."""
    methods = {name: getattr(aiotoggles.ToggleSet, name) for name in KOPF_METHODS}
    for name, method in methods.items():
        monkeypatch.setattr(aiotoggles.ToggleSet, name, method)
    return methods


@pytest.fixture
def patched(kopfs: dict[str, object]) -> None:
    assert indexing_gate.wake_only_on_change()


class StateTests:
    """How many times the set's state was tested: once per waiter woken, and per change."""

    def __init__(self) -> None:
        self.count = 0

    def all_on(self, states: Iterable[bool]) -> bool:
        self.count += 1
        return all(states)


@pytest.mark.usefixtures("patched")
async def test_a_start_on_listed_objects_wakes_each_waiter_once() -> None:
    tests = StateTests()
    indexed = aiotoggles.ToggleSet(tests.all_on)
    blocker = await indexed.make_toggle(name="orchestration blocker")
    workers = await listed(indexed, 300)
    await indexed.drop_toggle(blocker)
    await asyncio.wait_for(asyncio.gather(*workers), 10)
    # per object: two tests as its toggle is made, two as it is dropped, one as its worker
    # begins to wait and one when the set opens; kopf's own wakes every waiter at every toggle
    assert tests.count <= 6 * 300 + 3


async def waiting_on(toggles: aiotoggles.ToggleSet, waiters: int) -> None:
    """Returns once `waiters` tasks wait on the set's condition (a state, not a duration)."""

    async def counted() -> None:
        while len(toggles._condition._waiters or ()) < waiters:
            await steps_taken()

    await asyncio.wait_for(counted(), 10)


@pytest.mark.usefixtures("patched")
async def test_no_worker_passes_while_one_toggle_stays() -> None:
    indexed = aiotoggles.ToggleSet(all)
    blocker = await indexed.make_toggle(name="orchestration blocker")
    workers = await listed(indexed, 20)
    await waiting_on(indexed, 20)
    assert not any(worker.done() for worker in workers)
    await indexed.drop_toggles([blocker])
    await asyncio.wait_for(asyncio.gather(*workers), 10)


@pytest.mark.usefixtures("patched")
async def test_a_toggle_made_on_an_open_set_wakes_who_waits_for_it_closed() -> None:
    paused = aiotoggles.ToggleSet(any)
    waiting = asyncio.create_task(paused.wait_for(True))
    await waiting_on(paused, 1)
    conflict = await paused.make_toggle(True, name="a peer with a higher priority")
    await asyncio.wait_for(waiting, 10)
    released = asyncio.create_task(paused.wait_for(False))
    await waiting_on(paused, 1)
    assert not released.done()
    await paused.drop_toggle(conflict)
    await asyncio.wait_for(released, 10)


@pytest.mark.usefixtures("patched")
def test_patching_twice_keeps_the_patch() -> None:
    assert indexing_gate.wake_only_on_change()
    assert aiotoggles.ToggleSet.make_toggle is indexing_gate._make_toggle


def test_a_kopf_whose_toggle_set_differs_is_left_as_it_is(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    class OtherToggleSet:
        def __init__(self, fn: object) -> None:
            self._toggles: set[object] = set()

        async def make_toggle(self) -> None: ...

    monkeypatch.setattr(aiotoggles, "ToggleSet", OtherToggleSet)
    with caplog.at_level(logging.WARNING, logger="gpusizer.indexing_gate"):
        assert not indexing_gate.wake_only_on_change()
    assert "has no _condition, _fn, is_on" in caplog.text
    assert OtherToggleSet.make_toggle is not indexing_gate._make_toggle


def test_the_operator_patches_the_gate_before_kopf_runs(
    monkeypatch: pytest.MonkeyPatch, kopfs: dict[str, object]
) -> None:
    seen = []

    async def operator(**_: object) -> None:
        seen.append(aiotoggles.ToggleSet.make_toggle)

    monkeypatch.setattr(kopf, "operator", operator)
    monkeypatch.setattr(main.handlers, "register", lambda _: None)
    monkeypatch.setattr(processing, "process_resource_event", processing.process_resource_event)
    settings = OperatorSettings(prometheus=PrometheusSettings(url="http://prometheus:9090"))
    main.run_operator(settings, [], "127.0.0.1:0")
    assert seen == [indexing_gate._make_toggle]
    assert processing.process_resource_event is indexing_gate._process_resource_event


PODS = references.Resource(group="", version="v1", plural="pods", kind="Pod", namespaced=True)
SIZINGS = references.Resource(
    group="gpusizer.io",
    version="v1alpha1",
    plural="workloadsizings",
    kind="WorkloadSizing",
    namespaced=True,
)


class Kopf:
    """kopf's own event processor and registry, as kopf's running.py binds them, with one index
    on pods and an event handler on WorkloadSizings."""

    def __init__(self) -> None:
        self.registry = registries.OperatorRegistry()
        self.handled: list[str] = []
        self.indexed_metadata: list[dict[str, Any]] = []

        @kopf.index("", "v1", "pods", id="pod_names", registry=self.registry)
        async def pod_names(name: str, meta: kopf.Meta, **_: Any) -> dict[str, str]:
            self.indexed_metadata.append(dict(meta))
            return {name: name}

        @kopf.on.event("gpusizer.io", "v1alpha1", "workloadsizings", registry=self.registry)
        async def sizing_event(name: str, **_: Any) -> None:
            self.handled.append(name)

        self.indexers = indexing.OperatorIndexers()
        self.indexers.ensure(self.registry._indexing.get_all_handlers())
        self.memories = inventory.ResourceMemories()

    async def process(
        self,
        resource: references.Resource,
        name: str,
        gate: aiotoggles.ToggleSet,
        spec: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The object's body, as kopf left it."""
        toggle = await gate.make_toggle(name=name)
        managed = [{"manager": "kubelet", "fieldsV1": {"f:status": {}}}]
        body: dict[str, Any] = {
            "metadata": {"name": name, "namespace": "team", "uid": name, "managedFields": managed},
            "spec": spec or {},
        }
        await processing.process_resource_event(
            lifecycle=kopf.lifecycles.all_at_once,
            indexers=self.indexers,
            registry=self.registry,
            settings=kopf.OperatorSettings(),
            memories=self.memories,
            memobase=ephemera.AnyMemo(kopf.Memo()),
            resource=resource,
            raw_event={"type": None, "object": body},
            event_queue=asyncio.Queue(),
            resource_indexed=toggle,
            operator_indexed=gate,
            no_throttling=True,
        )
        return body

    async def held_at_the_gate(self, resource: references.Resource, name: str) -> list[str]:
        """Processes one object while another holds the gate closed, and asserts it waits there
        until the gate opens: what had been handled while it waited."""
        gate = aiotoggles.ToggleSet(all)
        blocker = await gate.make_toggle(name="another kind's listing")
        processed = asyncio.create_task(self.process(resource, name, gate))
        await waiting_on(gate, 1)
        assert not processed.done()
        handled_while_held = list(self.handled)
        await gate.drop_toggle(blocker)
        await asyncio.wait_for(processed, 10)
        return handled_while_held


@pytest.fixture
def passing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(processing, "process_resource_event", processing.process_resource_event)
    assert indexing_gate.index_only_kinds_pass()


@pytest.mark.usefixtures("patched", "passing")
async def test_a_pod_passes_a_closed_gate_once_indexed_and_drops_its_toggle() -> None:
    kopf_ = Kopf()
    gate = aiotoggles.ToggleSet(all)
    blocker = await gate.make_toggle(name="another kind's listing")
    await asyncio.wait_for(kopf_.process(PODS, "pod-a", gate), 10)
    assert {name: list(store) for name, store in kopf_.indexers.indices["pod_names"].items()} == {
        "pod-a": ["pod-a"]
    }
    assert list(gate._toggles) == [blocker]


@pytest.mark.usefixtures("patched", "passing")
async def test_an_object_is_indexed_without_its_managed_fields() -> None:
    kopf_ = Kopf()
    await asyncio.wait_for(kopf_.process(PODS, "pod-a", aiotoggles.ToggleSet(all)), 10)
    assert kopf_.indexed_metadata == [{"name": "pod-a", "namespace": "team", "uid": "pod-a"}]


@pytest.mark.usefixtures("patched", "passing")
async def test_a_kind_with_a_handler_still_waits_until_every_index_is_filled() -> None:
    kopf_ = Kopf()
    assert await kopf_.held_at_the_gate(SIZINGS, "sizing-a") == []
    assert kopf_.handled == ["sizing-a"]


class Marker:
    """Something a body holds whose freeing a test can see."""


@pytest.mark.usefixtures("patched", "passing")
@pytest.mark.parametrize("resource", [PODS, SIZINGS], ids=["index only", "event handler"])
async def test_a_processed_body_is_freed_without_a_collection(
    resource: references.Resource,
) -> None:
    kopf_ = Kopf()
    marker = Marker()
    held = weakref.ref(marker)
    gc.disable()  # kopf's Body and Patch of the event are cycles that hold the body
    try:
        gate = aiotoggles.ToggleSet(all)
        await asyncio.wait_for(kopf_.process(resource, "obj-a", gate, {"marker": marker}), 10)
        del marker
        assert held() is None
    finally:
        gc.enable()


@pytest.mark.usefixtures("patched", "passing")
async def test_a_kind_with_a_timer_keeps_its_body_for_the_timer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def nothing_patched(**_: Any) -> tuple[bool, None, None]:
        return True, None, None

    monkeypatch.setattr(application, "apply", nothing_patched)  # no API server here
    kopf_ = Kopf()

    @kopf.timer(
        "gpusizer.io", "v1alpha1", "workloadsizings", interval=3600, registry=kopf_.registry
    )
    async def hourly(**_: Any) -> None: ...

    before = asyncio.all_tasks()
    try:
        gate = aiotoggles.ToggleSet(all)
        body = await asyncio.wait_for(kopf_.process(SIZINGS, "obj-a", gate, {"size": 1}), 10)
        assert body["spec"] == {"size": 1}
        fresh = kopf_.memories._items["obj-a"].daemons_memory.live_fresh_body
        assert fresh is not None and fresh.spec == {"size": 1}
    finally:
        spawned = asyncio.all_tasks() - before
        for task in spawned:
            task.cancel()
        await asyncio.gather(*spawned, return_exceptions=True)


@pytest.mark.usefixtures("patched")
async def test_without_the_wrapper_a_pod_waits_at_the_gate() -> None:
    """The pod's test that passes a closed gate can fail: kopf's own processor holds a pod
    until the gate opens."""
    await Kopf().held_at_the_gate(PODS, "pod-a")


def test_a_kopf_whose_processor_differs_is_left_as_it_is(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def other_processor(*, raw_event: object, **_: object) -> None: ...

    monkeypatch.setattr(indexing_gate, "_kopf_process_resource_event", other_processor)
    monkeypatch.setattr(processing, "process_resource_event", other_processor)
    with caplog.at_level(logging.WARNING, logger="gpusizer.indexing_gate"):
        assert not indexing_gate.index_only_kinds_pass()
    assert "has no registry, resource, operator_indexed" in caplog.text
    assert processing.process_resource_event is other_processor
