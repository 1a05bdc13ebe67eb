"""The real cluster behind the emulator: list+watch caches, pod status and node patches."""

from __future__ import annotations

import calendar
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

from e2e.gpusim.cluster import ClusterSnapshot, NodeInfo, PodInfo, Rederived, gpu_limit

log = logging.getLogger(__name__)

Obj = dict[str, Any]
Lookup = Callable[[str], Obj | None]
# The client would otherwise pick JSON Patch, the first type the API lists.
STRATEGIC = "application/strategic-merge-patch+json"
VLLM_PORT = 8000  # vLLM's OpenAI server's default port


def _timestamp(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def _parse_time(value: str | None) -> float | None:
    if not value:
        return None
    return float(calendar.timegm(time.strptime(value[:19], "%Y-%m-%dT%H:%M:%S")))


class _Informer:
    """List, then watch from the list's resourceVersion; re-list when it expires (410)."""

    def __init__(self, name: str, list_fn: Callable[..., Any], api: client.ApiClient) -> None:
        self.name = name
        self._list = list_fn
        self._api = api
        self._items: dict[str, Obj] = {}
        self._lock = threading.Lock()
        self.synced = threading.Event()

    def items(self) -> list[Obj]:
        with self._lock:
            return list(self._items.values())

    def get(self, key: str) -> Obj | None:
        with self._lock:
            return self._items.get(key)

    @staticmethod
    def key(obj: Obj) -> str:
        meta = obj.get("metadata", {})
        return f"{meta.get('namespace', '')}/{meta.get('name', '')}"

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                listed = self._api.sanitize_for_serialization(self._list())
                with self._lock:
                    self._items = {self.key(o): o for o in listed.get("items", [])}
                self.synced.set()
                self._watch(listed["metadata"]["resourceVersion"], stop)
            except ApiException as err:
                if err.status != 410:
                    log.warning("%s: %s; re-listing", self.name, err.reason)
                    stop.wait(1.0)
            except Exception:
                log.exception("%s: watch failed; re-listing", self.name)
                stop.wait(1.0)

    def _watch(self, version: str, stop: threading.Event) -> None:
        while not stop.is_set():
            stream = watch.Watch().stream(
                self._list, resource_version=version, timeout_seconds=60, allow_watch_bookmarks=True
            )
            for event in stream:
                obj = self._api.sanitize_for_serialization(event["object"])
                kind = event["type"]
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        return  # expired: the caller re-lists
                    raise RuntimeError(f"{self.name}: watch error {obj}")
                version = obj["metadata"]["resourceVersion"]
                if kind == "BOOKMARK":
                    continue
                with self._lock:
                    if kind == "DELETED":
                        self._items.pop(self.key(obj), None)
                    else:
                        self._items[self.key(obj)] = obj
                if stop.is_set():
                    return


def pod_info(
    obj: Obj, replicaset: Lookup, deployment: Lookup, first_running: Callable[[str], float]
) -> PodInfo | None:
    """A GPU pod as the emulator sees it; None for a pod without GPU limits."""
    meta, spec, status = obj["metadata"], obj.get("spec", {}), obj.get("status", {})
    for container in spec.get("containers", []):
        found = gpu_limit((container.get("resources") or {}).get("limits") or {})
        if found:
            break
    else:
        return None
    uid = meta["uid"]
    phase = status.get("phase")
    statuses = {s["name"]: s for s in status.get("containerStatuses") or []}
    mine = statuses.get(container["name"], {})
    running_since = _parse_time(((mine.get("state") or {}).get("running") or {}).get("startedAt"))
    if phase == "Running" and running_since is None:
        running_since = first_running(uid)
    if phase != "Running":
        running_since = None
    conditions = {c["type"]: c.get("status") for c in status.get("conditions") or []}
    workload, owner_annotations = workload_of(obj, replicaset, deployment)
    return PodInfo(
        uid=uid,
        namespace=meta["namespace"],
        name=meta["name"],
        node=spec.get("nodeName"),
        workload=workload,
        container=container["name"],
        resource=found[0],
        count=found[1],
        running_since=running_since,
        ready=conditions.get("Ready") == "True",
        restart_count=int(mine.get("restartCount") or 0),
        terminating=bool(meta.get("deletionTimestamp")) or phase in ("Succeeded", "Failed"),
        annotations={**(meta.get("annotations") or {}), **owner_annotations},
        ip=status.get("podIP"),
        http_port=next(
            (
                int(p["containerPort"])
                for p in container.get("ports") or []
                if p.get("name") == "http" and p.get("containerPort")
            ),
            VLLM_PORT,
        ),
    )


def workload_of(
    pod: Obj, replicaset: Lookup, deployment: Lookup
) -> tuple[tuple[str, str], Mapping[str, str]]:
    """Pod -> ReplicaSet -> Deployment; a pod without one is its own workload."""
    meta = pod["metadata"]
    namespace = meta["namespace"]
    owner = next((o for o in meta.get("ownerReferences") or [] if o.get("controller")), None)
    if owner is None:
        return (namespace, meta["name"]), {}
    if owner["kind"] != "ReplicaSet":
        return (namespace, owner["name"]), {}
    owning_rs = replicaset(f"{namespace}/{owner['name']}")
    rs_owners = (owning_rs or {}).get("metadata", {}).get("ownerReferences") or []
    owner_ref = next((o for o in rs_owners if o.get("kind") == "Deployment"), None)
    if owner_ref is None:
        template_hash = (meta.get("labels") or {}).get("pod-template-hash", "")
        if owning_rs is None and template_hash:
            # The ReplicaSet is not cached yet: the Deployment controller's naming rule.
            return (namespace, owner["name"].removesuffix(f"-{template_hash}")), {}
        return (namespace, owner["name"]), {}
    found = deployment(f"{namespace}/{owner_ref['name']}")
    annotations = (found or {}).get("metadata", {}).get("annotations") or {}
    return (namespace, owner_ref["name"]), annotations


class _RecordingLookup:
    """A lookup that remembers what it answered, to tell later whether the answer changed."""

    def __init__(self, lookup: Lookup, answers: list[tuple[Lookup, str, Obj | None]]) -> None:
        self._lookup = lookup
        self._answers = answers

    def __call__(self, key: str) -> Obj | None:
        found = self._lookup(key)
        self._answers.append((self._lookup, key, found))
        return found


@dataclass
class _Derived:
    pod: Obj
    info: PodInfo | None
    owners: list[tuple[Lookup, str, Obj | None]] = field(default_factory=list)

    def still(self, pod: Obj) -> bool:
        return self.pod is pod and all(lookup(key) is found for lookup, key, found in self.owners)


class PodInfos:
    """Each pod's PodInfo, derived again only when the pod or an owner it was derived through
    is another object: the informers replace an object at each of its events. Deriving every
    pod's at every tick was the largest part of a tick at 5,000 pods (bench/README.md)."""

    def __init__(
        self, replicaset: Lookup, deployment: Lookup, first_running: Callable[[str], float]
    ) -> None:
        self._replicaset = replicaset
        self._deployment = deployment
        self._first_running = first_running
        self._derived: dict[str, _Derived] = {}

    def of(self, objs: Sequence[Obj]) -> list[PodInfo]:
        derived = {}
        for obj in objs:
            uid = obj["metadata"]["uid"]
            known = self._derived.get(uid)
            derived[uid] = known if known is not None and known.still(obj) else self._derive(obj)
        self._derived = derived
        return [d.info for d in derived.values() if d.info is not None]

    def _derive(self, obj: Obj) -> _Derived:
        owners: list[tuple[Lookup, str, Obj | None]] = []
        info = pod_info(
            obj,
            _RecordingLookup(self._replicaset, owners),
            _RecordingLookup(self._deployment, owners),
            self._first_running,
        )
        return _Derived(obj, info, owners)


class KubeCluster:
    """ClusterSource for the simulator and MigNodeClient for the MIG manager, on one cache."""

    def __init__(self, kubeconfig: str) -> None:
        self.api = config.new_client_from_config(config_file=kubeconfig)
        self.core = client.CoreV1Api(self.api)
        apps = client.AppsV1Api(self.api)
        self._informers = {
            "pods": _Informer("pods", self.core.list_pod_for_all_namespaces, self.api),
            "nodes": _Informer("nodes", self.core.list_node, self.api),
            "replicasets": _Informer(
                "replicasets", apps.list_replica_set_for_all_namespaces, self.api
            ),
            "deployments": _Informer(
                "deployments", apps.list_deployment_for_all_namespaces, self.api
            ),
        }
        self._stop = threading.Event()
        self._first_running: dict[str, float] = {}
        self._node_infos: Rederived[Obj, NodeInfo] = Rederived(_node)
        self._pod_infos = PodInfos(
            self._informers["replicasets"].get,
            self._informers["deployments"].get,
            self._first_seen_running,
        )

    def start(self, timeout: float = 30.0) -> None:
        for informer in self._informers.values():
            threading.Thread(
                target=informer.run, args=(self._stop,), name=informer.name, daemon=True
            ).start()
        deadline = time.monotonic() + timeout
        for informer in self._informers.values():
            if not informer.synced.wait(max(0.0, deadline - time.monotonic())):
                raise TimeoutError(f"listing {informer.name} took longer than {timeout} s")

    def stop(self) -> None:
        self._stop.set()

    # ClusterSource

    def _first_seen_running(self, uid: str) -> float:
        return self._first_running.setdefault(uid, time.time())

    def snapshot(self) -> ClusterSnapshot:
        objs = self._informers["pods"].items()
        live = {o["metadata"]["uid"] for o in objs}
        self._first_running = {k: v for k, v in self._first_running.items() if k in live}
        pods = self._pod_infos.of(objs)
        return ClusterSnapshot(pods=pods, nodes={n.name: n for n in self.nodes()})

    def mark_ready(self, pod: PodInfo) -> None:
        current = self._informers["pods"].get(f"{pod.namespace}/{pod.name}")
        if current is None:
            return
        now = _timestamp(time.time())
        statuses = [
            {**s, "ready": True, "started": True}
            for s in current.get("status", {}).get("containerStatuses") or []
        ]
        body = {
            "status": {
                "conditions": [
                    {"type": "Ready", "status": "True", "lastTransitionTime": now},
                    {"type": "ContainersReady", "status": "True", "lastTransitionTime": now},
                ],
                "containerStatuses": statuses,
            }
        }
        self.core.patch_namespaced_pod_status(
            pod.name, pod.namespace, body, _content_type=STRATEGIC
        )

    def record_oom(self, pod: PodInfo, at: float) -> None:
        self._record_exit(pod, at, 137, "OOMKilled", "CUDA out of memory (emulated by gpusim)")

    def record_restart(self, pod: PodInfo, at: float) -> None:
        self._record_exit(pod, at, 1, "Error", "restarted through gpusim's control API")

    def _record_exit(
        self, pod: PodInfo, at: float, exit_code: int, reason: str, message: str
    ) -> None:
        """The GPU container exited and runs again: restartCount+1 and its last state."""
        current = self._informers["pods"].get(f"{pod.namespace}/{pod.name}")
        if current is None:
            return
        now = _timestamp(at)
        statuses = []
        for s in current.get("status", {}).get("containerStatuses") or []:
            if s["name"] == pod.container:
                started = ((s.get("state") or {}).get("running") or {}).get("startedAt", now)
                s = {
                    **s,
                    "ready": False,
                    "restartCount": int(s.get("restartCount") or 0) + 1,
                    "lastState": {
                        "terminated": {
                            "exitCode": exit_code,
                            "reason": reason,
                            "message": message,
                            "startedAt": started,
                            "finishedAt": now,
                        }
                    },
                    "state": {"running": {"startedAt": now}},
                }
            statuses.append(s)
        body = {
            "status": {
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "False",
                        "reason": "ContainersNotReady",
                        "lastTransitionTime": now,
                    },
                    {
                        "type": "ContainersReady",
                        "status": "False",
                        "reason": "ContainersNotReady",
                        "lastTransitionTime": now,
                    },
                ],
                "containerStatuses": statuses,
            }
        }
        self.core.patch_namespaced_pod_status(
            pod.name, pod.namespace, body, _content_type=STRATEGIC
        )

    # MigNodeClient

    def nodes(self) -> Sequence[NodeInfo]:
        """Each node's NodeInfo, the same object while the node is (devices.NodeDevices
        derives a node's devices again only when it is another)."""
        return self._node_infos.of(
            (o["metadata"]["name"], o) for o in self._informers["nodes"].items()
        )

    def gpu_pods(self, node: str) -> list[str]:
        return [
            f"{p.namespace}/{p.name}"
            for p in self.snapshot().pods
            if p.node == node and not p.terminating
        ]

    def patch_metadata(
        self, node: str, labels: Mapping[str, str | None], annotations: Mapping[str, str | None]
    ) -> None:
        body = {"metadata": {"labels": dict(labels), "annotations": dict(annotations)}}
        self.core.patch_node(node, body, _content_type=STRATEGIC)

    def patch_resources(self, node: str, resources: Mapping[str, int | None]) -> None:
        values = {k: (None if v is None else str(v)) for k, v in resources.items()}
        body = {"status": {"capacity": values, "allocatable": values}}
        self.core.patch_node_status(node, body, _content_type=STRATEGIC)

    def read_config(self, namespace: str, name: str) -> str | None:
        try:
            found = self.core.read_namespaced_config_map(name, namespace)
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        value = (found.data or {}).get("config.yaml")
        return str(value) if value is not None else None

    def warn(self, node: str, reason: str, message: str) -> None:
        found = self._informers["nodes"].get(f"/{node}")
        uid = (found or {}).get("metadata", {}).get("uid", "")
        now = _timestamp(time.time())
        body = {
            "metadata": {"generateName": f"{node}.", "namespace": "default"},
            "involvedObject": {"kind": "Node", "name": node, "uid": uid, "apiVersion": "v1"},
            "reason": reason,
            "message": message,
            "type": "Warning",
            "source": {"component": "nvidia-mig-manager"},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        self.core.create_namespaced_event("default", client.CoreV1Event.from_dict(body))


def _node(obj: Obj) -> NodeInfo:
    meta = obj["metadata"]
    return NodeInfo(
        name=meta["name"],
        labels=meta.get("labels") or {},
        allocatable=(obj.get("status") or {}).get("allocatable") or {},
        annotations=meta.get("annotations") or {},
    )
