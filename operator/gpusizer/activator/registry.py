"""The workloads the activator serves, found by the port a request came in on or by its Host,
with their ready backends from the EndpointSlices of their Services.

Fed by the watches (`listed`/`changed` for WorkloadSizings and for EndpointSlices); no I/O of
its own. `opened` is called with the ports that must be listened on whenever they change.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from gpusizer.activation import SERVICE_NAME_LABEL, ready_addresses
from gpusizer.activator.holding import Route, Workload, WorkloadKey, route_of
from gpusizer.api.annotations import held_requests

log = logging.getLogger(__name__)

Obj = dict[str, Any]
ServiceKey = tuple[str, str]  # namespace, Service
# one EndpointSlice, reduced: its ports by name, and its ready endpoints' addresses
SliceSummary = tuple[dict[str, int], tuple[str, ...]]


def summary(obj: Obj) -> SliceSummary:
    ports = {
        str(p.get("name") or ""): int(p["port"])
        for p in obj.get("ports") or []
        if p.get("port") is not None and (p.get("protocol") or "TCP") == "TCP"
    }
    return ports, tuple(ready_addresses(obj))


def host_key(host: str) -> ServiceKey | None:
    """The Service a Host header names: service.namespace, with .svc and the cluster domain
    or not, with a port or not."""
    name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    parts = name.lower().rstrip(".").split(".")
    if len(parts) < 2 or (len(parts) > 2 and parts[2] != "svc"):
        return None
    return parts[1], parts[0]


class Registry:
    def __init__(
        self,
        changed: Callable[[Workload], None],
        opened: Callable[[frozenset[int]], None],
        swept: Callable[[WorkloadKey, tuple[str, ...]], None] = lambda *_: None,
        removed: Callable[[Workload], None] = lambda _: None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._changed = changed  # a workload's held requests changed
        self._opened = opened
        self._swept = swept
        self._removed = removed
        self._clock = clock
        self.workloads: dict[WorkloadKey, Workload] = {}
        self._by_port: dict[int, Workload] = {}
        self._by_service: dict[ServiceKey, Workload] = {}
        self._slices: dict[ServiceKey, dict[str, SliceSummary]] = {}
        self.synced: set[str] = set()  # "workloads/<namespace>", "slices/...": listed once

    # --- lookups ------------------------------------------------------------------------

    def by_port(self, port: int) -> Workload | None:
        return self._by_port.get(port)

    def by_host(self, host: str) -> Workload | None:
        key = host_key(host)
        return self._by_service.get(key) if key is not None else None

    def ports(self) -> frozenset[int]:
        return frozenset(self._by_port)

    # --- WorkloadSizings ------------------------------------------------------------------

    def workloads_listed(self, items: Iterable[Obj], namespace: str | None = None) -> None:
        """Every WorkloadSizing (of `namespace`, when one is watched per namespace)."""
        seen: set[WorkloadKey] = set()
        for obj in items:
            meta = obj.get("metadata") or {}
            seen.add((meta.get("namespace", ""), meta.get("name", "")))
            self.workload_changed("MODIFIED", obj)
        for key in set(self.workloads) - seen:
            if namespace is None or key[0] == namespace:
                self._remove(key, f"WorkloadSizing {key[0]}/{key[1]} was deleted")
        self.synced.add(f"workloads/{namespace or ''}")

    def workload_changed(self, kind: str, obj: Obj) -> None:
        meta = obj.get("metadata") or {}
        key: WorkloadKey = (meta.get("namespace", ""), meta.get("name", ""))
        if kind == "DELETED":
            self._remove(key, f"WorkloadSizing {key[0]}/{key[1]} was deleted")
            return
        route = route_of(obj)
        if route is None:
            self._remove(key, f"WorkloadSizing {key[0]}/{key[1]} no longer uses the activator")
            return
        stale = held_requests(meta.get("annotations") or {}, self._clock()).stale
        if stale:
            self._swept(key, stale)
        workload = self.workloads.get(key)
        if workload is not None and workload.route == route:
            return
        if workload is None:
            workload = self.workloads[key] = Workload(route, self._changed, self._clock)
        before = workload.route
        workload.route = route
        self._index(workload, before)
        self._refresh(workload)

    def _index(self, workload: Workload, before: Route) -> None:
        self._unindex(workload, before)
        if workload.route.port is not None:
            self._by_port[workload.route.port] = workload
        self._by_service[self._service(workload)] = workload
        self._opened(self.ports())

    def _unindex(self, workload: Workload, route: Route) -> None:
        if route.port is not None and self._by_port.get(route.port) is workload:
            del self._by_port[route.port]
        if self._by_service.get((route.namespace, route.service)) is workload:
            del self._by_service[(route.namespace, route.service)]

    @staticmethod
    def _service(workload: Workload) -> ServiceKey:
        return workload.route.namespace, workload.route.service

    def _remove(self, key: WorkloadKey, why: str) -> None:
        workload = self.workloads.pop(key, None)
        if workload is None:
            return
        self._unindex(workload, workload.route)
        workload.close(f"{why} while this request was held")
        self._removed(workload)
        self._opened(self.ports())

    # --- EndpointSlices -------------------------------------------------------------------

    def slices_listed(self, items: Iterable[Obj], namespace: str | None = None) -> None:
        """Every EndpointSlice of the Services' pods (of `namespace`, when one is watched per
        namespace)."""
        self._slices = {
            service: slices
            for service, slices in self._slices.items()
            if namespace is not None and service[0] != namespace
        }
        for obj in items:
            self._store(obj)
        for workload in self.workloads.values():
            if namespace is None or workload.route.namespace == namespace:
                self._refresh(workload)
        self.synced.add(f"slices/{namespace or ''}")

    def slice_changed(self, kind: str, obj: Obj) -> None:
        service = self._store(obj, deleted=kind == "DELETED")
        if service is not None and service in self._by_service:
            self._refresh(self._by_service[service])

    def _store(self, obj: Obj, deleted: bool = False) -> ServiceKey | None:
        meta = obj.get("metadata") or {}
        name = (meta.get("labels") or {}).get(SERVICE_NAME_LABEL)
        if not name:
            return None
        service = (str(meta.get("namespace", "")), str(name))
        slices = self._slices.setdefault(service, {})
        if deleted:
            slices.pop(meta.get("name", ""), None)
            if not slices:
                del self._slices[service]
        else:
            slices[meta.get("name", "")] = summary(obj)
        return service

    def _refresh(self, workload: Workload) -> None:
        """The workload's ready backends from its Service's slices: the port named as the
        operator recorded (or the only one), at every ready address."""
        wanted = workload.route.service_port
        backends = []
        for ports, addresses in self._slices.get(self._service(workload), {}).values():
            port = ports.get(wanted) if wanted is not None else None
            if wanted is None and len(ports) == 1:
                port = next(iter(ports.values()))
            if port is None:
                continue
            backends += [f"[{a}]:{port}" if ":" in a else f"{a}:{port}" for a in addresses]
        workload.serve(tuple(sorted(set(backends))))
