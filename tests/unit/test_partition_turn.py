"""A GPUPartitioning's turns against in-memory nodes, pods and ConfigMap (tests/fakes.py):
every step of a re-partition, every way it ends, and every bad input moving nothing."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
import yaml
from gpusizer.api.partitioning import RepartitionRecord
from gpusizer.catalog import load_catalog
from gpusizer.catalog.loader import deep_merge
from gpusizer.catalog.migparted import config_name, parse_config, with_configs
from gpusizer.partition.objects import ConfigMapRef, GpuNode, GpuPod, SizingDemand
from gpusizer.partition.turn import (
    FAILURE_BACKOFF_SECONDS,
    Outcome,
    PartitioningObject,
    PartitionServices,
    PartitionView,
    Written,
    partition_turn,
)

from tests.fakes import FakeNodes

H100 = "NVIDIA-H100-80GB-HBM3"
REF = ConfigMapRef("gpu-operator", "custom-mig-parted-config")
NVIDIA_DEFAULTS = (
    "version: v1\nmig-configs:\n  all-disabled:\n  - devices: all\n    mig-enabled: false\n"
)
T0 = 1_800_000_000.0
CATALOG = load_catalog()
SLICE_1G20 = (("1g.20gb",),) + (None,) * 7


def gfd_node(name: str, config: str = "all-disabled", **labels: str | None) -> GpuNode:
    base: dict[str, str | None] = {
        "pool": "fleet",
        "nvidia.com/gpu.product": H100,
        "nvidia.com/gpu.count": "8",
        "nvidia.com/mig.capable": "true",
        "nvidia.com/mig.strategy": "mixed",
        "nvidia.com/mig.config": config,
        "nvidia.com/mig.config.state": "success",
    }
    base.update(labels)
    return GpuNode(name, {k: v for k, v in base.items() if v is not None}, unschedulable=False)


def gpu_pod(name: str, node: str | None, resource: str = "nvidia.com/gpu") -> GpuPod:
    return GpuPod("llm", name, node, resource, 1, terminating=False, product_label=H100)


@dataclass
class Cluster:
    """The fake API server, the pods on it, and one GPUPartitioning's object between turns."""

    nodes: FakeNodes
    pods: list[GpuPod] = field(default_factory=list)
    sizings: list[SizingDemand] = field(default_factory=list)
    selectors: dict[str, dict[str, str]] = field(default_factory=dict)
    obj: PartitioningObject = field(default_factory=lambda: PartitioningObject("fleet", {}, {}, 1))
    now: float = T0

    def spec(self, **spec: Any) -> None:
        self.obj = replace(self.obj, spec={"nodeSelector": {"pool": "fleet"}, **spec})
        self.selectors[self.obj.name] = dict(self.obj.spec["nodeSelector"])

    written: Written = field(default_factory=Written)  # this process's memory across turns
    settle: float = 0.0  # --mig-config-settle

    async def turn(self, seconds: float = 5, nodes: dict[str, GpuNode] | None = None) -> Outcome:
        """A turn on what the watches show: the nodes as they are, or `nodes` (a watch behind)."""
        self.now += seconds
        view = PartitionView(
            nodes=dict(self.nodes.nodes if nodes is None else nodes),
            pods=list(self.pods),
            sizings=list(self.sizings),
            template=lambda ns, kind, name: None,
            selectors=self.selectors,
        )
        services = PartitionServices(CATALOG, self.nodes, REF, self.written, self.settle)
        outcome = await partition_turn(self.obj, view, services, self.now)
        # a merge patch, as the API server applies it to the status
        self.obj = replace(self.obj, status=deep_merge(dict(self.obj.status), outcome.status_patch))
        return outcome

    def condition(self, type_: str) -> Mapping[str, Any]:
        return next(c for c in self.obj.status["conditions"] if c["type"] == type_)

    def node_plan(self, name: str) -> Mapping[str, Any]:
        return next(n for n in self.obj.status["nodes"] if n["name"] == name)

    def evictions_done(self) -> None:
        """The evicted pods are gone (their replacements wait, unbound)."""
        gone = set(self.nodes.evicted)
        self.pods = [
            replace(p, node=None) if p.key in gone and p.node is not None else p for p in self.pods
        ]

    def mig_manager(self, node: str, state: str) -> None:
        self.nodes.nodes[node] = replace(
            self.nodes.nodes[node],
            labels={**self.nodes.nodes[node].labels, "nvidia.com/mig.config.state": state},
        )

    def in_flight(self, node: str) -> bool:
        return self.nodes.nodes[node].record is not None

    def record(self, node: str) -> RepartitionRecord:
        raw = self.nodes.nodes[node].record
        assert raw is not None, f"node {node} has no re-partition record"
        return RepartitionRecord.parse(raw)


def fleet(*nodes: GpuNode, config: str | None = NVIDIA_DEFAULTS) -> Cluster:
    cluster = Cluster(FakeNodes(nodes={n.name: n for n in nodes}, config=config))
    cluster.spec(mode="Auto")
    return cluster


def needing_a_slice(cluster: Cluster, profile: str = "1g.20gb", n: int = 1) -> None:
    for i in range(n):
        cluster.pods.append(gpu_pod(f"wants-{profile}-{i}", None, f"nvidia.com/mig-{profile}"))


def reasons(outcome: Outcome) -> list[str]:
    return [e.reason.value for e in outcome.events]


async def test_recommend_reports_the_plan_and_changes_nothing() -> None:
    cluster = fleet(gfd_node("a"), gfd_node("b"))
    cluster.spec(mode="Recommend")
    cluster.pods.append(gpu_pod("chat-0", "a"))
    needing_a_slice(cluster)
    await cluster.turn()
    assert cluster.nodes.patches == [] and cluster.nodes.writes == []
    assert cluster.nodes.evicted == []
    plan = cluster.node_plan("b")
    assert plan["step"] == "Planned" and plan["podsToMove"] == []
    assert plan["proposedLayout"][0] == "1g.20gb" and plan["slicesGained"] == {"1g.20gb": 1}
    assert plan["proposedConfig"] == config_name(SLICE_1G20)
    assert plan["currentLayout"] == ["whole"] * 8
    assert cluster.node_plan("a")["step"] == "Unchanged"
    summary = cluster.obj.status["summary"]
    assert summary["demand"] == {"h100-80gb/gpu": 1, "h100-80gb/1g.20gb": 1}
    assert (summary["gpusNeededNow"], summary["gpusNeededPlanned"]) == (1, 2)
    assert cluster.condition("Ready")["reason"] == "RecommendOnly"
    partitioned = cluster.condition("Partitioned")
    assert partitioned["status"] == "False" and partitioned["reason"] == "PlanPending"


async def test_mode_off_changes_nothing() -> None:
    cluster = fleet(gfd_node("a"))
    cluster.spec(mode="Off")
    needing_a_slice(cluster)
    await cluster.turn()
    assert cluster.nodes.patches == [] and cluster.condition("Ready")["reason"] == "ModeOff"


async def test_auto_takes_a_node_through_every_step() -> None:
    cluster = fleet(gfd_node("a"))
    cluster.pods.append(gpu_pod("chat-0", "a"))
    needing_a_slice(cluster)

    started = await cluster.turn()
    assert reasons(started) == ["RepartitionStarted"]
    node = cluster.nodes.nodes["a"]
    assert node.unschedulable
    record = cluster.record("a")
    assert record.step == "Draining" and record.from_config == "all-disabled"
    assert record.to_config in parse_config(cluster.nodes.config)  # written before the label
    assert cluster.condition("Partitioned")["reason"] == "Repartitioning"

    await cluster.turn()
    assert cluster.nodes.evicted == ["llm/chat-0"]
    cluster.evictions_done()

    await cluster.turn()
    node = cluster.nodes.nodes["a"]
    assert node.mig_config == record.to_config and node.mig_state is None
    assert cluster.record("a").step == "Configuring"

    await cluster.turn()  # mig-manager still working: nothing to do
    cluster.mig_manager("a", "pending")
    await cluster.turn()
    assert cluster.node_plan("a")["step"] == "Configuring"
    cluster.mig_manager("a", "success")
    done = await cluster.turn()
    assert reasons(done) == ["Repartitioned"]
    node = cluster.nodes.nodes["a"]
    assert not node.unschedulable and node.record is None
    assert len(cluster.nodes.writes) == 1
    assert [p[1]["unschedulable"] for p in cluster.nodes.patches].count(True) == 1


async def test_a_node_without_gpu_pods_is_chosen_and_needs_no_drain() -> None:
    cluster = fleet(gfd_node("a"), gfd_node("b"))
    cluster.pods.append(gpu_pod("chat-0", "a"))
    needing_a_slice(cluster)
    await cluster.turn()
    assert cluster.in_flight("b") and not cluster.in_flight("a")
    await cluster.turn()
    assert cluster.nodes.evicted == []
    assert cluster.nodes.nodes["b"].mig_config == config_name(SLICE_1G20)


async def test_a_pdb_that_refuses_waits_and_forces_nothing() -> None:
    cluster = fleet(gfd_node("a"))
    cluster.pods += [gpu_pod("held-0", "a"), gpu_pod("free-0", "a")]
    needing_a_slice(cluster)
    cluster.nodes.refuse["llm/held-0"] = (
        "Cannot evict pod as it would violate the pod's disruption budget"
    )
    await cluster.turn()
    blocked = await cluster.turn()
    assert cluster.nodes.evicted == ["llm/free-0"]
    assert "DrainBlocked" in reasons(blocked)
    condition = cluster.condition("Partitioned")
    assert condition["reason"] == "DrainBlocked" and "llm/held-0" in condition["message"]
    assert "disruption budget" in cluster.node_plan("a")["message"]
    cluster.evictions_done()
    again = await cluster.turn()
    assert "DrainBlocked" not in reasons(again)  # said once
    node = cluster.nodes.nodes["a"]
    assert node.unschedulable and node.mig_config == "all-disabled"
    assert cluster.record("a").step == "Draining"


async def test_a_restarted_operator_resumes_the_drain_without_a_second_one() -> None:
    cluster = fleet(gfd_node("a"))
    cluster.pods += [gpu_pod("held-0", "a")]
    needing_a_slice(cluster)
    cluster.nodes.refuse["llm/held-0"] = "disruption budget"
    await cluster.turn()
    await cluster.turn()
    # a new process: nothing remembered but the node, its pods and the object
    cluster.obj = replace(cluster.obj, status={})
    patches_before = len(cluster.nodes.patches)
    await cluster.turn()
    assert len(cluster.nodes.patches) == patches_before  # no second cordon or record
    assert cluster.node_plan("a")["step"] == "Draining"
    del cluster.nodes.refuse["llm/held-0"]
    await cluster.turn()
    cluster.evictions_done()
    await cluster.turn()
    assert cluster.nodes.evicted == ["llm/held-0"]
    assert [p[1]["unschedulable"] for p in cluster.nodes.patches].count(True) == 1


async def test_a_drain_past_its_timeout_is_given_up_and_uncordoned() -> None:
    cluster = fleet(gfd_node("a"))
    cluster.spec(mode="Auto", drain={"timeoutSeconds": 60})
    cluster.pods += [gpu_pod("held-0", "a")]
    needing_a_slice(cluster)
    cluster.nodes.refuse["llm/held-0"] = "disruption budget"
    await cluster.turn()
    gave_up = await cluster.turn(61)
    assert "DrainTimedOut" in reasons(gave_up)
    node = cluster.nodes.nodes["a"]
    assert not node.unschedulable and node.record is None and node.mig_config == "all-disabled"
    assert cluster.condition("Partitioned")["reason"] == "DrainTimedOut"
    assert cluster.nodes.evicted == []


async def mig_manager_fails(cluster: Cluster) -> None:
    await cluster.turn()
    await cluster.turn()  # drained: no pods
    cluster.mig_manager("a", "failed")


async def test_failed_restores_the_previous_config_and_uncordons_with_a_condition() -> None:
    cluster = fleet(gfd_node("a"))
    needing_a_slice(cluster)
    await mig_manager_fails(cluster)
    rolling = await cluster.turn()
    assert "RepartitionRolledBack" in reasons(rolling)
    node = cluster.nodes.nodes["a"]
    assert node.mig_config == "all-disabled" and node.unschedulable
    assert cluster.record("a").step == "RollingBack"
    cluster.mig_manager("a", "success")
    await cluster.turn()
    node = cluster.nodes.nodes["a"]
    assert not node.unschedulable and node.record is None and node.failure is not None
    condition = cluster.condition("Partitioned")
    assert condition["reason"] == "MigConfigFailed" and "node a" in condition["message"]
    # not tried again at once: the node is held for a while, and the status says until when
    patches = len(cluster.nodes.patches)
    await cluster.turn()
    assert len(cluster.nodes.patches) == patches
    assert "held until" in cluster.node_plan("a")["reason"]
    await cluster.turn(FAILURE_BACKOFF_SECONDS)
    assert cluster.nodes.nodes["a"].unschedulable  # tried again after the backoff


async def test_no_success_before_the_deadline_rolls_back() -> None:
    cluster = fleet(gfd_node("a"))
    cluster.spec(mode="Auto", reconfigureTimeoutSeconds=60)
    needing_a_slice(cluster)
    await cluster.turn()
    await cluster.turn()
    cluster.mig_manager("a", "pending")
    await cluster.turn(61)
    assert cluster.nodes.nodes["a"].mig_config == "all-disabled"
    assert "within 60s" in cluster.record("a").message


async def test_a_rollback_that_fails_too_leaves_the_node_cordoned_for_a_person() -> None:
    cluster = fleet(gfd_node("a"))
    needing_a_slice(cluster)
    await mig_manager_fails(cluster)
    await cluster.turn()
    cluster.mig_manager("a", "failed")
    await cluster.turn()
    node = cluster.nodes.nodes["a"]
    assert node.unschedulable and node.record is not None
    assert cluster.condition("Partitioned")["reason"] == "RollbackFailed"


async def test_a_label_changed_under_the_plan_is_left_to_whoever_changed_it() -> None:
    cluster = fleet(gfd_node("a"))
    cluster.pods += [gpu_pod("held-0", "a")]
    cluster.nodes.refuse["llm/held-0"] = "disruption budget"
    needing_a_slice(cluster)
    await cluster.turn()
    await cluster.turn()
    labels = {**cluster.nodes.nodes["a"].labels, "nvidia.com/mig.config": "all-balanced"}
    cluster.nodes.nodes["a"] = replace(cluster.nodes.nodes["a"], labels=labels)
    outcome = await cluster.turn()
    assert "RepartitionAbandoned" in reasons(outcome)
    node = cluster.nodes.nodes["a"]
    assert node.mig_config == "all-balanced" and node.record is None
    assert node.unschedulable  # their node now: the cordon is theirs to lift
    condition = cluster.condition("Partitioned")
    assert condition["reason"] == "LabelChangedUnderPlan" and "all-balanced" in condition["message"]
    patches = len(cluster.nodes.patches)
    await cluster.turn()
    assert len(cluster.nodes.patches) == patches


async def test_one_node_at_a_time_unless_told_otherwise() -> None:
    cluster = fleet(gfd_node("a"), gfd_node("b"))
    needing_a_slice(cluster, "7g.80gb", 9)
    await cluster.turn()
    assert [n for n in "ab" if cluster.in_flight(n)] == ["a"]
    assert cluster.node_plan("b")["step"] == "Planned"
    cluster = fleet(gfd_node("a"), gfd_node("b"))
    cluster.spec(mode="Auto", maxNodesUnavailable=2)
    needing_a_slice(cluster, "7g.80gb", 9)
    await cluster.turn()
    assert [n for n in "ab" if cluster.in_flight(n)] == ["a", "b"]


@pytest.mark.parametrize(
    ("labels", "unschedulable", "why"),
    [
        ({"nvidia.com/mig.config.state": "pending"}, False, "mig-manager is applying"),
        ({"nvidia.com/mig.config.state": "failed"}, False, "reported failed"),
        ({}, True, "cordoned by someone else"),
        ({"nvidia.com/mig.strategy": "single"}, False, "needs mixed"),
        ({"nvidia.com/mig.capable": "false"}, False, "not MIG-capable"),
    ],
)
async def test_nodes_that_are_not_ours_to_change_are_left_alone(
    labels: dict[str, str], unschedulable: bool, why: str
) -> None:
    node = replace(gfd_node("a", **labels), unschedulable=unschedulable)
    cluster = fleet(node)
    needing_a_slice(cluster)
    await cluster.turn()
    assert cluster.nodes.patches == []
    assert why in cluster.node_plan("a")["reason"]
    assert cluster.condition("Partitioned")["reason"] == "DemandUnmet"


def edited_config() -> str:
    layout = SLICE_1G20
    name = config_name(layout)
    document = {
        "version": "v1",
        "mig-configs": {
            name: [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 7}}]
        },
    }
    return yaml.safe_dump(document)


@pytest.mark.parametrize(
    ("cluster_of", "reason", "says"),
    [
        (
            lambda: fleet(gfd_node("a", **{"nvidia.com/gpu.product": None})),
            "NodeNotLabelled",
            "node a: no nvidia.com/gpu.product label",
        ),
        (
            lambda: fleet(gfd_node("a", **{"nvidia.com/gpu.count": None})),
            "NodeNotLabelled",
            "no nvidia.com/gpu.count",
        ),
        (
            lambda: fleet(gfd_node("a", **{"nvidia.com/gpu.product": "NVIDIA-X9000"})),
            "NodeNotLabelled",
            "'NVIDIA-X9000' is not in the catalog",
        ),
        (
            lambda: fleet(gfd_node("a", config="all-1g.5gb")),
            "LayoutNotSupported",
            "config all-1g.5gb is not a standard layout a NVIDIA-H100-80GB-HBM3 holds",
        ),
        (lambda: fleet(gfd_node("a"), config=edited_config()), "MigConfigEdited", "by hand"),
        (lambda: fleet(gfd_node("a"), config=None), "MigConfigUnavailable", "not found"),
        (
            lambda: fleet(gfd_node("a"), config="version: v1\nmig-configs: [x]\n"),
            "MigConfigUnavailable",
            "must be a mapping",
        ),
    ],
)
async def test_bad_input_is_a_clear_condition_and_moves_nothing(
    cluster_of: Any, reason: str, says: str
) -> None:
    cluster: Cluster = cluster_of()
    cluster.pods.append(gpu_pod("chat-0", "a"))
    needing_a_slice(cluster)
    outcome = await cluster.turn()
    assert cluster.nodes.patches == [] and cluster.nodes.writes == []
    assert cluster.nodes.evicted == []
    ready = cluster.condition("Ready")
    assert (ready["status"], ready["reason"]) == ("False", reason)
    assert says in ready["message"]
    assert reasons(outcome) == ["PartitioningBlocked"]
    await cluster.turn()
    assert cluster.nodes.patches == []


async def test_a_profile_no_selected_gpu_has_is_refused() -> None:
    cluster = fleet(gfd_node("a"))
    cluster.spec(mode="Auto", allowedProfiles=["1g.5gb"], spareSlices={"1g.5gb": 1})
    await cluster.turn()
    ready = cluster.condition("Ready")
    assert ready["reason"] == "LayoutNotSupported" and "1g.5gb" in ready["message"]
    assert cluster.nodes.patches == []


async def test_two_partitionings_selecting_one_node_move_nothing() -> None:
    cluster = fleet(gfd_node("a"), gfd_node("b", pool="other", team="x"))
    cluster.selectors["other"] = {"nvidia.com/gpu.product": H100}
    needing_a_slice(cluster)
    await cluster.turn()
    ready = cluster.condition("Ready")
    assert ready["reason"] == "NodeSelectedTwice"
    assert "node a is also selected by GPUPartitioning other" in ready["message"]
    assert cluster.nodes.patches == []


async def test_an_invalid_spec_is_said_and_nothing_read() -> None:
    cluster = fleet(gfd_node("a"))
    cluster.obj = replace(cluster.obj, spec={"nodeSelector": {}, "mode": "Sometimes"})
    await cluster.turn()
    ready = cluster.condition("Ready")
    assert ready["reason"] == "InvalidSpec" and "spec.nodeSelector" in ready["message"]
    assert cluster.nodes.patches == []


async def test_spare_slices_are_demand_on_each_product_that_has_them() -> None:
    cluster = fleet(gfd_node("a"))
    cluster.spec(mode="Recommend", spareSlices={"3g.40gb": 2})
    await cluster.turn()
    assert cluster.obj.status["summary"]["demand"] == {"h100-80gb/3g.40gb": 2}
    assert cluster.node_plan("a")["proposedLayout"][0] == "3g.40gb+3g.40gb"


async def test_a_recommendation_waiting_for_free_capacity_is_demand() -> None:
    cluster = fleet(gfd_node("a"))
    cluster.spec(mode="Recommend")
    blocked = ("nvidia.com/mig-2g.20gb", H100, 3)
    cluster.sizings.append(SizingDemand("llm", "chat", "Deployment", "chat", blocked, None))
    await cluster.turn()
    assert cluster.obj.status["summary"]["demand"] == {"h100-80gb/2g.20gb": 3}


async def test_the_status_is_written_only_when_it_changed() -> None:
    cluster = fleet(gfd_node("a"))
    cluster.spec(mode="Recommend")
    first = await cluster.turn()
    assert first.status_patch
    second = await cluster.turn()
    assert second.status_patch == {} and second.events == []


async def test_a_conflicting_configmap_write_is_tried_again() -> None:
    cluster = fleet(gfd_node("a"))
    needing_a_slice(cluster)
    cluster.nodes.fail["write"] = "the object has been modified"
    await cluster.turn()
    assert "the object has been modified" in cluster.node_plan("a")["message"]
    del cluster.nodes.fail["write"]
    await cluster.turn()
    assert cluster.record("a").to_config in parse_config(cluster.nodes.config)


async def test_configs_no_node_names_any_more_are_dropped() -> None:
    stale_layout = (("3g.40gb", "3g.40gb"),) * 8
    stale = config_name(stale_layout)
    cluster = fleet(gfd_node("a"), config=with_configs(NVIDIA_DEFAULTS, (), {stale: stale_layout}))
    needing_a_slice(cluster)
    await cluster.turn()
    configs = parse_config(cluster.nodes.config)
    assert stale not in configs and "all-disabled" in configs


async def test_a_node_in_flight_is_carried_on_when_another_partitioning_selects_it() -> None:
    cluster = fleet(gfd_node("a"))
    needing_a_slice(cluster)
    await cluster.turn()
    cluster.selectors["other"] = {"pool": "fleet"}
    await cluster.turn()
    assert cluster.condition("Ready")["reason"] == "NodeSelectedTwice"
    assert cluster.record("a").step == "Configuring"
    cluster.mig_manager("a", "success")
    await cluster.turn()
    assert not cluster.nodes.nodes["a"].unschedulable and not cluster.in_flight("a")


async def test_demand_that_went_away_leaves_the_status_too() -> None:
    cluster = fleet(gfd_node("a"))
    cluster.spec(mode="Recommend")
    cluster.pods.append(gpu_pod("chat-0", "a"))
    needing_a_slice(cluster)
    await cluster.turn()
    cluster.pods = [gpu_pod("chat-0", "a")]
    await cluster.turn()
    assert cluster.obj.status["summary"]["demand"] == {"h100-80gb/gpu": 1}
    assert (
        "unmet" not in cluster.obj.status["summary"] or not cluster.obj.status["summary"]["unmet"]
    )


async def test_a_watch_behind_gpusizers_own_write_is_waited_for() -> None:
    cluster = fleet(gfd_node("a"))
    needing_a_slice(cluster)
    before = dict(cluster.nodes.nodes)
    await cluster.turn()  # cordoned, record written
    patches = len(cluster.nodes.patches)
    # the watch still shows the node from before the cordon: nothing is done a second time
    again = await cluster.turn(nodes=before)
    assert len(cluster.nodes.patches) == patches and "RepartitionStarted" not in reasons(again)
    assert "waiting for the watch" in cluster.node_plan("a")["message"]
    await cluster.turn()  # the watch caught up: the move goes on
    assert cluster.record("a").step == "Configuring"
    stale = dict(cluster.nodes.nodes)
    cluster.mig_manager("a", "success")
    await cluster.turn()
    uncordoned = len(cluster.nodes.patches)
    await cluster.turn(nodes={"a": replace(stale["a"], labels=cluster.nodes.nodes["a"].labels)})
    assert len(cluster.nodes.patches) == uncordoned  # not finished twice
    # a watch that never shows the write (someone else changed the node) is believed in time
    await cluster.turn(
        seconds=61, nodes={"a": replace(stale["a"], labels=cluster.nodes.nodes["a"].labels)}
    )
    assert len(cluster.nodes.patches) == uncordoned + 1


async def test_the_label_waits_for_the_kubelet_to_refresh_mig_managers_copy_of_the_config() -> None:
    cluster = fleet(gfd_node("a"))
    cluster.settle = 60
    needing_a_slice(cluster)
    await cluster.turn()  # cordoned and config written at T0 + 5
    await cluster.turn(30)
    assert cluster.nodes.nodes["a"].mig_config == "all-disabled"
    assert "set in 30s" in cluster.node_plan("a")["message"]
    await cluster.turn(30)
    assert cluster.nodes.nodes["a"].mig_config == config_name(SLICE_1G20)
