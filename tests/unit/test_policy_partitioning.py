"""The partition planner, as tables: nodes and demand in, layouts per node out."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from gpusizer.catalog import layout_is_valid, load_catalog
from gpusizer.catalog.migparted import NodeLayout
from gpusizer.policy.partitioning import WHOLE, PlanNode, plan_partitions, slice_counts
from hypothesis import given, settings
from hypothesis import strategies as st

CATALOG = load_catalog()
H100 = CATALOG.products["h100-80gb"]
A100 = CATALOG.products["a100-80gb"]
L4 = CATALOG.products["l4"]
WHOLE8: NodeLayout = (None,) * 8


def h100(*counts: tuple[str, int]) -> dict[tuple[str, str], int]:
    return {("h100-80gb", kind): n for kind, n in counts}


def node(
    name: str, pods: int = 0, layout: NodeLayout = WHOLE8, changeable: bool = True
) -> PlanNode:
    return PlanNode(name, H100, layout, tuple(f"llm/{name}-{i}" for i in range(pods)), changeable)


def test_no_demand_changes_nothing() -> None:
    plan = plan_partitions([node("a"), node("b", pods=2)], {})
    assert plan.changes == () and plan.gpus == 16 and plan.gpus_now == plan.gpus_planned == 0


def test_demand_the_layouts_already_hold_changes_nothing() -> None:
    balanced = (("1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"),) * 8
    plan = plan_partitions([node("a", layout=balanced)], h100(("3g.40gb", 2), ("1g.10gb", 3)))
    assert plan.changes == ()
    assert plan.gpus_now == plan.gpus_planned == 2
    assert plan.unmet == {}


def test_demand_held_on_more_gpus_than_needed_is_packed_tighter() -> None:
    balanced = (("1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"),) * 8
    plan = plan_partitions([node("a", layout=balanced)], h100(("3g.40gb", 5), ("1g.10gb", 3)))
    assert (plan.gpus_now, plan.gpus_planned) == (5, 3)
    (change,) = plan.changes
    assert change.layout.count(("3g.40gb", "3g.40gb")) == 2


def test_new_slices_go_to_the_node_without_pods() -> None:
    plan = plan_partitions([node("a", pods=3), node("b")], h100((WHOLE, 3), ("1g.20gb", 3)))
    assert [c.node for c in plan.changes] == ["b"]
    change = plan.changes[0]
    assert change.pods == ()
    assert change.layout == (("1g.20gb", "1g.20gb", "1g.20gb"),) + (None,) * 7
    assert change.gained == {"1g.20gb": 3} and change.lost == {WHOLE: 1}
    assert plan.unmet_now == {("h100-80gb", "1g.20gb"): 3} and plan.unmet == {}
    assert (plan.gpus_now, plan.gpus_planned) == (3, 4)


def test_the_node_with_fewest_pods_is_drained_when_every_node_has_some() -> None:
    plan = plan_partitions([node("a", pods=3), node("b", pods=1)], h100((WHOLE, 4), ("3g.40gb", 1)))
    assert [(c.node, len(c.pods)) for c in plan.changes] == [("b", 1)]
    assert plan.pods_moved == 1


def test_a_drained_node_keeps_the_whole_gpus_its_own_pods_come_back_to() -> None:
    plan = plan_partitions([node("a", pods=2)], h100((WHOLE, 2), ("1g.20gb", 1)))
    (change,) = plan.changes
    assert slice_counts(change.layout) == Counter({WHOLE: 7, "1g.20gb": 1})
    assert change.pods == ("llm/a-0", "llm/a-1")


def test_no_pod_is_evicted_without_a_slice_to_come_back_to() -> None:
    small = (("1g.10gb",) * 7,) * 8
    demand = h100(("1g.10gb", 2), ("7g.80gb", 8))
    # eight 7g.80gb would hold more of the demand, but evict two pods for good
    plan = plan_partitions([node("a", pods=2, layout=small)], demand, running=h100(("1g.10gb", 2)))
    (change,) = plan.changes
    assert slice_counts(change.layout) == Counter({"7g.80gb": 7, "1g.10gb": 2})
    assert plan.unmet == {("h100-80gb", "7g.80gb"): 1}
    full = plan_partitions(
        [node("a", pods=8)], h100((WHOLE, 8), ("1g.20gb", 3)), running=h100((WHOLE, 8))
    )
    assert full.changes == () and full.unmet == {("h100-80gb", "1g.20gb"): 3}


def test_fewer_gpus_win_over_moving_no_pods() -> None:
    # two 3g.40gb on two GPUs, each half empty: one GPU holds both
    half = (("3g.40gb",), ("3g.40gb",)) + (None,) * 6
    plan = plan_partitions([node("a", pods=2, layout=half)], h100(("3g.40gb", 2)))
    assert (plan.gpus_now, plan.gpus_planned) == (2, 1)
    assert plan.changes[0].layout.count(("3g.40gb", "3g.40gb")) == 1


def test_layouts_are_packed_as_tight_as_memory_allows() -> None:
    # 63 memory slots: 8 GPUs at best; first fit decreasing alone needs 9, leaving a slot empty
    # beside seven 1g.10gb where a 1g.20gb and six 1g.10gb fill a GPU
    demand = h100(("1g.10gb", 17), ("1g.20gb", 9), ("2g.20gb", 8), ("3g.40gb", 3))
    plan = plan_partitions([node("a"), node("b")], demand)
    assert plan.gpus_planned == 8 and plan.unmet == {}


def test_no_change_for_a_tie_in_gpus() -> None:
    layout = (("2g.20gb", "2g.20gb", "2g.20gb"),) + (None,) * 7
    plan = plan_partitions([node("a", pods=3, layout=layout)], h100(("2g.20gb", 3)))
    assert plan.changes == () and plan.gpus_now == 1


def test_a_node_held_in_flight_keeps_its_layout() -> None:
    plan = plan_partitions([node("a", changeable=False), node("b", pods=4)], h100(("3g.40gb", 2)))
    assert [c.node for c in plan.changes] == ["b"]


def test_profiles_outside_the_allowed_list_are_unmet_not_made() -> None:
    plan = plan_partitions([node("a")], h100(("1g.10gb", 2), ("3g.40gb", 1)), allowed=["3g.40gb"])
    assert plan.unmet == {("h100-80gb", "1g.10gb"): 2}
    assert slice_counts(plan.changes[0].layout)["1g.10gb"] == 0


def test_demand_beyond_every_gpu_is_reported_unmet() -> None:
    plan = plan_partitions([node("a")], h100(("7g.80gb", 10)))
    assert plan.unmet == {("h100-80gb", "7g.80gb"): 2}
    assert plan.gpus_planned == 8


def test_products_are_planned_apart() -> None:
    a100 = PlanNode("x", A100, (None,) * 8)
    l4 = PlanNode("l", L4, (None,) * 4)
    demand = {("a100-80gb", "1g.10gb"): 7, ("h100-80gb", "3g.40gb"): 1, ("l4", WHOLE): 2}
    plan = plan_partitions([a100, l4], demand)
    assert [c.node for c in plan.changes] == ["x"]
    assert plan.changes[0].layout[0] == ("1g.10gb",) * 7
    assert plan.unmet == {("h100-80gb", "3g.40gb"): 1}  # no H100 node
    assert plan.gpus_planned == 3  # 1 A100 + 2 L4


def test_a_product_without_mig_never_gets_a_mig_layout() -> None:
    plan = plan_partitions([PlanNode("l", L4, (None,) * 4)], {("l4", "1g.10gb"): 1})
    assert plan.changes == () and plan.unmet == {("l4", "1g.10gb"): 1}


def test_the_plan_does_not_depend_on_the_order_of_its_input() -> None:
    nodes = [node("a", pods=1), node("b"), node("c", pods=2), node("d")]
    demand = h100(("1g.10gb", 9), ("3g.40gb", 3), (WHOLE, 2), ("2g.20gb", 4))
    first = plan_partitions(nodes, demand)
    for seed in range(5):
        shuffled = list(nodes)
        random.Random(seed).shuffle(shuffled)
        assert plan_partitions(shuffled, dict(reversed(list(demand.items())))) == first


PROFILES = [*sorted(H100.mig.profiles), WHOLE] if H100.mig else []


@settings(max_examples=60, deadline=None)
@given(
    demand=st.dictionaries(st.sampled_from(PROFILES), st.integers(1, 12), max_size=5),
    pods=st.lists(st.integers(0, 3), min_size=1, max_size=4),
)
def test_every_layout_is_one_the_product_holds_and_the_demand_is_held(
    demand: dict[str, int], pods: list[int]
) -> None:
    nodes = [node(f"n{i}", pods=p) for i, p in enumerate(pods)]
    plan = plan_partitions(nodes, h100(*demand.items()))
    layouts = {n.name: n.layout for n in nodes} | {c.node: c.layout for c in plan.changes}
    for layout in layouts.values():
        for gpu in layout:
            assert gpu is None or layout_is_valid(H100, list(gpu))
    held: Counter[str] = Counter()
    for layout in layouts.values():
        held += slice_counts(layout)
    for kind, n in demand.items():
        assert held[kind] + plan.unmet.get(("h100-80gb", kind), 0) >= n
    assert plan.gpus_planned <= plan.gpus


@pytest.mark.parametrize("gpus_per_node", [1, 8])
def test_the_plan_never_uses_more_gpus_than_it_started_with(gpus_per_node: int) -> None:
    layout = (("1g.10gb",) * 7,) * gpus_per_node
    plan = plan_partitions([node("a", layout=layout)], h100(("1g.10gb", 3)))
    assert plan.gpus_planned <= plan.gpus_now
