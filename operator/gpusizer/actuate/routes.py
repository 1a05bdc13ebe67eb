"""The EndpointSlices that point workloads' Services at the activator, and the watch of the
activator's own replicas: the operator's one implementation of `gpusizer.ports.RouteClient`.

The kubernetes client is blocking: every call runs in a worker thread, and the watch in a
thread of its own.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from gpusizer.activation import (
    MANAGED_BY,
    MANAGED_BY_LABEL,
    SERVICE_NAME_LABEL,
    ActivatorRoute,
    RouteProblem,
    ready_addresses,
    slice_name,
)
from gpusizer.api.v1alpha1 import GROUP, KIND, VERSION
from gpusizer.kube import UNANSWERED
from gpusizer.watches import Store, follow, start

log = logging.getLogger(__name__)

# A Service's ports rarely change; one read a minute per routed Service is plenty.
SERVICE_FRESH_SECONDS = 60.0


def slice_body(namespace: str, route: ActivatorRoute) -> dict[str, Any]:
    """The EndpointSlice: the activator's replicas at the workload's port, under the Service's
    port name, owned by the WorkloadSizing (deleting it deletes the slice)."""
    family = "IPv6" if ":" in route.addresses[0] else "IPv4"
    metadata: dict[str, Any] = {
        "name": slice_name(route.service),
        "namespace": namespace,
        "labels": {SERVICE_NAME_LABEL: route.service, MANAGED_BY_LABEL: MANAGED_BY},
    }
    if route.owner_uid:
        metadata["ownerReferences"] = [
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": KIND,
                "name": route.owner,
                "uid": route.owner_uid,
            }
        ]
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": metadata,
        "addressType": family,
        "endpoints": [
            {"addresses": [address], "conditions": {"ready": True}}
            for address in route.addresses
            if (":" in address) == (family == "IPv6")
        ],
        "ports": [{"name": route.service_port, "port": route.port, "protocol": "TCP"}],
    }


def _reason(exc: Exception) -> str:
    if isinstance(exc, ApiException):
        return f"HTTP {exc.status} {exc.reason}"
    return str(exc)


# what a request to the API server raises: an answer, or none (unreachable, cut off)
_FAILED = (ApiException, *UNANSWERED)


class Routes:
    """RouteClient over the API server. `activator` is the activator's Service (namespace,
    name), whose ready replicas the routes name; None when no activator is installed.
    `changed` is called (on the event loop) whenever its replicas change."""

    def __init__(
        self,
        api_client: k8s.ApiClient,
        activator: tuple[str, str] | None,
        changed: Callable[[], None] = lambda: None,
    ) -> None:
        self._core = k8s.CoreV1Api(api_client)
        self._discovery = k8s.DiscoveryV1Api(api_client)
        self._activator = activator
        self._changed = changed
        self._replicas: tuple[str, ...] | None = None
        self._written: dict[tuple[str, str], ActivatorRoute | None] = {}
        self._ports: dict[tuple[str, str, int | None], tuple[float, str]] = {}

    def start(self, stop: threading.Event) -> None:
        """Watches the activator's replicas in a thread of its own, until `stop` is set."""
        if self._activator is None:
            return
        namespace, name = self._activator
        loop = asyncio.get_running_loop()

        def publish() -> None:
            ready = {a for obj in slices.objects() for a in ready_addresses(obj)}
            loop.call_soon_threadsafe(self._publish, tuple(sorted(ready)))

        slices = Store(publish)

        watch = functools.partial(
            follow,
            f"the activator's replicas ({namespace}/{name})",
            self._discovery.list_namespaced_endpoint_slice,
            namespace,
            label_selector=f"{SERVICE_NAME_LABEL}={name}",
            listed=slices.listed,
            changed=slices.changed,
            stop=stop,
        )
        start(watch, "activator-replicas")

    def activators(self) -> tuple[str, ...] | None:
        return self._replicas

    def _publish(self, replicas: tuple[str, ...]) -> None:
        if replicas != self._replicas:
            log.info("activator replicas ready: %s", ", ".join(replicas) or "none")
            self._replicas = replicas
            self._changed()

    async def service_port(self, namespace: str, service: str, port: int | None) -> str:
        key = (namespace, service, port)
        known = self._ports.get(key)
        if known is not None and time.monotonic() - known[0] < SERVICE_FRESH_SECONDS:
            return known[1]
        name = await asyncio.to_thread(self._service_port, namespace, service, port)
        self._ports[key] = (time.monotonic(), name)
        return name

    def _service_port(self, namespace: str, service: str, port: int | None) -> str:
        field = "spec.scaleToZero.activator"
        try:
            obj = self._core.read_namespaced_service(service, namespace)
        except _FAILED as exc:
            if isinstance(exc, ApiException) and exc.status == 404:
                raise RouteProblem(
                    f"{field}.service: Service {namespace}/{service} does not exist"
                ) from exc
            raise RouteProblem(f"reading Service {namespace}/{service}: {_reason(exc)}") from exc
        ports = [p for p in obj.spec.ports or [] if (p.protocol or "TCP") == "TCP"]
        numbers = ", ".join(str(p.port) for p in ports) or "none"
        if port is None:
            if len(ports) != 1:
                raise RouteProblem(
                    f"{field}.port: Service {namespace}/{service} has TCP ports {numbers}: "
                    "say which one to hold"
                )
            return str(ports[0].name or "")
        for candidate in ports:
            if candidate.port == port:
                return str(candidate.name or "")
        raise RouteProblem(
            f"{field}.port: Service {namespace}/{service} has no TCP port {port} (it has {numbers})"
        )

    async def route(self, namespace: str, service: str, route: ActivatorRoute | None) -> None:
        key = (namespace, service)
        if key in self._written and self._written[key] == route:
            return
        await asyncio.to_thread(self._route, namespace, service, route)
        self._written[key] = route

    def _route(self, namespace: str, service: str, route: ActivatorRoute | None) -> None:
        name = slice_name(service)
        try:
            if route is None:
                try:
                    self._discovery.delete_namespaced_endpoint_slice(name, namespace)
                except ApiException as exc:
                    if exc.status != 404:
                        raise
                return
            body = slice_body(namespace, route)
            try:
                self._discovery.create_namespaced_endpoint_slice(namespace, body)
            except ApiException as exc:
                if exc.status != 409:
                    raise
                self._discovery.patch_namespaced_endpoint_slice(
                    name, namespace, body, _content_type="application/merge-patch+json"
                )
        except _FAILED as exc:
            verb = "removing" if route is None else "writing"
            raise RouteProblem(f"{verb} EndpointSlice {namespace}/{name}: {_reason(exc)}") from exc
