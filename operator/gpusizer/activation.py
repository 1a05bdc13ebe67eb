"""The operator's side of the activator: the demand the activator pushed, the port it listens
on for a workload, and the EndpointSlice that points the workload's Service at it.

While a workload has no ready replica its Service's traffic goes to the activator through an
EndpointSlice the operator owns (`endpointslice.kubernetes.io/managed-by: gpusizer.io`): the
activator replicas' addresses, at the workload's own port. kube-proxy merges it with the
slices of the Service's pods; once a replica is ready the operator removes it and the
activator is out of the path (docs/concepts.md). Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpusizer.api.annotations import Held
from gpusizer.api.v1alpha1 import ACTIVATOR_PORTS, ActivatorSpec, WorkloadSizingSpec
from gpusizer.signals.parse import Problem
from gpusizer.vocabulary import Reason

MANAGED_BY = "gpusizer.io"
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
MANAGED_BY_LABEL = "endpointslice.kubernetes.io/managed-by"
ACTIVATOR_SIGNAL = "activator"  # the signal's user-facing name in MetricsAvailable

WorkloadKey = tuple[str, str]  # namespace, name


class RouteProblem(Exception):
    """The route could not be read or written; the message names the field or the object."""


@dataclass(frozen=True)
class ActivatorRoute:
    """What the EndpointSlice pointing a workload's Service at the activator says."""

    owner: str  # the WorkloadSizing, which owns the slice: deleting it deletes the slice
    owner_uid: str
    service: str
    service_port: str  # the name of the Service's port, as its EndpointSlices carry it
    port: int  # the activator's port for this workload
    addresses: tuple[str, ...]  # the ready activator replicas


def ready_addresses(endpoint_slice: Mapping[str, Any]) -> list[str]:
    """The addresses of an EndpointSlice's ready endpoints (`ready` unset counts as ready, as
    kube-proxy counts it), terminating ones left out."""
    found: list[str] = []
    for endpoint in endpoint_slice.get("endpoints") or []:
        conditions = endpoint.get("conditions") or {}
        if conditions.get("ready") is False or conditions.get("terminating") is True:
            continue
        found.extend(endpoint.get("addresses") or [])
    return found


def service_of(spec: WorkloadSizingSpec) -> str:
    return spec.scale_to_zero.activator.service or spec.target_ref.name


def slice_name(service: str) -> str:
    return f"{service}-gpusizer-activator"


def uses_activator(spec: WorkloadSizingSpec) -> bool:
    return spec.scale_to_zero.enabled and spec.scale_to_zero.activator.enabled


def activator_port(
    key: WorkloadKey,
    recorded: int | None,
    holders: Mapping[int, Iterable[WorkloadKey]],
    claimed: Mapping[WorkloadKey, int],
) -> int | None:
    """The workload's port: the one its status records unless another workload holds it too
    and sorts first; else the lowest port no other workload holds. None when all are held.

    `holders` is every WorkloadSizing's recorded port (the watch); `claimed` what this
    process handed out, which the watch may not show yet."""

    def others(port: int) -> set[WorkloadKey]:
        found = {k for k in holders.get(port, ()) if k != key}
        return found | {k for k, p in claimed.items() if p == port and k != key}

    if (
        recorded is not None
        and recorded in ACTIVATOR_PORTS
        and all(key < other for other in others(recorded))
    ):
        return recorded
    in_use = {p for p, keys in holders.items() if any(k != key for k in keys)}
    in_use |= {p for k, p in claimed.items() if k != key}
    return next((p for p in ACTIVATOR_PORTS if p not in in_use), None)


def wake_demand(
    activator: ActivatorSpec,
    held: Held,
    replicas: tuple[str, ...] | None,
    query: tuple[float | None, Problem | None] | None,
) -> tuple[float | None, Problem | None] | None:
    """The demand waiting outside the pods: the requests the activator holds plus the wake
    query's value (either may be absent). Unknown when no activator replica is ready to hold
    them: at zero nothing else would catch a request, so nothing may scale to zero then."""
    if not activator.enabled:
        return query
    if not replicas:
        why = (
            "no activator is installed (gpusizer run --activator-service)"
            if replicas is None
            else "no activator replica is ready: requests would find nothing to hold them"
        )
        return None, Problem(Reason.NO_ACTIVATOR, why)
    if query is None:
        return float(held.pending), None
    value, problem = query
    if value is None:
        return None, problem
    return value + held.pending, None
