"""Reading real Pod JSON (as kwok and the controllers write it) into the emulator's PodInfo."""

from __future__ import annotations

import copy
from typing import Any

from e2e.gpusim.kube import Obj, PodInfos, pod_info

POD: dict[str, Any] = {
    "metadata": {
        "name": "chat-5c4b9d-9qz2x",
        "namespace": "llm",
        "uid": "u-1",
        "labels": {"app": "chat", "pod-template-hash": "5c4b9d"},
        "annotations": {"gpusim.gpusizer.io/memory-mib": "20000"},
        "ownerReferences": [{"kind": "ReplicaSet", "name": "chat-5c4b9d", "controller": True}],
    },
    "spec": {
        "nodeName": "h100-0",
        "containers": [
            {"name": "sidecar", "resources": {"limits": {"cpu": "1"}}},
            {"name": "vllm", "resources": {"limits": {"nvidia.com/mig-3g.40gb": "1"}}},
        ],
    },
    "status": {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "False"}],
        "containerStatuses": [
            {"name": "sidecar", "ready": True, "restartCount": 0},
            {
                "name": "vllm",
                "ready": False,
                "restartCount": 2,
                "state": {"running": {"startedAt": "2026-01-01T00:00:10+00:00"}},
            },
        ],
    },
}
REPLICASET: Obj = {
    "metadata": {
        "name": "chat-5c4b9d",
        "namespace": "llm",
        "ownerReferences": [{"kind": "Deployment", "name": "chat", "controller": True}],
    }
}
DEPLOYMENT: Obj = {
    "metadata": {
        "name": "chat",
        "namespace": "llm",
        "annotations": {"gpusim.gpusizer.io/memory-mib": "30000", "other": "x"},
    }
}


def lookup(obj: Obj) -> Any:
    return lambda key: (
        obj if key == f"{obj['metadata']['namespace']}/{obj['metadata']['name']}" else None
    )


def never_seen(uid: str) -> float:
    raise AssertionError("startedAt was present")


def test_gpu_pod_through_replicaset_to_deployment() -> None:
    info = pod_info(POD, lookup(REPLICASET), lookup(DEPLOYMENT), never_seen)
    assert info is not None
    assert info.workload == ("llm", "chat")
    assert (info.container, info.resource, info.count) == ("vllm", "nvidia.com/mig-3g.40gb", 1)
    assert info.running_since == 1767225610.0  # 2026-01-01T00:00:10Z
    assert info.restart_count == 2 and not info.ready and not info.terminating
    assert info.node == "h100-0"
    assert info.annotations["gpusim.gpusizer.io/memory-mib"] == "30000"  # the Deployment wins


def test_replicaset_not_cached_yet_uses_the_naming_rule() -> None:
    info = pod_info(POD, lambda key: None, lambda key: None, never_seen)
    assert info is not None and info.workload == ("llm", "chat")
    assert info.annotations["gpusim.gpusizer.io/memory-mib"] == "20000"


def test_states() -> None:
    pod = copy.deepcopy(POD)
    pod["status"]["containerStatuses"][1]["state"] = {"waiting": {}}
    info = pod_info(pod, lookup(REPLICASET), lookup(DEPLOYMENT), lambda uid: 42.0)
    assert info is not None and info.running_since == 42.0  # first seen Running
    pod["status"]["phase"] = "Pending"
    info = pod_info(pod, lookup(REPLICASET), lookup(DEPLOYMENT), lambda uid: 42.0)
    assert info is not None and info.running_since is None
    pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:01:00Z"
    info = pod_info(pod, lookup(REPLICASET), lookup(DEPLOYMENT), lambda uid: 42.0)
    assert info is not None and info.terminating
    bare = copy.deepcopy(POD)
    del bare["metadata"]["ownerReferences"]
    info = pod_info(bare, lookup(REPLICASET), lookup(DEPLOYMENT), never_seen)
    assert info is not None and info.workload == ("llm", "chat-5c4b9d-9qz2x")


def test_pods_without_gpu_limits_are_ignored() -> None:
    pod = copy.deepcopy(POD)
    pod["spec"]["containers"][1]["resources"] = {"requests": {"nvidia.com/gpu": "1"}}
    assert pod_info(pod, lookup(REPLICASET), lookup(DEPLOYMENT), never_seen) is None
    pod["spec"]["containers"][1]["resources"] = {"limits": {"nvidia.com/gpu": "0"}}
    assert pod_info(pod, lookup(REPLICASET), lookup(DEPLOYMENT), never_seen) is None


def test_a_pods_info_is_derived_again_only_when_it_or_an_owner_changed() -> None:
    """The informers replace an object at each event: the same objects, the same PodInfo."""
    owners = {"llm/chat-5c4b9d": REPLICASET, "llm/chat": DEPLOYMENT}
    infos = PodInfos(owners.get, owners.get, never_seen)
    pod = copy.deepcopy(POD)
    first = infos.of([pod])
    assert infos.of([pod])[0] is first[0]
    owners["llm/chat"] = copy.deepcopy(DEPLOYMENT)  # an event of the Deployment: a new object
    owners["llm/chat"]["metadata"]["annotations"]["gpusim.gpusizer.io/memory-mib"] = "40000"
    [changed] = infos.of([pod])
    assert changed.annotations["gpusim.gpusizer.io/memory-mib"] == "40000"
    moved = copy.deepcopy(pod)  # an event of the pod
    moved["spec"]["nodeName"] = "h100-1"
    assert [i.node for i in infos.of([moved])] == ["h100-1"]
    assert infos.of([]) == []
