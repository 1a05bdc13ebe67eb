"""kopf's indexing gate on a start with N listed objects, as kopf 1.45.2 runs it, with kopf's
own ToggleSet and with `gpusizer.indexing_gate`'s, side by side in one process.

What kopf does at start (`_core/reactor/orchestration.py`, `queueing.py`, `processing.py`):
a blocker toggle until every watcher started; then, for each listed object, a toggle made and
a worker spawned; each worker indexes its object, drops its toggle and waits until the set is
on. Here the workers index nothing, so the figure is the gate's own cost: the time until every
worker has passed it, and how many times a worker was woken to test it.

Usage: python bench/kopf_gate.py [--objects 1000,2000,4000,8000]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Iterable

from gpusizer import indexing_gate
from hostinfo import machine
from kopf._cogs.aiokits import aiotoggles

KOPF_METHODS = ("make_toggle", "drop_toggle", "drop_toggles")


async def listed(indexed: aiotoggles.ToggleSet, objects: int) -> list[asyncio.Task[None]]:
    """kopf's start on `objects` listed objects: for each, a toggle made and a worker spawned,
    the watch stream awaiting between objects; each worker drops its toggle and waits until
    the set is on."""

    async def worker(toggle: aiotoggles.Toggle) -> None:
        await asyncio.sleep(0)  # the worker starts later than it is spawned
        await indexed.drop_toggle(toggle)
        await indexed.wait_for(True)

    workers = []
    for number in range(objects):
        toggle = await indexed.make_toggle(name=f"object {number}")
        workers.append(asyncio.create_task(worker(toggle)))
        await asyncio.sleep(0)
    return workers


async def start(objects: int) -> tuple[float, int]:
    """Seconds until every worker passed the gate, and the tests of the set's state."""
    tests = 0

    def all_on(states: Iterable[bool]) -> bool:
        nonlocal tests
        tests += 1
        return all(states)

    indexed = aiotoggles.ToggleSet(all_on)
    started = time.perf_counter()
    blocker = await indexed.make_toggle(name="orchestration blocker")
    workers = await listed(indexed, objects)
    await indexed.drop_toggle(blocker)
    await asyncio.gather(*workers)
    return time.perf_counter() - started, tests


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--objects", default="1000,2000,4000,8000")
    args = p.parse_args()
    kopfs = {name: getattr(aiotoggles.ToggleSet, name) for name in KOPF_METHODS}
    print(machine())
    print("| objects | kopf's gate s | its tests | patched gate s | its tests |")
    print("|---|---|---|---|---|")
    for objects in [int(n) for n in args.objects.split(",")]:
        for name, method in kopfs.items():
            setattr(aiotoggles.ToggleSet, name, method)
        kopf_s, kopf_tests = asyncio.run(start(objects))
        assert indexing_gate.wake_only_on_change()
        patched_s, patched_tests = asyncio.run(start(objects))
        print(f"| {objects} | {kopf_s:.2f} | {kopf_tests} | {patched_s:.3f} | {patched_tests} |")


if __name__ == "__main__":
    main()
