"""The operator as a real pod: `helm install` of the chart on a real node of the local cluster.

e2e/scripts/node-up.sh joins one real kubelet (containerd v2, runc) beside the kwok GPU
nodes, tainted so that only pods tolerating it run there. The chart installs the operator
there from the image of `make image`: the kubelet mounts its ServiceAccount token and the
catalog ConfigMap, probes /healthz and restarts it; the operator sizes a workload on the kwok
GPU nodes, survives `kubectl delete pod` with nothing lost, and `helm uninstall` leaves
nothing running. The pod uses the node's network (the chart's hostNetwork): there is no
kube-proxy, so KUBERNETES_SERVICE_HOST/PORT point at the API server's loopback address.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from gpusizer.timefmt import parse_time

from e2e.tests.conftest import REPO, SCRIPTS, Cluster, read_env_file, wait_until
from e2e.tests.image_support import CONTAINERS_CONF, delete_sizings_namespace
from e2e.tests.operator_support import Workloads, sizing_spec, stop_operators
from e2e.tests.test_install import Helm, fresh_namespace, get, wait_gone
from tests.support import free_port

CHART = REPO / "charts" / "gpusizer"
RELEASE = NAMESPACE = "gpusizer-node"
TAINT = "gpusizer.io/real-node"


@dataclass
class RealNode:
    env: dict[str, str]

    @property
    def name(self) -> str:
        return self.env["NODE_NAME"]

    def ctr_command(self, *args: str) -> list[str]:
        return [self.env["CTR"], "--address", self.env["CONTAINERD_ADDRESS"], "-n", "k8s.io", *args]

    def ctr(self, *args: str) -> str:
        return subprocess.run(
            self.ctr_command(*args), text=True, capture_output=True, timeout=300, check=True
        ).stdout

    def load_image(self, image: str) -> None:
        """The image from podman's store into containerd's, as a registry pull would."""
        env = {**os.environ, "CONTAINERS_CONF": str(CONTAINERS_CONF)}
        save = subprocess.Popen(
            ["podman", "save", "--quiet", "--format", "docker-archive", image],
            stdout=subprocess.PIPE,
            env=env,
        )
        assert save.stdout is not None
        try:
            subprocess.run(
                self.ctr_command("images", "import", "-"),
                stdin=save.stdout,
                capture_output=True,
                timeout=300,
                check=True,
            )
        finally:
            save.stdout.close()
            assert save.wait(timeout=60) == 0, "podman save failed"
        assert image in self.ctr("images", "ls", "-q").split()

    def running_tasks(self) -> list[str]:
        lines = self.ctr("tasks", "ls").splitlines()[1:]
        return [line for line in lines if "RUNNING" in line]

    def pod_logs(self) -> str:
        logs = sorted(Path(self.env["POD_LOGS"]).glob("*/*/*.log"))
        return "\n".join(f"--- {p}\n" + "\n".join(p.read_text().splitlines()[-60:]) for p in logs)


@pytest.fixture(scope="module")
def real_node(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealNode]:
    node_dir = tmp_path_factory.mktemp("node")
    env = {
        **os.environ,
        "GPUSIZER_CLUSTER_DIR": str(cluster.state_dir),
        "GPUSIZER_NODE_DIR": str(node_dir),
    }

    def script(name: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(SCRIPTS / name)], env=env, text=True, capture_output=True, timeout=1800
        )

    up = script("node-up.sh")
    if up.returncode != 0:
        script("node-down.sh")
        pytest.fail(f"node-up.sh failed ({up.returncode}):\n{up.stdout}\n{up.stderr}")
    try:
        yield RealNode(read_env_file(node_dir / "env"))
    finally:
        down = script("node-down.sh")
        assert down.returncode == 0, f"node-down.sh failed:\n{down.stdout}\n{down.stderr}"


@pytest.fixture(scope="module")
def helm(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(cluster, tmp_path_factory.mktemp("helm"))


def operator_pods(cluster: Cluster) -> list[dict[str, Any]]:
    pods = cluster.kubectl_json(
        "get", "pods", "-n", NAMESPACE, "-l", f"app.kubernetes.io/instance={RELEASE}"
    )["items"]
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def ready_pod(cluster: Cluster) -> dict[str, Any] | None:
    """The operator's one pod, when the kubelet's readiness probe passes."""
    pods = operator_pods(cluster)
    if len(pods) != 1:
        return None
    conditions = {c["type"]: c["status"] for c in pods[0]["status"].get("conditions", [])}
    return pods[0] if conditions.get("Ready") == "True" else None


def replaced_pod(cluster: Cluster, old: dict[str, Any]) -> dict[str, Any] | None:
    pod = ready_pod(cluster)
    return pod if pod and pod["metadata"]["uid"] != old["metadata"]["uid"] else None


def observed_since(workloads: Workloads, name: str, since: str) -> dict[str, Any] | None:
    """The status once it holds an observation made at or after ``since`` (RFC 3339)."""
    status = workloads.status(name)
    observed = parse_time((status.get("observation") or {}).get("time"))
    start = parse_time(since)
    assert start is not None, since
    return status if observed is not None and observed >= start else None


def test_the_chart_runs_the_operator_as_a_real_pod(
    cluster: Cluster, real_node: RealNode, helm: Helm, image: str
) -> None:
    stopped = stop_operators()  # the chart's operator is the only one acting
    workloads = Workloads(cluster, "e2e-real-node")
    fresh_namespace(cluster, NAMESPACE)
    real_node.load_image(image)
    repository, tag = image.rsplit(":", 1)
    api = urlsplit(cluster.apiserver_url)
    in_cluster = [
        {"name": "KUBERNETES_SERVICE_HOST", "value": api.hostname},
        {"name": "KUBERNETES_SERVICE_PORT", "value": str(api.port)},
    ]
    release_objects = [
        ("deployment", RELEASE, "-n", NAMESPACE),
        ("serviceaccount", RELEASE, "-n", NAMESPACE),
        ("configmap", f"{RELEASE}-catalog", "-n", NAMESPACE),
        ("service", f"{RELEASE}-metrics", "-n", NAMESPACE),
        ("clusterrole", RELEASE),
        ("clusterrolebinding", RELEASE),
    ]
    try:
        helm(
            "upgrade", "--install", RELEASE, str(CHART), "--namespace", NAMESPACE,
            "--wait", "--timeout", "180s",
            "--set", f"image.repository={repository}", "--set", f"image.tag={tag}",
            "--set", f"prometheus.url={cluster.prometheus_url}", "--set", "syncPeriodSeconds=2",
            "--set", "hostNetwork=true",
            # the activator's pods would need a pod network, which this node has not
            # (test_activator.py runs them as host processes at their pods' IPs)
            "--set", "activator.enabled=false",
            "--set", f"metrics.port={free_port()}", "--set", f"health.port={free_port()}",
            "--set-json", f"extraEnv={json.dumps(in_cluster)}",
            "--set-json", f"nodeSelector={json.dumps({TAINT: 'true'})}",
            "--set-json", f"tolerations={json.dumps([{'key': TAINT, 'operator': 'Exists'}])}",
        )  # fmt: skip
        pod = wait_until(lambda: ready_pod(cluster), 60, what="the operator's pod Ready")
        assert pod["spec"]["nodeName"] == real_node.name
        (status,) = pod["status"]["containerStatuses"]
        assert status["ready"] and status["restartCount"] == 0, status
        assert status["imageID"], "containerd ran the image"
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        assert any("projected" in v for v in volumes.values()), "the ServiceAccount token"
        assert volumes["catalog"]["configMap"]["name"] == f"{RELEASE}-catalog"

        # it sizes a workload on the kwok GPU nodes
        workloads.deployment("chat", replicas=1, capacity_rps=10)
        workloads.busy("chat", 1)
        workloads.load("chat", 21)  # 21 / (10 x 0.7): 3 replicas
        window = {"stabilizationWindowSeconds": 600, "maxReplicasPerStep": 8, "periodSeconds": 2}
        spec = sizing_spec("chat", replicas={"scaleDown": window})
        assert workloads.sizing("chat", spec).returncode == 0
        workloads.wait_replicas("chat", lambda n: n >= 3, 120, "scaled up by the pod")
        # then little load: the scale-down window holds the replicas
        workloads.load("chat", 1)
        workloads.wait_condition("chat", "ScalingLimited", "True", "StabilizationWindow", 120)
        before = workloads.status("chat")
        replicas = workloads.replicas("chat")

        # a restart loses nothing: the new pod decides, inside the same window, changing nothing
        cluster.kubectl("delete", "pod", pod["metadata"]["name"], "-n", NAMESPACE)
        new_pod = wait_until(
            lambda: replaced_pod(cluster, pod), 120, what="a new operator pod Ready"
        )
        after = wait_until(
            lambda: observed_since(workloads, "chat", new_pod["status"]["startTime"]),
            60,
            what="a decision by the new pod",
        )
        assert workloads.replicas("chat") == replicas, "the restart changed the replicas"
        assert after["lastScaleTime"] == before["lastScaleTime"]
        limited = workloads.condition("chat", "ScalingLimited")
        assert limited and limited["reason"] == "StabilizationWindow", limited

        helm("uninstall", RELEASE, "--namespace", NAMESPACE, "--wait", "--timeout", "120s")
        for obj in release_objects:
            wait_gone(cluster, *obj, timeout=60)
        wait_until(lambda: not operator_pods(cluster), 60, what="the operator's pod gone")
        wait_until(lambda: not real_node.running_tasks(), 60, what="nothing left running")
        assert get(cluster, "workloadsizing", "chat", "-n", workloads.namespace)
        assert workloads.replicas("chat") == replicas, "the uninstall changed the workload"
    except BaseException:
        print(real_node.pod_logs())
        raise
    finally:
        helm("uninstall", RELEASE, "--namespace", NAMESPACE, "--ignore-not-found", check=False)
        delete_sizings_namespace(cluster, workloads.namespace, operator_runs=False)
        cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)
        for operator in stopped:
            operator.start()
