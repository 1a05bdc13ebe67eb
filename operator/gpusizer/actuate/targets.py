"""Reading and scaling targets through their /scale subresource, so any scalable kind works.

The kubernetes client is blocking; every call runs in a worker thread.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import (
    ConflictError,
    NotFoundError,
    ResourceNotFoundError,
)

from gpusizer.api.v1alpha1 import GROUP, TargetRef
from gpusizer.catalog.models import PRODUCT_LABEL


class TargetProblem(Exception):
    """The target cannot be read or scaled; the message says why, for the user."""


class TargetNotFound(TargetProblem):
    pass


class TargetNotScalable(TargetProblem):
    pass


class ScaleConflict(TargetProblem):
    """Someone else changed the target between our read and our write."""


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
_SCALE_IN_SPEC = {("apps/v1", "Deployment"), ("apps/v1", "StatefulSet"), ("apps/v1", "ReplicaSet")}
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
        annotations={k: v for k, v in annotations.items() if k.startswith(ANNOTATION_PREFIX)},
        generation=meta.get("generation"),
        pod_spec=((obj.get("spec") or {}).get("template") or {}).get("spec"),
    )


def cached_kind(ref: TargetRef) -> bool:
    """Whether the operator's watch cache (handlers.py) holds targets of this kind."""
    return (ref.api_version, ref.kind) in WATCHED_KINDS


class Targets:
    def __init__(self, api_client: k8s.ApiClient) -> None:
        self._api_client = api_client
        self._dynamic: DynamicClient | None = None

    def _resource(self, ref: TargetRef) -> Any:
        if self._dynamic is None:
            self._dynamic = DynamicClient(self._api_client)
        try:
            resource = self._dynamic.resources.get(api_version=ref.api_version, kind=ref.kind)
        except ResourceNotFoundError as exc:
            raise TargetNotScalable(
                f"spec.targetRef: the API server has no kind {ref.kind} in {ref.api_version}"
            ) from exc
        scale = resource.subresources.get("scale")
        if scale is None:
            raise TargetNotScalable(
                f"spec.targetRef: {ref.kind} {ref.api_version} has no /scale subresource"
            )
        return resource, scale

    def _read(self, namespace: str, ref: TargetRef) -> TargetView:
        resource, scale_resource = self._resource(ref)
        try:
            # raw JSON: the dynamic client's ResourceInstance wrapping costs more CPU than the
            # request itself, and this runs for every workload every cycle
            obj = json.loads(resource.get(name=ref.name, namespace=namespace, serialize=False).data)
            scale = None  # the object already says what /scale would
            if (ref.api_version, ref.kind) not in _SCALE_IN_SPEC:
                scale = json.loads(
                    scale_resource.get(name=ref.name, namespace=namespace, serialize=False).data
                )
        except NotFoundError as exc:
            raise TargetNotFound(
                f"spec.targetRef: {ref.kind} {namespace}/{ref.name} does not exist"
            ) from exc
        return target_view(obj, scale)

    async def read(self, namespace: str, ref: TargetRef) -> TargetView:
        return await asyncio.to_thread(self._read, namespace, ref)

    def _write(self, namespace: str, ref: TargetRef, expected: int, replicas: int) -> None:
        _, scale_resource = self._resource(ref)
        try:
            scale = scale_resource.get(name=ref.name, namespace=namespace).to_dict()
        except NotFoundError as exc:
            raise TargetNotFound(f"{ref.kind} {namespace}/{ref.name} disappeared") from exc
        now = int((scale.get("spec") or {}).get("replicas") or 0)
        if now != expected:
            raise ScaleConflict(
                f"{ref.kind} {namespace}/{ref.name} changed to {now} replicas since it was read "
                f"({expected}); deciding again next cycle"
            )
        body = {
            "apiVersion": scale.get("apiVersion"),
            "kind": scale.get("kind"),
            "metadata": {
                "name": ref.name,
                "namespace": namespace,
                "resourceVersion": (scale.get("metadata") or {}).get("resourceVersion"),
            },
            "spec": {"replicas": replicas},
        }
        try:
            scale_resource.replace(body=body, name=ref.name, namespace=namespace)
        except ConflictError as exc:
            raise ScaleConflict(
                f"{ref.kind} {namespace}/{ref.name} changed while being scaled (409); "
                "deciding again next cycle"
            ) from exc
        except ApiException as exc:
            raise TargetProblem(f"scaling {ref.kind} {namespace}/{ref.name}: {exc.reason}") from exc

    async def write(self, namespace: str, ref: TargetRef, expected: int, replicas: int) -> None:
        """Set replicas, re-reading first: a change made since our read wins over our decision."""
        await asyncio.to_thread(self._write, namespace, ref, expected, replicas)

    def _reshape(self, namespace: str, ref: TargetRef, change: SliceChange) -> None:
        resource, _ = self._resource(ref)
        limits: dict[str, Any] = {change.new_resource: change.count}
        if change.old_resource != change.new_resource:
            limits[change.old_resource] = None  # strategic merge: null deletes the key
        body = {
            "metadata": {"annotations": dict(change.annotations)},
            "spec": {
                "replicas": change.replicas,
                "template": {
                    "spec": {
                        "nodeSelector": {PRODUCT_LABEL: change.product_label},
                        "containers": [
                            {
                                "name": change.container,
                                "resources": {"limits": limits, "requests": limits},
                            }
                        ],
                    }
                },
            },
        }
        try:
            resource.patch(
                body=body,
                name=ref.name,
                namespace=namespace,
                content_type="application/strategic-merge-patch+json",
            )
        except NotFoundError as exc:
            raise TargetNotFound(f"{ref.kind} {namespace}/{ref.name} disappeared") from exc
        except ApiException as exc:
            raise TargetProblem(
                f"changing the slice of {ref.kind} {namespace}/{ref.name}: {exc.reason}"
            ) from exc

    async def reshape(self, namespace: str, ref: TargetRef, change: SliceChange) -> None:
        """Move the pod template to another slice and set replicas for it, in one change."""
        await asyncio.to_thread(self._reshape, namespace, ref, change)

    def _annotate(self, namespace: str, ref: TargetRef, annotations: Mapping[str, str]) -> None:
        resource, _ = self._resource(ref)
        resource.patch(
            body={"metadata": {"annotations": dict(annotations)}},
            name=ref.name,
            namespace=namespace,
            content_type="application/merge-patch+json",
        )

    async def annotate(
        self, namespace: str, ref: TargetRef, annotations: Mapping[str, str]
    ) -> None:
        await asyncio.to_thread(self._annotate, namespace, ref, annotations)
