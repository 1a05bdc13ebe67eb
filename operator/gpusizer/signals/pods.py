"""What the operator needs to know about a pod, read from its Kubernetes object. Pure."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpusizer.compact import compact_dict
from gpusizer.timefmt import parse_time

GPU_RESOURCE_PREFIX = "nvidia.com/"
WHOLE_GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"


@dataclass(frozen=True, slots=True)
class PodInfo:
    namespace: str
    name: str
    labels: Mapping[str, str]
    node: str | None
    ready: bool
    terminating: bool
    phase: str
    gpu_resource: str | None  # nvidia.com/gpu or nvidia.com/mig-<profile> of the GPU container
    gpu_container: str | None
    oom_kills: int  # containers whose last termination was OOMKilled, counted by restarts
    gpu_count: int = 1  # units of gpu_resource the pod holds
    created: float | None = None  # creation time, seconds since the epoch
    unschedulable: str | None = None  # the scheduler's message while it cannot place the pod
    ready_since: float | None = None  # when the Ready condition last turned True
    uid: str = ""

    @property
    def starting(self) -> bool:
        """Pending, or running but not yet ready: capacity on its way."""
        return not self.terminating and not self.ready and self.phase in ("Pending", "Running")

    @property
    def is_mig(self) -> bool:
        return bool(self.gpu_resource and self.gpu_resource.startswith(MIG_RESOURCE_PREFIX))


def _gpu_resource(container: Mapping[str, Any]) -> tuple[str, int] | None:
    """The GPU resource a container asks for, and how many units."""
    resources = container.get("resources") or {}
    for section in ("limits", "requests"):
        for name, amount in (resources.get(section) or {}).items():
            if isinstance(name, str) and name.startswith(GPU_RESOURCE_PREFIX):
                try:
                    return name, max(1, int(str(amount)))
                except ValueError:
                    return name, 1
    return None


def requests_gpu(pod_spec: Mapping[str, Any] | None) -> bool:
    """Whether any container of a pod (template) spec asks for an NVIDIA GPU resource."""
    return any(_gpu_resource(c) for c in (pod_spec or {}).get("containers") or [])


def pod_info(pod: Mapping[str, Any], container: str | None = None) -> PodInfo:
    """Parse a pod object (as a dict); `container` picks the sized container by name."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    gpu_resource: tuple[str, int] | None = None
    gpu_container = None
    for c in spec.get("containers") or []:
        if container is not None and c.get("name") != container:
            continue
        gpu_resource = _gpu_resource(c)
        if gpu_resource is not None or container is not None:
            gpu_container = c.get("name")
            break
    conditions = status.get("conditions") or []
    ready_condition: Mapping[str, Any] = next(
        (c for c in conditions if c.get("type") == "Ready"), {}
    )
    ready = ready_condition.get("status") == "True"
    unschedulable = next(
        (
            str(c.get("message") or "unschedulable")
            for c in conditions
            if c.get("type") == "PodScheduled"
            and c.get("status") == "False"
            and c.get("reason") == "Unschedulable"
        ),
        None,
    )
    oom_kills = 0
    for cs in status.get("containerStatuses") or []:
        terminated = (cs.get("lastState") or {}).get("terminated") or {}
        if terminated.get("reason") == "OOMKilled":
            oom_kills += max(1, int(cs.get("restartCount") or 0))
    return PodInfo(
        namespace=sys.intern(str(meta.get("namespace") or "")),
        name=str(meta.get("name") or ""),
        labels=compact_dict(meta.get("labels") or {}),
        node=spec.get("nodeName"),
        ready=ready,
        terminating=meta.get("deletionTimestamp") is not None,
        phase=sys.intern(str(status.get("phase") or "Pending")),
        gpu_resource=gpu_resource[0] if gpu_resource else None,
        gpu_container=gpu_container,
        oom_kills=oom_kills,
        gpu_count=gpu_resource[1] if gpu_resource else 0,
        created=parse_time(meta.get("creationTimestamp")),
        unschedulable=unschedulable,
        ready_since=parse_time(ready_condition.get("lastTransitionTime")) if ready else None,
        uid=str(meta.get("uid") or ""),
    )


def matches_selector(labels: Mapping[str, str], selector: str) -> bool:
    """Whether labels match a /scale status.selector string (equality and set-based terms)."""
    if not selector:
        return False
    return all(_term_matches(labels, term.strip()) for term in _split_terms(selector))


def equality_term(selector: str) -> tuple[str, str] | None:
    """One `key=value` term of a selector, if it has one: the pods carrying that label are
    the only candidates, which an index by label finds without scanning the namespace."""
    for term in _split_terms(selector):
        term = term.strip()
        if " in " in term or term.startswith("!") or "!=" in term:
            continue
        for op in ("==", "="):
            if op in term:
                key, _, value = term.partition(op)
                return key.strip(), value.strip()
    return None


def _split_terms(selector: str) -> list[str]:
    terms, depth, start = [], 0, 0
    for i, ch in enumerate(selector):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            terms.append(selector[start:i])
            start = i + 1
    terms.append(selector[start:])
    return [t for t in terms if t.strip()]


def _term_matches(labels: Mapping[str, str], term: str) -> bool:
    for op in (" notin ", " in "):
        if op in term:
            key, _, rest = term.partition(op)
            values = {v.strip() for v in rest.strip().strip("()").split(",")}
            present = labels.get(key.strip())
            inside = present is not None and present in values
            return inside if op == " in " else not inside
    if term.startswith("!"):
        return term[1:] not in labels
    for op in ("!=", "==", "="):
        if op in term:
            key, _, value = term.partition(op)
            present = labels.get(key.strip())
            if op == "!=":
                return present != value.strip()
            return present == value.strip()
    return term in labels
