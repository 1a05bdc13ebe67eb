"""A scalable target as a decision sees it, the change that moves it to another slice, and
why a target cannot be read or written.

Pure: built from the object's JSON (a watch event or a GET), so the watch cache, the API
client and the tests' fakes share one shape.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpusizer.api.v1alpha1 import GROUP, TargetRef
from gpusizer.compact import compact, compact_dict


class TargetProblem(Exception):
    """The target cannot be read or scaled; the message says why, for the user."""


class TargetNotFound(TargetProblem):
    pass


class TargetNotScalable(TargetProblem):
    pass


class ScaleConflict(TargetProblem):
    """Someone else changed the target between our read and our write."""


class TargetUnanswered(TargetProblem):
    """The API server did not answer a write: it may have landed or not, and only a fresh
    read of the target says which."""


@dataclass(frozen=True)
class TargetView:
    replicas: int
    selector: str
    resource_version: str
    annotations: Mapping[str, str] = field(default_factory=dict)
    generation: int | None = None
    pod_spec: Mapping[str, Any] | None = None  # spec.template.spec, where the kind has one


@dataclass(frozen=True)
class SliceChange:
    """A pod template change that moves a workload to another slice."""

    container: str
    old_resource: str
    new_resource: str
    count: int
    product_label: str
    replicas: int
    annotations: Mapping[str, str]


# Kinds whose /scale is spec.replicas and spec.selector of the object itself (the API server's
# own scale subresource for them), so one GET reads both.
SCALE_IN_SPEC = {("apps/v1", "Deployment"), ("apps/v1", "StatefulSet"), ("apps/v1", "ReplicaSet")}
# Kinds the operator watches, so reading them costs no request: the kinds inference servers run as.
WATCHED_KINDS = {("apps/v1", "Deployment"), ("apps/v1", "StatefulSet")}
# Only the operator's own annotations of a target are read (pause, reshape record).
ANNOTATION_PREFIX = f"{GROUP}/"


def selector_string(selector: Mapping[str, Any] | None) -> str:
    """A LabelSelector as the string the /scale subresource shows in status.selector."""
    selector = selector or {}
    terms = [f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items())]
    for expr in selector.get("matchExpressions") or []:
        key, op = expr.get("key"), expr.get("operator")
        values = ",".join(sorted(expr.get("values") or []))
        if op == "In":
            terms.append(f"{key} in ({values})")
        elif op == "NotIn":
            terms.append(f"{key} notin ({values})")
        elif op == "Exists":
            terms.append(str(key))
        elif op == "DoesNotExist":
            terms.append(f"!{key}")
    return ",".join(terms)


def _scale_of(obj: Mapping[str, Any]) -> dict[str, Any]:
    spec = obj.get("spec") or {}
    replicas = spec.get("replicas")
    return {
        "spec": {"replicas": 1 if replicas is None else replicas},
        "status": {"selector": selector_string(spec.get("selector"))},
        "metadata": {"resourceVersion": (obj.get("metadata") or {}).get("resourceVersion")},
    }


def target_view(obj: Mapping[str, Any], scale: Mapping[str, Any] | None = None) -> TargetView:
    """What a decision needs of a target object and its /scale (by default the one a Deployment
    or StatefulSet has in its spec). Only the operator's own annotations are kept: a watch cache
    of every Deployment would otherwise hold each one's last-applied-configuration."""
    scale = _scale_of(obj) if scale is None else scale
    meta = obj.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    return TargetView(
        replicas=int((scale.get("spec") or {}).get("replicas") or 0),
        selector=str((scale.get("status") or {}).get("selector") or ""),
        resource_version=str((scale.get("metadata") or {}).get("resourceVersion") or ""),
        annotations=compact_dict(
            {k: v for k, v in annotations.items() if k.startswith(ANNOTATION_PREFIX)}
        ),
        generation=meta.get("generation"),
        pod_spec=compact(((obj.get("spec") or {}).get("template") or {}).get("spec")),
    )


def cached_kind(ref: TargetRef) -> bool:
    """Whether the operator's watch cache (handlers.py) holds targets of this kind."""
    return (ref.api_version, ref.kind) in WATCHED_KINDS
