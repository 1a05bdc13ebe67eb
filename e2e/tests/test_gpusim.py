"""The GPU emulator against the real local cluster and Prometheus."""

from __future__ import annotations

import json
import time
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from .conftest import Cluster, wait_until
from .operator_support import deployment_manifest

pytestmark = pytest.mark.e2e


def http_json(method: str, url: str, body: Any = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def pods(cluster: Cluster, namespace: str, app: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = cluster.kubectl_json(
        "get", "pods", "-n", namespace, "-l", f"app={app}"
    )["items"]
    return found


def ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    name = f"gpusim-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", name)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def test_replica_becomes_ready_after_startup_and_serves_series(
    cluster: Cluster, namespace: str
) -> None:
    chat = deployment_manifest(
        "chat", namespace, startup_seconds=8, capacity_rps=10, memory_mib=20000
    )
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(chat))
    running = wait_until(
        lambda: [
            p for p in pods(cluster, namespace, "chat") if p["status"].get("phase") == "Running"
        ],
        timeout=60,
        what="the GPU pod to run",
    )[0]
    seen_running = time.monotonic()
    assert not ready(running)
    started = running["status"]["containerStatuses"][0]["state"]["running"]["startedAt"]
    wait_until(
        lambda: all(ready(p) for p in pods(cluster, namespace, "chat")),
        timeout=60,
        interval=0.2,
        what="the GPU pod to become Ready",
    )
    waited = time.monotonic() - seen_running
    # startedAt has one-second precision, and Running was seen some time after it
    assert waited > 8 - 2 - 1, (started, waited)
    pod = pods(cluster, namespace, "chat")[0]
    assert pod["status"]["containerStatuses"][0]["ready"] is True

    base = f"{cluster.gpusim_url}/v1/workloads/{namespace}/chat"
    http_json("PUT", f"{base}/load", {"requestsPerSecond": 6})
    name = pod["metadata"]["name"]
    selector = f'namespace="{namespace}",pod="{name}"'

    def util() -> list[dict[str, Any]]:
        rows = cluster.promql(f"DCGM_FI_DEV_GPU_UTIL{{{selector}}}")
        return [r for r in rows if r["value"][1] == "60"]

    [row] = wait_until(util, timeout=60, interval=1, what="GPU_UTIL 60 % in Prometheus")
    labels = row["metric"]
    assert labels["modelName"] == "NVIDIA H100 80GB HBM3" and labels["container"] == "vllm"
    assert labels["Hostname"] == pod["spec"]["nodeName"]
    [used] = cluster.promql(f"DCGM_FI_DEV_FB_USED{{{selector}}}")
    assert used["value"][1] == "20000"
    vllm = wait_until(
        lambda: cluster.promql(f'vllm:num_requests_running{{namespace="{namespace}"}}'),
        timeout=60,
        interval=1,
        what="vLLM series in Prometheus",
    )
    assert vllm[0]["metric"]["model_name"] == "chat"
    described = http_json("GET", base)
    assert described["readyReplicas"] == 1 and described["pods"][0]["slice"] == "gpu-h100"


def test_model_too_big_for_its_slice_is_oom_killed(cluster: Cluster, namespace: str) -> None:
    big = deployment_manifest(
        "big", namespace, resource="nvidia.com/mig-1g.10gb", startup_seconds=2, memory_mib=30000
    )
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(big))

    def oom_killed() -> dict[str, Any] | None:
        for pod in pods(cluster, namespace, "big"):
            status = (pod["status"].get("containerStatuses") or [{}])[0]
            terminated = (status.get("lastState") or {}).get("terminated") or {}
            if status.get("restartCount", 0) >= 1 and terminated.get("reason") == "OOMKilled":
                return pod
        return None

    pod = wait_until(oom_killed, timeout=60, interval=0.5, what="an OOMKilled restart")
    assert pod["status"]["containerStatuses"][0]["lastState"]["terminated"]["exitCode"] == 137
    assert not ready(pod)


@pytest.fixture
def idle_h100_node(cluster: Cluster) -> Iterator[str]:
    """An H100 node of the whole-GPU pool, cordoned and free of GPU pods; restored after."""
    nodes = cluster.kubectl_json("get", "nodes", "-l", "gpusizer.io/node-pool=h100")["items"]
    node = sorted(n["metadata"]["name"] for n in nodes)[-1]
    cluster.kubectl("cordon", node)

    def gpu_pods_gone() -> bool:
        listed = cluster.kubectl_json(
            "get", "pods", "-A", "--field-selector", f"spec.nodeName={node}"
        )["items"]
        return not [p for p in listed if "nvidia.com" in json.dumps(p["spec"])]

    wait_until(gpu_pods_gone, timeout=120, what=f"{node} to have no GPU pods")
    yield node
    cluster.kubectl("label", "node", node, "nvidia.com/mig.config=all-disabled", "--overwrite")
    wait_until(
        lambda: node_state(cluster, node)[1].get("nvidia.com/gpu") == "8",
        timeout=60,
        what=f"{node} back to whole GPUs",
    )
    cluster.kubectl("uncordon", node)


def node_state(cluster: Cluster, node: str) -> tuple[dict[str, str], dict[str, str]]:
    obj = cluster.kubectl_json("get", "node", node)
    return obj["metadata"]["labels"], obj["status"]["allocatable"]


def test_mig_repartition(cluster: Cluster, idle_h100_node: str) -> None:
    node = idle_h100_node
    cluster.kubectl("label", "node", node, "nvidia.com/mig.config=all-3g.40gb", "--overwrite")
    wait_until(
        lambda: node_state(cluster, node)[0].get("nvidia.com/mig.config.state") == "pending",
        timeout=30,
        interval=0.2,
        what="state pending",
    )
    labels, allocatable = wait_until(
        lambda: (
            (s := node_state(cluster, node))[0].get("nvidia.com/mig.config.state") == "success"
            and s
        ),
        timeout=60,
        what="state success",
    )
    assert allocatable.get("nvidia.com/mig-3g.40gb") == "16"
    assert "nvidia.com/gpu" not in allocatable
    assert labels["nvidia.com/mig-3g.40gb.count"] == "16"
    assert labels["nvidia.com/mig-3g.40gb.memory"] == "40448"

    def instances() -> list[dict[str, Any]]:
        rows = cluster.promql(
            f'DCGM_FI_PROF_GR_ENGINE_ACTIVE{{Hostname="{node}",GPU_I_PROFILE="3g.40gb"}}'
        )
        return rows if len(rows) == 16 else []

    wait_until(instances, timeout=60, interval=1, what="16 3g.40gb instances in Prometheus")

    cluster.kubectl("label", "node", node, "nvidia.com/mig.config=all-1g.5gb", "--overwrite")
    wait_until(
        lambda: node_state(cluster, node)[0].get("nvidia.com/mig.config.state") == "failed",
        timeout=30,
        what="state failed for a layout an H100 cannot hold",
    )
    events = cluster.kubectl_json(
        "get", "events", "-n", "default", "--field-selector", f"involvedObject.name={node}"
    )["items"]
    assert any(e["reason"] == "MigReconfigureInvalidLayout" for e in events)
