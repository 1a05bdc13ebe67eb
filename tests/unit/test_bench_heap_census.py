"""bench/heap_census takes kopf's memory apart by what each part belongs to: built from kopf's
own index and memory classes, so a kopf that renames them fails here and not in a bench."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

from kopf._core.engines.indexing import OperatorIndexer, OperatorIndexers
from kopf._core.reactor.inventory import ResourceMemories, ResourceMemory

CENSUS = Path(__file__).resolve().parents[2] / "bench" / "heap_census" / "sitecustomize.py"


def load_census() -> ModuleType:
    spec = importlib.util.spec_from_file_location("heap_census", CENSUS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Runtime:
    """Named as the operator's: the census finds it by its name."""

    def __init__(self) -> None:
        self.clock = SimpleNamespace(latest=["a cycle"], sleepers={})
        self.tasks = ["a task"]


async def test_memories_are_split_by_the_kind_of_object_and_daemons_count_apart() -> None:
    """Async: kopf's memories read the running loop's time when made."""
    census = load_census()
    indexers = OperatorIndexers()
    indexers["pods"] = OperatorIndexer()
    indexers["pods"].replace(("ns", "p", "uid-pod"), {"ns": "a pod"})
    memories = ResourceMemories()
    pod, workload, other = ResourceMemory(), ResourceMemory(), ResourceMemory()
    daemon = SimpleNamespace(task=object())
    workload.daemons_memory.running_daemons["size_workload"] = daemon  # type: ignore[assignment]
    memories._items.update({"uid-pod": pod, "uid-wls": workload, "uid-x": other})

    runtime = Runtime()

    roots = census.owners([indexers, memories, runtime])

    assert list(roots) == [
        "index pods",
        "memories of pods objects",
        "memories, other",
        "runtime.clock.latest",
        "runtime.clock.sleepers",
        "runtime.tasks",
        "daemons of WorkloadSizings",
        "memories of WorkloadSizings",
        "tasks, other",
    ]
    assert roots["runtime.clock.latest"] == [runtime.clock.latest]
    assert roots["runtime.tasks"] == [runtime.tasks]
    assert roots["index pods"] == [indexers["pods"].index]
    assert roots["memories of pods objects"] == [pod]
    assert roots["memories, other"] == [other]
    assert roots["daemons of WorkloadSizings"] == [daemon, daemon.task]
    assert roots["memories of WorkloadSizings"] == [workload]


class Holder:
    def __init__(self) -> None:
        self.members = {1, 2, 3}


def test_sets_are_counted_under_the_instance_that_holds_them() -> None:
    census = load_census()
    held = Holder()
    found = census.holders([held, held.__dict__, [{4}]])
    assert found["set"]["Holder"]["count"] == 1
    assert found["set"]["list"]["count"] == 1
    assert found["dict"]["Holder"]["count"] == 1


def test_an_owner_is_not_walked_through_from_another() -> None:
    """A daemon's coroutine reaches the shared clock; the clock is its own owner."""
    census = load_census()
    clock = [bytes(1000)]
    daemon = [clock, bytes(10)]
    seen: set[int] = set()
    alone = census.deep_size([daemon], seen, {id(clock)})
    assert alone == (sys.getsizeof(daemon) + sys.getsizeof(daemon[1]), 2)
    assert id(clock) not in seen
    through = census.deep_size([daemon], set(), set())
    assert through[0] > alone[0] + 1000


def test_garbage_dicts_are_told_by_their_keys_and_lists_by_their_first_item() -> None:
    census = load_census()
    answer = {"metric": {"pod": "a"}, "value": [1.0, "2"]}
    shapes = census.garbage_shapes([answer, dict(answer), answer["value"], [], Runtime()])
    assert shapes == {"dict": {"metric,value": 2}, "list": {"float": 1, "(empty)": 1}}
