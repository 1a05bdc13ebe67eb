"""A census of the operator's heap for `bench/scale.py --census FILE`: what the live objects
are, so a figure of RSS can be taken apart.

Python imports this module at start-up when its directory is on PYTHONPATH. With
GPUSIZER_HEAP_CENSUS set, SIGUSR2 writes the file it names: every object the collector tracks,
counted and sized by type, and the objects reachable from a few kinds of owner (kopf's
per-object memories, the operator's workloads, asyncio tasks...), each owner's reach excluding
what an earlier one reached. No allocation is traced: tracemalloc from the start kept the
operator from deciding 1,000 workloads within minutes. The walk holds the event loop for the
seconds it takes.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import json
import logging
import os
import signal
import sys
from collections.abc import Iterable
from pathlib import Path
from types import FrameType, FunctionType, MethodType, ModuleType
from typing import Any

TOP = 60
# owners, in the order their reach is counted: a later owner's reach leaves out what an
# earlier one reached
OWNERS = (
    "ResourceMemory",  # kopf: one per watched object (pods, nodes, Deployments, ...)
    "Workload",  # the operator: one per WorkloadSizing
    "Task",  # asyncio: kopf's daemons and workers, the operator's tasks
    "Index",  # kopf's indexes
    "WorkloadCollector",  # the per-workload series
    "Memory",  # the operator's remembered state
)


# not walked through: what every owner reaches (kopf copies the operator's memo, and with it
# the whole runtime, into every object's memory; a function reaches its module's globals)
SHARED = (ModuleType, type, FunctionType, MethodType, logging.Logger, asyncio.AbstractEventLoop)
SHARED_NAMES = {"Memo", "AnyMemo", "Runtime", "OperatorSettings", "OperatorRegistry"}


def deep_size(roots: Iterable[object], seen: set[int]) -> tuple[int, int]:
    """Bytes and objects reachable from `roots` not in `seen` (which grows), not through
    SHARED objects."""
    size = count = 0
    stack = list(roots)
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, SHARED) or type(obj).__qualname__ in SHARED_NAMES:
            continue
        seen.add(id(obj))
        size += sys.getsizeof(obj)
        count += 1
        stack.extend(gc.get_referents(obj))
    return size, count


def census() -> dict[str, Any]:
    gc.collect()
    objects = gc.get_objects()
    by_type: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    roots: dict[str, list[object]] = {owner: [] for owner in OWNERS}
    for obj in objects:
        name = type(obj).__qualname__
        entry = by_type[name]
        entry[0] += 1
        entry[1] += sys.getsizeof(obj)
        if name in roots:
            roots[name].append(obj)
    seen: set[int] = set()
    reach = {}
    for owner, owned in roots.items():
        size, count = deep_size(owned, seen)
        reach[owner] = {"instances": len(owned), "mib": round(size / 2**20, 1), "objects": count}
    rest, rest_count = deep_size(objects, seen)
    reach["everything else tracked"] = {"mib": round(rest / 2**20, 1), "objects": rest_count}
    return {
        "reach": reach,
        "tracked_by_type": {
            name: {"count": count, "shallow_mib": round(size / 2**20, 2)}
            for name, (count, size) in sorted(by_type.items(), key=lambda kv: -kv[1][1])[:TOP]
        },
    }


def install(path: Path) -> None:
    def write(signum: int, frame: FrameType | None) -> None:
        partial = path.with_name(path.name + ".partial")
        partial.write_text(json.dumps(census(), indent=1) + "\n")
        partial.rename(path)  # whole, once it exists

    signal.signal(signal.SIGUSR2, write)


# the operator only, not every Python process started beside it with the same environment
if os.environ.get("GPUSIZER_HEAP_CENSUS") and Path(sys.argv[0]).name == "gpusizer":
    install(Path(os.environ["GPUSIZER_HEAP_CENSUS"]))
