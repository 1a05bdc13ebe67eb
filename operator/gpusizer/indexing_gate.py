"""kopf's indexing gate, made to wake its waiters only when it opens or closes.

kopf (1.45.2) holds every object's first event until every index has seen every object listed
at start: one toggle per listed object of an indexed kind, in one `ToggleSet`, and every worker
waits on that set's condition (`_core/reactor/processing.py`). Each toggle made or dropped wakes
every waiting worker, though the set stays closed until the last one goes, so a start on a
listed fleet costs the square of the objects. An operator restarted on 10,000 WorkloadSizings
decided nothing for 23 minutes (bench/README.md, "an operator restarted on 10,000").

A waiter is woken to test whether the set is on, and the answer changes only when a toggle
added or dropped changes it: waking them only then changes no outcome.

Every worker waits at the gate, though a kind with nothing but indexes (pods, Deployments,
nodes) has nothing to run once it opens: each held its object's whole body until then, and a
restart on a listed fleet held every pod and Deployment at once. Such a kind's workers now drop
their toggle and pass; and every object loses its managedFields (about 40 % of a body here)
before it is indexed, so what waits is the smaller.

kopf wraps each event's body in a `Body` and a `Patch` whose views point back at them: cycles,
which only a full collection frees, and they hold the whole body. A restart on a listed fleet
left every listed body to them, and the long-lived objects made meanwhile kept the memory they
had held (bench/README.md, "the bodies kopf's cycles hold"). So once kopf has processed an event
of a kind with no daemon, timer or change handler (nothing of kopf's reads that body later), its
body is emptied: a handler that keeps part of a body past its return keeps a copy or a raw
sub-dict (as every handler here does), not kopf's views of it.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Iterable
from typing import Any, cast

from kopf._cogs.aiokits import aiotoggles
from kopf._cogs.structs import bodies, references
from kopf._core.intents import registries
from kopf._core.reactor import processing

from gpusizer.kube import drop_managed_fields

log = logging.getLogger(__name__)

# What the replacements read and write of kopf's ToggleSet; checked before it is patched.
_TOGGLE_SET_PARTS = ("_condition", "_toggles", "_fn", "is_on")
# What the wrapper of kopf's processor reads: its arguments, and the registries of the handlers
# that run after the gate (on.event, daemons and timers, on.create/update/delete/resume/field).
_PROCESSOR_ARGUMENTS = ("registry", "resource", "raw_event", "operator_indexed")
_REGISTRY_PARTS = ("_watching", "_spawning", "_changing")
# The registries of the handlers kopf gives an earlier event's body: daemons and timers (the
# latest body it keeps for them), and change handlers (retried with the patch left over).
_READ_THE_BODY_LATER = ("_spawning", "_changing")
_kopf_process_resource_event = processing.process_resource_event


async def _make_toggle(
    self: aiotoggles.ToggleSet,
    __val: bool = False,
    *,
    name: str | None = None,
) -> aiotoggles.Toggle:
    toggle = aiotoggles.Toggle(__val, name=name, condition=self._condition)
    async with self._condition:
        was_on = self.is_on()
        self._toggles.add(toggle)
        if self.is_on() != was_on:
            self._condition.notify_all()
    return toggle


async def _drop_toggle(self: aiotoggles.ToggleSet, toggle: aiotoggles.Toggle) -> None:
    await _drop_toggles(self, (toggle,))


async def _drop_toggles(self: aiotoggles.ToggleSet, toggles: Iterable[aiotoggles.Toggle]) -> None:
    async with self._condition:
        was_on = self.is_on()
        self._toggles.difference_update(toggles)
        if self.is_on() != was_on:
            self._condition.notify_all()


def wake_only_on_change() -> bool:
    """Patches kopf's ToggleSet, once, before the operator starts; False (logged) when this
    kopf's ToggleSet is not the one the patch was written for, and it is left as it is."""
    toggle_set = aiotoggles.ToggleSet
    if toggle_set.make_toggle is _make_toggle:
        return True
    probe = toggle_set(all)
    missing = [part for part in _TOGGLE_SET_PARTS if not hasattr(probe, part)]
    if missing:
        log.warning(
            "kopf's ToggleSet has no %s: its indexing gate is left as it is, and a start on "
            "thousands of listed objects may take minutes",
            ", ".join(missing),
        )
        return False
    toggle_set.make_toggle = _make_toggle  # type: ignore[method-assign]
    toggle_set.drop_toggle = _drop_toggle  # type: ignore[method-assign]
    toggle_set.drop_toggles = _drop_toggles  # type: ignore[method-assign]
    return True


class _PassingGate:
    """The gate as a worker of a kind with nothing but indexes sees it: its toggle drops as
    kopf drops it, and it does not wait, for nothing of its kind runs after the gate."""

    def __init__(self, gate: aiotoggles.ToggleSet) -> None:
        self._gate = gate

    async def drop_toggle(self, toggle: aiotoggles.Toggle) -> None:
        await self._gate.drop_toggle(toggle)

    async def wait_for(self, state: bool) -> None:
        return None


def _has_handlers(
    registry: registries.OperatorRegistry, resource: references.Resource, parts: Iterable[str]
) -> bool:
    return any(getattr(registry, part).has_handlers(resource=resource) for part in parts)


def runs_after_the_gate(
    registry: registries.OperatorRegistry, resource: references.Resource
) -> bool:
    return _has_handlers(registry, resource, _REGISTRY_PARTS)


def reads_the_body_later(
    registry: registries.OperatorRegistry, resource: references.Resource
) -> bool:
    return _has_handlers(registry, resource, _READ_THE_BODY_LATER)


async def _process_resource_event(
    *,
    registry: registries.OperatorRegistry,
    resource: references.Resource,
    raw_event: bodies.RawEvent,
    operator_indexed: aiotoggles.ToggleSet | None = None,
    **kwargs: Any,
) -> str | None:
    drop_managed_fields(raw_event)
    if operator_indexed is not None and not runs_after_the_gate(registry, resource):
        operator_indexed = cast(aiotoggles.ToggleSet, _PassingGate(operator_indexed))
    version = await _kopf_process_resource_event(
        registry=registry,
        resource=resource,
        raw_event=raw_event,
        operator_indexed=operator_indexed,
        **kwargs,
    )
    if not reads_the_body_later(registry, resource):
        cast(dict[str, Any], raw_event["object"]).clear()  # freed now, not at a full collection
    return version


def index_only_kinds_pass() -> bool:
    """Wraps kopf's event processor, once, before the operator starts (kopf binds it when its
    tasks spawn); False (logged) when this kopf's processor or registry is not the one the
    wrapper was written for, and it is left as it is."""
    if processing.process_resource_event is _process_resource_event:
        return True
    parameters = inspect.signature(_kopf_process_resource_event).parameters
    missing = [name for name in _PROCESSOR_ARGUMENTS if name not in parameters]
    registry = registries.OperatorRegistry()
    missing += [part for part in _REGISTRY_PARTS if not hasattr(registry, part)]
    if missing:
        log.warning(
            "kopf's event processor or registry has no %s: every kind waits at its indexing "
            "gate, and a restart on thousands of listed pods holds them all in memory",
            ", ".join(missing),
        )
        return False
    # kopf passes every argument by its name (running.py, queueing.py)
    processing.process_resource_event = _process_resource_event  # type: ignore[assignment]
    return True
