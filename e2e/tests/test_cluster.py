"""The local GPU cluster itself: control plane, GPU node pools, kwok pod stages, Prometheus."""

from __future__ import annotations

import json
import os
import signal
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from .conftest import REPO, Cluster, run_script, wait_until

pytestmark = pytest.mark.e2e

NODEPOOLS = REPO / "e2e" / "cluster" / "nodepools.yaml"


def http_get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.status, resp.read().decode()


def condition(obj: dict[str, Any], kind: str) -> str | None:
    for c in obj.get("status", {}).get("conditions") or []:
        if c["type"] == kind:
            return str(c["status"])
    return None


def deployment(name: str, *, limits: dict[str, str] | None = None, **spec: Any) -> str:
    container: dict[str, Any] = {"name": "main", "image": "registry.example/fake:1"}
    if limits:
        container["resources"] = {"limits": limits}
    doc = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [container], **spec},
            },
        },
    }
    return yaml.safe_dump(doc)


def pods_of(cluster: Cluster, app: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cluster.kubectl_json(
        "get", "pods", "-n", "default", "-l", f"app={app}"
    )["items"]
    return items


def test_server_version_is_1_36(cluster: Cluster) -> None:
    version = cluster.kubectl_json("version")["serverVersion"]
    assert version["gitVersion"].startswith("v1.36."), version
    assert (version["major"], version["minor"]) == ("1", "36")


def test_default_namespace_and_service_account(cluster: Cluster) -> None:
    sa = cluster.kubectl_json("get", "serviceaccount", "default", "-n", "default")
    assert sa["metadata"]["name"] == "default"


def test_service_account_token_works(cluster: Cluster, tmp_path: Path) -> None:
    """TokenRequest works: the operator can run with a `kubectl create token` token."""
    token = cluster.kubectl("create", "token", "default", "-n", "default").stdout.strip()
    assert token.count(".") == 2
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    kubeconfig = tmp_path / "token.kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": admin["clusters"],
                "users": [{"name": "sa", "user": {"token": token}}],
                "contexts": [
                    {
                        "name": "sa",
                        "context": {"cluster": admin["clusters"][0]["name"], "user": "sa"},
                    }
                ],
                "current-context": "sa",
            }
        )
    )
    who = cluster.kubectl("auth", "whoami", "-o", "json", kubeconfig=kubeconfig)
    user = json.loads(who.stdout)["status"]["userInfo"]
    assert user["username"] == "system:serviceaccount:default:default"


def test_operator_identity_is_not_cluster_admin(cluster: Cluster) -> None:
    can = cluster.kubectl(
        "auth", "can-i", "list", "pods", "-A", kubeconfig=cluster.operator_kubeconfig, check=False
    )
    assert can.stdout.strip() == "no", can


def test_every_pool_has_its_nodes_with_gfd_labels_and_allocatable(cluster: Cluster) -> None:
    pools = yaml.safe_load(NODEPOOLS.read_text())["pools"]
    nodes = {n["metadata"]["name"]: n for n in cluster.kubectl_json("get", "nodes")["items"]}
    for pool in pools:
        for i in range(pool["count"]):
            name = f"{pool['name']}-{i}"
            assert name in nodes, f"node {name} of pool {pool['name']} is missing"
            node = nodes[name]
            labels = node["metadata"]["labels"]
            expected = {
                "kubernetes.io/hostname": name,
                "type": "kwok",
                "nvidia.com/gpu.product": pool["product"],
                "nvidia.com/gpu.family": pool["family"],
                "nvidia.com/gpu.count": str(pool["gpuCount"]),
                "nvidia.com/gpu.memory": str(pool["gpuMemoryMiB"]),
                "nvidia.com/mig.capable": str(pool["migCapable"]).lower(),
                "nvidia.com/mig.strategy": pool["migStrategy"],
                "nvidia.com/gpu.replicas": "1",
                "nvidia.com/gpu.sharing-strategy": "none",
                **pool.get("labels", {}),
            }
            for key, value in expected.items():
                assert labels.get(key) == value, f"{name}: label {key}={labels.get(key)!r}"
            assert node["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
            assert node["spec"]["providerID"] == f"kwok://{name}"
            allocatable = node["status"]["allocatable"]
            capacity = node["status"]["capacity"]
            for key, value in pool["allocatable"].items():
                assert allocatable.get(key) == str(value), f"{name}: allocatable {key}"
                assert capacity.get(key) == str(value), f"{name}: capacity {key}"
            assert condition(node, "Ready") == "True", f"{name} not Ready"


def test_h100_mig_pool_is_mixed_all_balanced(cluster: Cluster) -> None:
    node = cluster.kubectl_json("get", "node", "h100-mig-0")
    labels, alloc = node["metadata"]["labels"], node["status"]["allocatable"]
    assert labels["nvidia.com/mig.config"] == "all-balanced"
    assert labels["nvidia.com/mig.config.state"] == "success"
    assert labels["nvidia.com/mig.strategy"] == "mixed"
    assert alloc["nvidia.com/mig-1g.10gb"] == "16"
    assert alloc["nvidia.com/mig-2g.20gb"] == "8"
    assert alloc["nvidia.com/mig-3g.40gb"] == "8"
    assert labels["nvidia.com/mig-3g.40gb.count"] == "8"


def test_mig_pod_is_scheduled_on_h100_mig_and_running_not_ready(cluster: Cluster) -> None:
    from kubernetes import client, watch

    name = f"mig-{uuid.uuid4().hex[:6]}"
    core = client.CoreV1Api(cluster.api_client())
    w = watch.Watch()
    cluster.kubectl(
        "apply",
        "-f",
        "-",
        stdin=deployment(
            name,
            limits={"nvidia.com/mig-3g.40gb": "1"},
            nodeSelector={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
        ),
    )
    try:
        # kwok sets phase Running and Ready=False in one status write: the first Running
        # state seen must be not Ready (the GPU emulator, if any, may make it Ready later).
        first_running = None
        for event in w.stream(
            core.list_namespaced_pod, "default", label_selector=f"app={name}", timeout_seconds=90
        ):
            pod = event["object"]
            if pod.status and pod.status.phase == "Running":
                first_running = pod
                w.stop()
        assert first_running is not None, "the MIG pod never became Running"
        pod = first_running
        assert pod.spec.node_name.startswith("h100-mig-"), pod.spec.node_name
        conditions = {c.type: c.status for c in pod.status.conditions or []}
        assert conditions.get("PodScheduled") == "True"
        assert conditions.get("Ready") == "False", conditions
        assert conditions.get("ContainersReady") == "False", conditions
        (status,) = pod.status.container_statuses
        assert status.started is True
        assert status.ready is False
        assert status.state.running is not None
        assert pod.status.pod_ip
    finally:
        cluster.kubectl("delete", "deployment", name, "-n", "default", "--wait=false")
    wait_until(lambda: not pods_of(cluster, name), timeout=60, what="the MIG pod to be deleted")


def test_whole_gpu_pod_lands_on_l4_and_is_not_ready(cluster: Cluster) -> None:
    name = f"l4-{uuid.uuid4().hex[:6]}"
    cluster.kubectl(
        "apply",
        "-f",
        "-",
        stdin=deployment(
            name,
            limits={"nvidia.com/gpu": "1"},
            nodeSelector={"nvidia.com/gpu.product": "NVIDIA-L4"},
        ),
    )
    try:
        pod = wait_until(
            lambda: next(
                (p for p in pods_of(cluster, name) if p["status"].get("phase") == "Running"), None
            ),
            timeout=90,
            what="the L4 pod to be Running",
        )
        assert pod["spec"]["nodeName"].startswith("l4-")
        assert pod["status"]["containerStatuses"][0]["started"] is True
    finally:
        cluster.kubectl("delete", "deployment", name, "-n", "default", "--wait=false")


def test_status_patch_repartitions_a_node_for_the_scheduler(cluster: Cluster) -> None:
    """What the MIG manager emulator does: patch node status; the scheduler follows it."""
    node = "h100-mig-1"
    original = cluster.kubectl_json("get", "node", node)["status"]["allocatable"]

    def patch(extra: dict[str, str | None]) -> None:
        body = {"status": {"allocatable": extra, "capacity": extra}}
        cluster.kubectl(
            "patch", "node", node, "--subresource=status", "--type=merge", "-p", json.dumps(body)
        )

    name = f"mig7-{uuid.uuid4().hex[:6]}"
    patch({"nvidia.com/mig-7g.80gb": "1"})
    try:
        cluster.kubectl(
            "apply", "-f", "-", stdin=deployment(name, limits={"nvidia.com/mig-7g.80gb": "1"})
        )
        pod = wait_until(
            lambda: next((p for p in pods_of(cluster, name) if p["spec"].get("nodeName")), None),
            timeout=60,
            what="the 7g.80gb pod to be scheduled",
        )
        assert pod["spec"]["nodeName"] == node
    finally:
        cluster.kubectl("delete", "deployment", name, "-n", "default", "--wait=false")
        patch({"nvidia.com/mig-7g.80gb": None})
    restored = cluster.kubectl_json("get", "node", node)["status"]["allocatable"]
    assert restored == original


def test_pod_that_does_not_fit_stays_pending(cluster: Cluster) -> None:
    """The real scheduler counts extended resources: 9 whole GPUs fit on no node."""
    name = f"big-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("apply", "-f", "-", stdin=deployment(name, limits={"nvidia.com/gpu": "9"}))
    try:
        pod = wait_until(
            lambda: next(
                (p for p in pods_of(cluster, name) if condition(p, "PodScheduled") == "False"), None
            ),
            timeout=60,
            what="the scheduler to report the pod unschedulable",
        )
        assert pod["status"]["phase"] == "Pending"
        assert "nvidia.com/gpu" in json.dumps(pod["status"]["conditions"])
    finally:
        cluster.kubectl("delete", "deployment", name, "-n", "default", "--wait=false")


def test_non_gpu_deployment_becomes_ready(cluster: Cluster) -> None:
    name = f"web-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("apply", "-f", "-", stdin=deployment(name))
    try:
        wait_until(
            lambda: (
                cluster.kubectl_json("get", "deployment", name, "-n", "default")["status"].get(
                    "readyReplicas"
                )
                == 1
            ),
            timeout=90,
            what="the non-GPU deployment to be Ready",
        )
        (pod,) = pods_of(cluster, name)
        assert condition(pod, "Ready") == "True"
        assert pod["status"]["containerStatuses"][0]["ready"] is True
    finally:
        cluster.kubectl("delete", "deployment", name, "-n", "default", "--wait=false")


def test_prometheus_is_ready_and_reads_file_sd_targets(cluster: Cluster) -> None:
    status, _ = http_get(f"{cluster.prometheus_url}/-/ready")
    assert status == 200
    host_port = cluster.prometheus_url.removeprefix("http://")
    path = cluster.register_scrape_target("selftest", [host_port], job="selftest")
    try:

        def selftest_up() -> bool:
            _, body = http_get(f"{cluster.prometheus_url}/api/v1/targets?state=active")
            targets = json.loads(body)["data"]["activeTargets"]
            return any(
                t["labels"].get("job") == "selftest" and t["health"] == "up" for t in targets
            )

        wait_until(selftest_up, timeout=60, interval=0.5, what="the file_sd target to be up")
    finally:
        path.unlink()


def test_env_file_interface(cluster: Cluster) -> None:
    env = cluster.env
    for key in ("KUBECONFIG", "PROMETHEUS_URL", "GPUSIM_URL", "PROMETHEUS_PID", "CLUSTER_PID"):
        assert key in env, key
    assert Path(env["KUBECONFIG"]).is_file()
    assert env["PROMETHEUS_URL"].startswith("http://127.0.0.1:")
    assert env["GPUSIM_URL"].startswith("http://127.0.0.1:")


def test_cluster_up_again_is_harmless(cluster: Cluster) -> None:
    before = (cluster.state_dir / "env").read_text()
    again = run_script("cluster-up.sh", cluster.state_dir)
    assert again.returncode == 0, again.stderr
    assert "cluster already running" in again.stdout
    assert (cluster.state_dir / "env").read_text() == before
    assert cluster.kubectl("get", "nodes").returncode == 0


def test_up_twice_down_twice_on_an_isolated_cluster(tmp_path: Path) -> None:
    """A second, small cluster next to the session's: up, up, down, down."""
    pools = tmp_path / "pools.yaml"
    pools.write_text(
        yaml.safe_dump(
            {
                "pools": [
                    {
                        "name": "tiny",
                        "count": 1,
                        "product": "NVIDIA-L4",
                        "family": "ada-lovelace",
                        "gpuCount": 1,
                        "gpuMemoryMiB": 23034,
                        "migCapable": False,
                        "migStrategy": "none",
                        "allocatable": {
                            "cpu": "8",
                            "memory": "32Gi",
                            "pods": "110",
                            "nvidia.com/gpu": "1",
                        },
                    }
                ]
            }
        )
    )
    state = tmp_path / "state"
    extra = {"GPUSIZER_NODEPOOLS": str(pools), "GPUSIZER_GPUSIM": "0"}
    first = run_script("cluster-up.sh", state, **extra)
    try:
        assert first.returncode == 0, first.stderr
        env = (state / "env").read_text()
        second = run_script("cluster-up.sh", state, **extra)
        assert second.returncode == 0, second.stderr
        assert "cluster already running" in second.stdout
        assert (state / "env").read_text() == env
        pids = [int(line.split()[1]) for line in (state / "pids").read_text().splitlines()]
    finally:
        down = run_script("cluster-down.sh", state)
    assert down.returncode == 0, down.stderr
    assert "cluster stopped" in down.stdout
    assert not state.exists()
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or _is_zombie(pid), f"pid {pid} survived"
    again = run_script("cluster-down.sh", state)
    assert again.returncode == 0
    assert "no cluster running" in again.stdout


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


def component_pids(cluster: Cluster) -> dict[str, int]:
    lines = (cluster.state_dir / "pids").read_text().split("\n")
    return {name: int(pid) for name, _, pid in (line.partition(" ") for line in lines if line)}


def test_the_audit_log_has_the_operators_writes_and_nothing_else(cluster: Cluster) -> None:
    """kube-apiserver logs what the gpusizer operator's identities do (e2e/cluster/audit.go),
    so a test can judge the operator's writes from outside it: a scale by the operator is
    there, with its request and answer; the same scale by an admin is not."""
    name = f"audited-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("apply", "-f", "-", stdin=deployment(name))
    grant = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": name, "namespace": "default"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
        "subjects": [
            {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "gpusizer-operator"}
        ],
    }
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(grant))
    try:
        cluster.kubectl("scale", "deployment", name, "--replicas=2")
        wait_until(
            lambda: (
                cluster.kubectl(
                    "scale",
                    "deployment",
                    name,
                    "--replicas=3",
                    kubeconfig=cluster.operator_kubeconfig,
                    check=False,
                ).returncode
                == 0
            ),
            30,
            what="the operator's identity may scale",
        )

        def audited() -> list[dict[str, Any]]:
            lines = (cluster.state_dir / "logs" / "audit.log").read_text().splitlines()
            events = [json.loads(line) for line in lines]
            return [e for e in events if (e.get("objectRef") or {}).get("name") == name]

        found = wait_until(audited, 30, what="the operator's scale in the audit log")
        assert {e["user"]["username"] for e in found} == {"gpusizer-operator"}
        scales = [e for e in found if e["objectRef"].get("subresource") == "scale"]
        assert [e["responseObject"]["spec"]["replicas"] for e in scales] == [3], scales
        assert scales[0]["requestObject"], "the request is logged in full"
    finally:
        cluster.kubectl("delete", "rolebinding,deployment", name, "-n", "default", check=False)


def test_a_component_asked_to_restart_is_started_again(cluster: Cluster) -> None:
    """A component that exits while DIR/restart/<name> exists is started again with the same
    flags and ports, instead of the cluster stopping (the soak restarts kube-apiserver so)."""
    before = component_pids(cluster)
    marker = cluster.state_dir / "restart" / "kube-apiserver"
    marker.write_text("test\n")
    os.kill(before["kube-apiserver"], signal.SIGKILL)
    after = wait_until(
        lambda: (
            (pids := component_pids(cluster))["kube-apiserver"] != before["kube-apiserver"] and pids
        ),
        60,
        what="kube-apiserver started again",
    )
    assert not marker.exists(), "the request is used up"
    assert {k: v for k, v in after.items() if k != "kube-apiserver"} == {
        k: v for k, v in before.items() if k != "kube-apiserver"
    }
    wait_until(
        lambda: cluster.kubectl("get", "--raw", "/readyz", check=False).returncode == 0,
        120,
        what="the API server ready again, on the same port",
    )
    # authorization is ready too: what every authenticated user may do is allowed again
    wait_until(
        lambda: (
            cluster.kubectl(
                "auth",
                "can-i",
                "create",
                "selfsubjectaccessreviews.authorization.k8s.io",
                kubeconfig=cluster.operator_kubeconfig,
                check=False,
            ).stdout.strip()
            == "yes"
        ),
        60,
        what="RBAC answering the operator's identity",
    )
