"""GPU partitioning on the local cluster: a GPUPartitioning re-partitions real (kwok) nodes
through the emulated mig-manager, drains through the real Eviction API and PodDisruptionBudgets,
and right-sizing moves the workloads onto the slices it makes.

Each test adds its own node pool (`cluster apply-nodes`), tainted so only its own pods land
there, and removes it at the end: the other modules' pools and slice counts stay as they were.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, watch

from e2e.tests.conftest import REPO, Cluster, wait_until
from e2e.tests.operator_support import (
    H100,
    Operator,
    Workloads,
    deployment_manifest,
    sizing_spec,
)

pytestmark = pytest.mark.e2e

MIG_NAMESPACE, MIG_CONFIG_MAP = "gpu-operator", "custom-mig-parted-config"
TAINT = {"key": "gpusizer.io/e2e", "value": "partitioning", "effect": "NoSchedule"}
# what a GPU Operator user copies from NVIDIA's default file into their own ConfigMap
NVIDIA_CONFIGS = {
    "version": "v1",
    "mig-configs": {
        "all-disabled": [{"devices": "all", "mig-enabled": False}],
        "all-balanced": [
            {
                "devices": "all",
                "mig-enabled": True,
                "mig-devices": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1},
            }
        ],
    },
}


@pytest.fixture(scope="module")
def mig_config_map(manifests: Cluster) -> Cluster:
    """The ConfigMap mig-manager reads (ClusterPolicy migManager.config.name), as a user makes
    it before pointing a GPUPartitioning at their nodes."""
    cluster = manifests
    cluster.kubectl("create", "namespace", MIG_NAMESPACE, check=False)
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": MIG_CONFIG_MAP, "namespace": MIG_NAMESPACE},
        "data": {"config.yaml": yaml.safe_dump(NVIDIA_CONFIGS)},
    }
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(config_map))
    return cluster


class Pools:
    """Node pools of one test: 8 x H100 each, mixed MIG strategy, all-disabled."""

    def __init__(self, cluster: Cluster, workdir: Path) -> None:
        self.cluster = cluster
        self.workdir = workdir
        self.nodes: list[str] = []
        self.partitionings: list[str] = []

    def add(
        self, pool: str, count: int = 1, annotations: dict[str, str] | None = None
    ) -> list[str]:
        pools = {
            "pools": [
                {
                    "name": pool,
                    "count": count,
                    "product": H100,
                    "family": "hopper",
                    "gpuCount": 8,
                    "gpuMemoryMiB": 81559,
                    "migCapable": True,
                    "migStrategy": "mixed",
                    "migConfig": "all-disabled",
                    "annotations": annotations or {},
                    "taints": [TAINT],
                    "allocatable": {
                        "cpu": "192",
                        "memory": "2000Gi",
                        "pods": "110",
                        "nvidia.com/gpu": "8",
                    },
                }
            ]
        }
        path = self.workdir / f"{pool}.yaml"
        path.write_text(yaml.safe_dump(pools))
        binary = subprocess.run(
            [str(REPO / "e2e" / "scripts" / "build-cluster.sh")],
            capture_output=True,
            text=True,
            check=True,
            timeout=1800,
        ).stdout.strip()
        kubeconfig = str(self.cluster.kubeconfig)
        command = [binary, "apply-nodes", "--kubeconfig", kubeconfig, "--nodepools", str(path)]
        # pod IPs from the cluster's own block, not another cluster's on this host
        command += ["--pod-block", self.cluster.env.get("POD_BLOCK", "0")]
        subprocess.run(
            command,
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        )
        names = [f"{pool}-{i}" for i in range(count)]
        self.nodes += [n for n in names if n not in self.nodes]
        for name in names:
            self.cluster.kubectl("wait", "--for=condition=Ready", f"node/{name}", "--timeout=60s")
            wait_until(
                lambda n=name: (
                    "gpusim.gpusizer.io/mig-layout-applied"
                    in (self.node(n)["metadata"].get("annotations") or {})
                ),
                30,
                what=f"the emulated mig-manager adopting {name}",
            )
        return names

    def partitioning(self, name: str, pool: str, **spec: Any) -> subprocess.CompletedProcess[str]:
        obj = {
            "apiVersion": "gpusizer.io/v1alpha1",
            "kind": "GPUPartitioning",
            "metadata": {"name": name},
            "spec": {"nodeSelector": {"gpusizer.io/node-pool": pool}, **spec},
        }
        self.partitionings.append(name)
        return self.cluster.kubectl("apply", "-f", "-", stdin=json.dumps(obj), check=False)

    def status(self, name: str) -> dict[str, Any]:
        obj = self.cluster.kubectl_json("get", "gpupartitioning", name)
        return dict(obj.get("status") or {})

    def condition(self, name: str, type_: str) -> dict[str, Any]:
        for c in self.status(name).get("conditions", []):
            if c["type"] == type_:
                return dict(c)
        return {}

    def wait_condition(self, name: str, type_: str, reason: str, timeout: float) -> dict[str, Any]:
        found: dict[str, Any] = wait_until(
            lambda: (c := self.condition(name, type_)).get("reason") == reason and c,
            timeout=timeout,
            what=f"GPUPartitioning {name} {type_} {reason} (now {self.condition(name, type_)})",
        )
        return found

    def node(self, name: str) -> dict[str, Any]:
        return dict(self.cluster.kubectl_json("get", "node", name))

    def events(self, name: str) -> list[str]:
        """This object's events (not those of an earlier one of the same name: events stay an
        hour)."""
        uid = self.cluster.kubectl_json("get", "gpupartitioning", name)["metadata"]["uid"]
        found = self.cluster.kubectl_json(
            "get", "events", "-A", "--field-selector", f"involvedObject.uid={uid}"
        )
        return [e.get("reason", "") for e in found.get("items", [])]

    def remove(self) -> None:
        for name in self.partitionings:
            self.cluster.kubectl("delete", "gpupartitioning", name, "--timeout=60s", check=False)
        for name in self.nodes:
            self.cluster.kubectl("delete", "node", name, "--timeout=60s", check=False)


@pytest.fixture
def pools(mig_config_map: Cluster, operator: Operator, tmp_path: Path) -> Iterator[Pools]:
    made = Pools(mig_config_map, tmp_path)
    try:
        yield made
    finally:
        made.remove()


def pinned(manifest: dict[str, Any], pool: str) -> dict[str, Any]:
    """Only on `pool`'s nodes, and with no toleration of a cordon: evicted pods must not come
    back to the node being drained."""
    spec = manifest["spec"]["template"]["spec"]
    spec["nodeSelector"]["gpusizer.io/node-pool"] = pool
    spec["tolerations"] = [{**TAINT, "operator": "Equal"}]
    return manifest


def placed_on(workloads: Workloads, app: str) -> list[str]:
    return [p["spec"]["nodeName"] for p in workloads.pods(app) if p["spec"].get("nodeName")]


def record_node_changes(
    cluster: Cluster, node: str
) -> tuple[list[tuple[bool, str]], Callable[[], None]]:
    """Every (unschedulable, nvidia.com/mig.config) the node goes through, from a watch."""
    seen: list[tuple[bool, str]] = []
    api = client.CoreV1Api(cluster.api_client())
    stream = watch.Watch()

    stopped = threading.Event()

    def follow() -> None:
        events = stream.stream(
            api.list_node, field_selector=f"metadata.name={node}", timeout_seconds=600
        )
        try:
            for event in events:
                obj = event["object"]
                state = (
                    bool(obj.spec.unschedulable),
                    (obj.metadata.labels or {}).get("nvidia.com/mig.config", ""),
                )
                if not seen or seen[-1] != state:
                    seen.append(state)
        except Exception:
            if not stopped.is_set():
                raise

    def stop() -> None:
        stopped.set()
        stream.stop()

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    wait_until(lambda: seen, 30, what=f"the watch on {node}")
    return seen, stop


def test_small_models_on_whole_gpus_move_to_new_mig_slices(
    pools: Pools, workloads: Workloads
) -> None:
    (busy,) = pools.add("part-a")
    small = ("small-0", "small-1", "small-2")
    for name in small:
        # 12 GiB models at 0.5 req/s on whole H100s: one 1g.20gb slice holds each, far from
        # the 70 % target. At 1 req/s (8-12 % busy, read as about 60 % on the slice) a noisy
        # reading could ask for two, and a plan held five slices, not three.
        manifest = deployment_manifest(name, workloads.namespace, memory_mib=12288)
        workloads.apply(pinned(manifest, "part-a"))
        workloads.load(name, 0.5)
        spec = sizing_spec(
            name,
            replicas={"min": 1, "max": 2},
            rightSizing={
                "mode": "Auto",
                "historySeconds": 60,
                "allowedSlices": ["gpu-h100", "mig-1g.20gb"],
                "minSavingsPercent": 15,
            },
        )
        assert workloads.sizing(name, spec).returncode == 0
    wait_until(lambda: all(placed_on(workloads, n) == [busy] for n in small), 90, what="placed")
    for name in small:
        blocked = workloads.wait_condition(name, "RightSized", "False", "NoFreeCapacity", 240)
        assert "mig-1g.20gb" in blocked["message"]
    (empty,) = pools.add("part-a", count=2)[1:]  # a second node joins, without pods

    assert pools.partitioning("fleet-a", "part-a", mode="Auto").returncode == 0
    planned = pools.wait_condition("fleet-a", "Partitioned", "LayoutsHoldDemand", 240)
    assert planned["status"] == "True"
    for name in small:
        moved = workloads.wait_condition(name, "RightSized", "True", "RightSized", 240)
        assert "mig-1g.20gb" in moved["message"]
        wait_until(lambda n=name: placed_on(workloads, n) == [empty], 90, what=f"{name} moved")
    # the empty node was re-partitioned (no drain); the busy one never cordoned
    labels = pools.node(empty)["metadata"]["labels"]
    assert labels["nvidia.com/mig.config"].startswith("gpusizer-")
    assert labels["nvidia.com/mig.config.state"] == "success"
    assert labels["nvidia.com/mig-1g.20gb.count"] == "3"
    assert pools.node(busy)["metadata"]["labels"]["nvidia.com/mig.config"] == "all-disabled"
    assert "Repartitioned" in pools.events("fleet-a")

    def freed() -> dict[str, Any] | None:
        summary = pools.status("fleet-a").get("summary") or {}
        return summary if summary.get("gpusNeededNow") == 1 else None

    summary = wait_until(freed, 120, what="the demand held on one GPU")
    assert summary["gpus"] == 16 and summary["gpusFree"] == 15
    assert summary["demand"] == {"h100-80gb/1g.20gb": 3}
    assert not [
        n
        for n in small
        if workloads.pods(n)
        and "nvidia.com/gpu"
        in json.dumps(workloads.pods(n)[0]["spec"]["containers"][0]["resources"]["limits"])
    ]


def test_a_pdb_holds_the_drain_and_a_killed_operator_resumes_it_with_one_drain(
    pools: Pools, workloads: Workloads, operator: Operator
) -> None:
    (node,) = pools.add("part-b")
    for name in ("held", "free"):
        workloads.apply(pinned(deployment_manifest(name, workloads.namespace), "part-b"))
    wait_until(
        lambda: placed_on(workloads, "held") == [node] and placed_on(workloads, "free") == [node],
        90,
        what="both on the node",
    )
    wait_until(lambda: workloads.ready("held") == 1, 60, what="held ready")
    budget = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "held", "namespace": workloads.namespace},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "held"}}},
    }
    workloads.apply(budget)
    wait_until(
        lambda: (
            workloads.cluster.kubectl_json("get", "pdb", "held", "-n", workloads.namespace)
            .get("status", {})
            .get("currentHealthy")
            == 1
        ),
        60,
        what="the budget counting the held pod",
    )
    # a workload waiting for a slice no node has
    wants = deployment_manifest("wants", workloads.namespace, resource="nvidia.com/mig-1g.20gb")
    workloads.apply(pinned(wants, "part-b"))
    held_pod = workloads.pods("held")[0]["metadata"]["name"]
    changes, stop = record_node_changes(workloads.cluster, node)
    try:
        assert pools.partitioning("fleet-b", "part-b", mode="Auto").returncode == 0
        blocked = pools.wait_condition("fleet-b", "Partitioned", "DrainBlocked", 120)
        assert held_pod in blocked["message"] and "disruption budget" in blocked["message"]
        assert "DrainBlocked" in pools.events("fleet-b")
        held_key = f"{workloads.namespace}/{held_pod}"
        wait_until(
            lambda: pools.status("fleet-b")["nodes"][0]["podsToMove"] == [held_key],
            30,
            what="only the held pod left to move",
        )
        assert pools.status("fleet-b")["nodes"][0]["step"] == "Draining"

        operator.stop(signal.SIGKILL)  # mid-drain
        operator.start()
        # nothing was forced, and the new process carries the same drain on
        assert workloads.pods("held")[0]["metadata"]["name"] == held_pod
        assert pools.node(node)["spec"].get("unschedulable") is True
        workloads.cluster.kubectl("delete", "pdb", "held", "-n", workloads.namespace)
        pools.wait_condition("fleet-b", "Partitioned", "LayoutsHoldDemand", 180)
        wait_until(lambda: changes[-1][0] is False, 30, what="the uncordon seen by the watch")
        wait_until(lambda: placed_on(workloads, "wants") == [node], 60, what="wants placed")
    finally:
        stop()
    target = pools.node(node)["metadata"]["labels"]["nvidia.com/mig.config"]
    assert target.startswith("gpusizer-")
    # one drain: cordoned once, the label set once, uncordoned once at the end
    assert changes == [
        (False, "all-disabled"),
        (True, "all-disabled"),
        (True, target),
        (False, target),
    ], changes
    assert pools.events("fleet-b").count("RepartitionStarted") == 1
    wait_until(lambda: workloads.ready("held") == 1, 90, what="held back on its node")


def test_mig_manager_failure_is_rolled_back_and_uncordoned(
    pools: Pools, workloads: Workloads
) -> None:
    # a process outside Kubernetes holds the GPUs: mig-manager fails the node
    (node,) = pools.add("part-c", annotations={"gpusim.gpusizer.io/host-gpu-clients": "1"})
    wants = deployment_manifest("wants", workloads.namespace, resource="nvidia.com/mig-1g.20gb")
    workloads.apply(pinned(wants, "part-c"))
    changes, stop = record_node_changes(workloads.cluster, node)
    try:
        assert pools.partitioning("fleet-c", "part-c", mode="Auto").returncode == 0
        failed = pools.wait_condition("fleet-c", "Partitioned", "MigConfigFailed", 120)
        wait_until(lambda: changes[-1][0] is False, 30, what="the uncordon seen by the watch")
    finally:
        stop()
    assert failed["status"] == "False" and node in failed["message"]
    assert "reported failed" in failed["message"]
    obj = pools.node(node)
    assert not obj["spec"].get("unschedulable")
    labels = obj["metadata"]["labels"]
    assert labels["nvidia.com/mig.config"] == "all-disabled"
    assert labels["nvidia.com/mig.config.state"] == "success"
    assert "nvidia.com/gpu" in obj["status"]["allocatable"]
    target = changes[2][1]
    assert target.startswith("gpusizer-")
    assert changes == [
        (False, "all-disabled"),
        (True, "all-disabled"),  # cordoned
        (True, target),  # mig-manager asked, and failed
        (True, "all-disabled"),  # the previous config restored
        (False, "all-disabled"),  # uncordoned
    ], changes
    assert "RepartitionRolledBack" in pools.events("fleet-c")
    assert placed_on(workloads, "wants") == []
    plan = pools.status("fleet-c")["nodes"][0]
    assert "held until" in plan["reason"], plan


def not_kubernetes_own(marks: dict[str, str] | None) -> dict[str, str]:
    """A node's labels or annotations but those Kubernetes' own controllers add in their time
    (`beta.kubernetes.io/arch`, `node.alpha.kubernetes.io/ttl`): what a partitioner could
    have written."""
    return {
        key: value
        for key, value in (marks or {}).items()
        if not key.partition("/")[0].endswith("kubernetes.io")
    }


def test_recommend_changes_nothing(pools: Pools, workloads: Workloads) -> None:
    (node,) = pools.add("part-d")
    wants = deployment_manifest("wants", workloads.namespace, resource="nvidia.com/mig-3g.40gb")
    workloads.apply(pinned(wants, "part-d"))
    before_node = pools.node(node)
    before_config = workloads.cluster.kubectl_json(
        "get", "configmap", MIG_CONFIG_MAP, "-n", MIG_NAMESPACE
    )
    assert pools.partitioning("fleet-d", "part-d", mode="Recommend").returncode == 0
    pending = pools.wait_condition("fleet-d", "Partitioned", "PlanPending", 60)
    assert node in pending["message"]
    plan = pools.status("fleet-d")["nodes"][0]
    assert plan["step"] == "Planned" and plan["proposedLayout"][0] == "3g.40gb"
    assert plan["slicesGained"] == {"3g.40gb": 1} and plan["podsToMove"] == []
    assert pools.condition("fleet-d", "Ready")["reason"] == "RecommendOnly"
    after_node = pools.node(node)
    for key in ("labels", "annotations"):
        assert not_kubernetes_own(after_node["metadata"].get(key)) == not_kubernetes_own(
            before_node["metadata"].get(key)
        )
    assert after_node["spec"] == before_node["spec"]
    after_config = workloads.cluster.kubectl_json(
        "get", "configmap", MIG_CONFIG_MAP, "-n", MIG_NAMESPACE
    )
    assert after_config["data"] == before_config["data"]
    assert placed_on(workloads, "wants") == []


def test_bad_input_is_refused_or_moves_nothing(pools: Pools, workloads: Workloads) -> None:
    refused = pools.partitioning("broken", "part-e", mode="Auto", spareSlices={"3g": 1})
    assert refused.returncode != 0 and "spareSlices" in refused.stderr
    pools.partitionings.remove("broken")
    # two GPUPartitionings select the node it will be: neither may move anything on it
    assert pools.partitioning("fleet-e", "part-e", mode="Auto").returncode == 0
    other = {
        "apiVersion": "gpusizer.io/v1alpha1",
        "kind": "GPUPartitioning",
        "metadata": {"name": "fleet-e-too"},
        "spec": {"nodeSelector": {"kubernetes.io/hostname": "part-e-0"}, "mode": "Auto"},
    }
    pools.partitionings.append("fleet-e-too")
    workloads.cluster.kubectl("apply", "-f", "-", stdin=json.dumps(other))
    (node,) = pools.add("part-e")
    wants = deployment_manifest("wants", workloads.namespace, resource="nvidia.com/mig-3g.40gb")
    workloads.apply(pinned(wants, "part-e"))
    for name in ("fleet-e", "fleet-e-too"):
        ready = pools.wait_condition(name, "Ready", "NodeSelectedTwice", 60)
        assert node in ready["message"]
    assert "PartitioningBlocked" in pools.events("fleet-e")
    wait_until(
        lambda: pools.status("fleet-e")["summary"]["demand"] == {"h100-80gb/3g.40gb": 1},
        30,
        what="the pending pod counted",
    )
    assert not pools.node(node)["spec"].get("unschedulable")
    assert pools.node(node)["metadata"]["labels"]["nvidia.com/mig.config"] == "all-disabled"
