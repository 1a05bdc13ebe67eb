"""kopf's indexing gate, made to wake its waiters only when it opens or closes.

kopf (1.45.2) holds every object's first event until every index has seen every object listed
at start: one toggle per listed object of an indexed kind, in one `ToggleSet`, and every worker
waits on that set's condition (`_core/reactor/processing.py`). Each toggle made or dropped wakes
every waiting worker, though the set stays closed until the last one goes, so a start on a
listed fleet costs the square of the objects. An operator restarted on 10,000 WorkloadSizings
decided nothing for 23 minutes (bench/README.md, "an operator restarted on 10,000").

A waiter is woken to test whether the set is on, and the answer changes only when a toggle
added or dropped changes it: waking them only then changes no outcome.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from kopf._cogs.aiokits import aiotoggles

log = logging.getLogger(__name__)

# What the replacements read and write of kopf's ToggleSet; checked before it is patched.
_TOGGLE_SET_PARTS = ("_condition", "_toggles", "_fn", "is_on")


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
