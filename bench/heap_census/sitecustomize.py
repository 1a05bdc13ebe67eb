"""A census of the operator's heap for `bench/scale.py --census FILE`: what the live objects
are, so a figure of RSS can be taken apart.

Python imports this module at start-up when its directory is on PYTHONPATH. With
GPUSIZER_HEAP_CENSUS set, SIGUSR2 writes the file it names: every object the collector tracks,
counted and sized by type; the objects reachable from a few kinds of owner (kopf's indexes,
its per-object memories by kind of object, the operator's runtime, the WorkloadSizings'
daemons, asyncio tasks), each owner's reach excluding what an earlier one reached; which
types hold the sets and dicts; and, read before the walk, what pymalloc and glibc hold and use
before and after a full collection, with the types of the cyclic garbage it freed and the
shapes of its dicts and lists. No allocation is traced: tracemalloc from the start kept the
operator from deciding 1,000 workloads within minutes. The walk holds the event loop for the
seconds it takes.
"""

from __future__ import annotations

import asyncio
import collections
import ctypes
import gc
import json
import logging
import os
import re
import signal
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path
from types import FrameType, FunctionType, MethodType, ModuleType
from typing import Any

TOP = 60
# containers whose holders are counted: which objects hold the sets and dicts
HELD = (set, dict)

# not walked through: what every owner reaches (kopf copies the operator's memo, and with it
# the whole runtime, into every object's memory; a function reaches its module's globals)
SHARED = (ModuleType, type, FunctionType, MethodType, logging.Logger, asyncio.AbstractEventLoop)
SHARED_NAMES = {"Memo", "AnyMemo", "Runtime", "OperatorSettings", "OperatorRegistry"}


def deep_size(roots: Iterable[object], seen: set[int], fenced: set[int]) -> tuple[int, int]:
    """Bytes and objects reachable from `roots` not in `seen` (which grows), not through
    SHARED objects nor through `fenced` ones (every owner's roots: `roots` themselves are
    walked whatever the fence)."""
    size = count = 0
    stack = list(roots)
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, SHARED) or type(obj).__qualname__ in SHARED_NAMES:
            continue
        seen.add(id(obj))
        size += sys.getsizeof(obj)
        count += 1
        stack.extend(ref for ref in gc.get_referents(obj) if id(ref) not in fenced)
    return size, count


def owners(objects: list[object]) -> dict[str, list[object]]:
    """The roots to walk, each owner's walk fenced off from the others' roots: each kopf index
    by its handler id; kopf's per-object memories by the kind of object (a memory's uid looked
    up in the indexes: every pod, GPU Deployment and GPU node is in one; a WorkloadSizing's
    memory runs its daemon); each field of the operator's runtime, one level down; the
    WorkloadSizings' daemons with their tasks (what each turn's coroutine holds between
    turns); every other asyncio task. A future reaches the task that awaits it, and a daemon's
    coroutine reaches the clock and the memory: without the fences the first owner walked took
    them all."""
    by_name: dict[str, list[object]] = collections.defaultdict(list)
    for obj in objects:
        by_name[type(obj).__qualname__].append(obj)
    indexes: dict[str, object] = {}
    kind_of: dict[str, str] = {}
    for indexers in by_name["OperatorIndexers"]:
        for handler_id, indexer in indexers.items():
            indexes[f"index {handler_id}"] = indexer.index
            for key in indexer.index._Index__reverse:
                kind_of.setdefault(key[2], f"memories of {handler_id} objects")
    roots: dict[str, list[object]] = {name: [index] for name, index in indexes.items()}
    daemons: list[object] = []
    memories: dict[str, list[object]] = collections.defaultdict(list)
    for container in by_name["ResourceMemories"]:
        for uid, memory in container._items.items():
            running = memory.daemons_memory.running_daemons
            for daemon in running.values():
                daemons.extend((daemon, daemon.task))
            kind = "memories of WorkloadSizings" if running else kind_of.get(uid, "memories, other")
            memories[kind].append(memory)
    for kind in sorted(k for k in memories if "WorkloadSizings" not in k):
        roots[kind] = memories[kind]
    for runtime in by_name["Runtime"]:
        for name, value in vars(runtime).items():
            # one level down where there is one: the clock's latest cycle apart from its
            # sleepers, the memory's specs apart from its histories
            parts = vars(value).items() if hasattr(value, "__dict__") else [("", value)]
            for part, held in parts:
                roots.setdefault(f"runtime.{name}{'.' if part else ''}{part}", []).append(held)
    roots["daemons of WorkloadSizings"] = daemons
    roots["memories of WorkloadSizings"] = memories["memories of WorkloadSizings"]
    owned = {id(obj) for objs in roots.values() for obj in objs}
    roots["tasks, other"] = [task for task in by_name["Task"] if id(task) not in owned]
    return roots


def holders(objects: list[object]) -> dict[str, dict[str, Any]]:
    """Per HELD type, which types hold its instances (an instance's `__dict__` counted as the
    instance's type), with count and shallow size: where the sets and dicts come from."""
    owner_of_dict: dict[int, str] = {}
    for obj in objects:
        if not isinstance(obj, dict):
            for ref in gc.get_referents(obj):
                if type(ref) is dict:
                    owner_of_dict[id(ref)] = type(obj).__qualname__
    counted: dict[tuple[str, str], list[int]] = collections.defaultdict(lambda: [0, 0])
    done: set[int] = set()
    for obj in objects:
        holder = owner_of_dict.get(id(obj), "dict") if type(obj) is dict else type(obj).__qualname__
        for ref in gc.get_referents(obj):
            if type(ref) in HELD and id(ref) not in done:
                done.add(id(ref))
                entry = counted[(type(ref).__qualname__, holder)]
                entry[0] += 1
                entry[1] += sys.getsizeof(ref)
    result: dict[str, dict[str, Any]] = {}
    for (held, holder), (count, size) in sorted(counted.items(), key=lambda kv: -kv[1][1]):
        if len(result.setdefault(held, {})) < TOP // 3:
            result[held][holder] = {"count": count, "shallow_mib": round(size / 2**20, 2)}
    return result


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd",
            "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost",
        )
    ]  # fmt: skip


ARENAS_LINE = re.compile(r"^\d+ arenas \* \d+ bytes/arena\s*=\s*([\d,]+)$", re.M)
BLOCKS_LINE = re.compile(r"^# bytes in (allocated|available) blocks\s*=\s*([\d,]+)$", re.M)


def allocators() -> dict[str, Any]:
    """What each allocator has from the system and what of it is in use: pymalloc's 1 MiB
    arenas (objects of up to 512 bytes; an arena goes back only once all of it is free) and
    glibc's heap (the rest). Their gap is memory freed but kept: the part of RSS no walk of
    live objects finds."""
    with tempfile.TemporaryFile() as out:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(out.fileno(), 2)  # _debugmallocstats writes to C's stderr
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        text = out.read().decode()
    mib = 2**20
    arenas = ARENAS_LINE.search(text)
    blocks = {kind: int(value.replace(",", "")) for kind, value in BLOCKS_LINE.findall(text)}
    result: dict[str, Any] = {
        "pymalloc": {
            "arenas_mib": round(int(arenas.group(1).replace(",", "")) / mib, 1) if arenas else 0,
            "in_use_mib": round(blocks.get("allocated", 0) / mib, 1),
            "free_in_pools_mib": round(blocks.get("available", 0) / mib, 1),
        }
    }
    libc = ctypes.CDLL(None)
    if hasattr(libc, "mallinfo2"):
        libc.mallinfo2.restype = _Mallinfo2
        info = libc.mallinfo2()
        result["glibc"] = {
            "heap_mib": round(info.arena / mib, 1),
            "mmapped_mib": round(info.hblkhd / mib, 1),
            "in_use_mib": round(info.uordblks / mib, 1),
            "free_mib": round(info.fordblks / mib, 1),
        }
    return result


def garbage_shapes(garbage: Iterable[object]) -> dict[str, dict[str, int]]:
    """What the garbage's dicts and lists look like, to say where they come from: a dict by its
    first keys, a list by the type of its first item."""
    dicts: collections.Counter[str] = collections.Counter()
    lists: collections.Counter[str] = collections.Counter()
    for obj in garbage:
        if type(obj) is dict:
            dicts[",".join(sorted(map(str, obj))[:6])] += 1
        elif type(obj) is list:
            lists[type(obj[0]).__qualname__ if obj else "(empty)"] += 1
    return {"dict": dict(dicts.most_common(10)), "list": dict(lists.most_common(10))}


def census() -> dict[str, Any]:
    before = allocators()  # as the operator runs: uncollected cycles included
    gc.set_debug(gc.DEBUG_SAVEALL)  # what the collection frees, kept to be counted
    try:
        gc.collect()
        garbage = collections.Counter(type(obj).__qualname__ for obj in gc.garbage)
        shapes = garbage_shapes(gc.garbage)
    finally:
        gc.garbage.clear()
        gc.set_debug(0)
    gc.collect()  # the garbage kept to be counted, let go of above, is freed here
    after = allocators()  # before the walk's own allocations
    objects = gc.get_objects()
    by_type: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    for obj in objects:
        entry = by_type[type(obj).__qualname__]
        entry[0] += 1
        entry[1] += sys.getsizeof(obj)
    seen: set[int] = set()
    reach = {}
    roots = owners(objects)
    # every task is fenced: a future's callbacks reach the task awaiting it
    fences = {id(obj) for objs in roots.values() for obj in objs}
    fences.update(id(obj) for obj in objects if isinstance(obj, asyncio.Task))
    for owner, owned in roots.items():
        size, count = deep_size(owned, seen, fences)
        reach[owner] = {"instances": len(owned), "mib": round(size / 2**20, 1), "objects": count}
    rest, rest_count = deep_size(objects, seen, set())
    reach["everything else tracked"] = {"mib": round(rest / 2**20, 1), "objects": rest_count}
    return {
        "allocators": {"before_collect": before, "after_collect": after},
        "collected": dict(garbage.most_common(TOP)),
        "collected_shapes": shapes,
        "gc_stats": gc.get_stats(),
        "reach": reach,
        "held_by": holders(objects),
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
