"""The activator process: the watches that feed the registry, the push, the proxy, its health
and metrics endpoints, and the drain on SIGTERM."""

from __future__ import annotations

import asyncio
import functools
import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from prometheus_client import start_http_server

from gpusizer.activation import MANAGED_BY_LABEL
from gpusizer.activator import metrics
from gpusizer.activator.holding import Workload
from gpusizer.activator.proxy import Proxy, ProxySettings
from gpusizer.activator.pusher import Gone, Patch, Pusher
from gpusizer.activator.registry import Registry
from gpusizer.api.v1alpha1 import GROUP, PLURAL, VERSION
from gpusizer.kube import api_client
from gpusizer.watches import follow, start

log = logging.getLogger(__name__)

# the EndpointSlices of the workloads' own pods (not the operator's, which name the activator)
POD_SLICES = f"{MANAGED_BY_LABEL}=endpointslice-controller.k8s.io"


@dataclass(frozen=True)
class ActivatorSettings:
    replica: str  # this replica's pod name: its annotation key on each WorkloadSizing
    address: str = "0.0.0.0"  # where every port listens (the pod's IP, or all)
    shared_port: int | None = 8080  # routed by Host instead of by port
    health_port: int = 8081
    metrics_port: int = 9090
    namespaces: tuple[str, ...] = ()  # watched; empty: all
    drain_seconds: float = 50.0  # after SIGTERM, for held requests to find a replica
    proxy: ProxySettings = field(default_factory=ProxySettings)


class Activator:
    """The parts, wired: watches -> registry -> proxy listeners and pushes."""

    def __init__(self, settings: ActivatorSettings, patch: Patch) -> None:
        self.settings = settings
        self.pusher = Pusher(settings.replica, patch)
        self.registry = Registry(
            self._held_changed,
            self._ports_changed,
            self.pusher.sweep,
            lambda workload: metrics.forget(*workload.route.key),
        )
        self.proxy = Proxy(self.registry, settings.proxy)
        self._ports: asyncio.Queue[frozenset[int]] = asyncio.Queue()
        self._stop = threading.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def _held_changed(self, workload: Workload) -> None:
        route = workload.route
        metrics.PENDING.labels(route.namespace, route.name).set(workload.pending)
        self.pusher.held(route.key, workload.pending, workload.since)

    def _ports_changed(self, ports: frozenset[int]) -> None:
        self._ports.put_nowait(ports)

    async def _listen(self) -> None:
        """The listeners follow the ports the WorkloadSizings record, one change at a time."""
        while True:
            ports = await self._ports.get()
            while not self._ports.empty():
                ports = self._ports.get_nowait()
            await self.proxy.listen(ports)

    def ready(self) -> bool:
        """Listed every watched kind, listening on every workload port, not draining."""
        wanted = {f"{kind}/{ns}" for kind in ("workloads", "slices") for ns in self._scopes()}
        listening = self.registry.ports() <= self.proxy.listened()
        return wanted <= self.registry.synced and listening and not self.proxy.draining

    def _scopes(self) -> tuple[str, ...]:
        return self.settings.namespaces or ("",)

    async def start(self) -> None:
        await self.proxy.start(self.settings.address, self.settings.shared_port)
        self._tasks.append(asyncio.create_task(self._listen()))

    def watch(self, client: k8s.ApiClient) -> None:
        """The WorkloadSizings and the pods' EndpointSlices, each in a thread, into the
        registry on the event loop."""
        loop = asyncio.get_running_loop()
        custom, discovery = k8s.CustomObjectsApi(client), k8s.DiscoveryV1Api(client)

        def on_loop(fn: Callable[..., None]) -> Callable[..., None]:
            def call(*args: Any) -> None:
                loop.call_soon_threadsafe(fn, *args)

            return call

        for namespace in self.settings.namespaces or (None,):
            where = namespace or "every namespace"
            if namespace is None:
                workloads: tuple[Any, ...] = (
                    custom.list_cluster_custom_object,
                    GROUP,
                    VERSION,
                    PLURAL,
                )
                slices: tuple[Any, ...] = (discovery.list_endpoint_slice_for_all_namespaces,)
            else:
                workloads = (
                    custom.list_namespaced_custom_object,
                    GROUP,
                    VERSION,
                    namespace,
                    PLURAL,
                )
                slices = (discovery.list_namespaced_endpoint_slice, namespace)
            follow_workloads = functools.partial(
                follow,
                f"WorkloadSizings in {where}",
                *workloads,
                listed=on_loop(
                    functools.partial(self.registry.workloads_listed, namespace=namespace)
                ),
                changed=on_loop(self.registry.workload_changed),
                stop=self._stop,
            )
            follow_slices = functools.partial(
                follow,
                f"the pods' EndpointSlices in {where}",
                *slices,
                label_selector=POD_SLICES,
                listed=on_loop(functools.partial(self.registry.slices_listed, namespace=namespace)),
                changed=on_loop(self.registry.slice_changed),
                stop=self._stop,
            )
            start(follow_workloads, "workloadsizings")
            start(follow_slices, "endpointslices")

    async def drain_and_stop(self) -> None:
        deadline = time.time() + self.settings.drain_seconds
        log.info(
            "draining: new requests go to another replica; those held wait up to %g s",
            self.settings.drain_seconds,
        )
        await self.proxy.drain(deadline)
        await self.pusher.clear()
        await self.proxy.stop()
        self._stop.set()
        for task in self._tasks:
            task.cancel()


async def health_server(activator: Activator, host: str, port: int) -> web.AppRunner:
    """/healthz while the process runs; /readyz once it may receive traffic."""

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        if activator.ready():
            return web.Response(text="ready\n")
        return web.Response(status=503, text="not ready\n")

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner


def kube_patch(client: k8s.ApiClient) -> Patch:
    """Merge-patches a WorkloadSizing's annotations through the API server."""
    custom = k8s.CustomObjectsApi(client)

    async def patch(namespace: str, name: str, annotations: dict[str, str | None]) -> None:
        body = {"metadata": {"annotations": annotations}}
        try:
            await asyncio.to_thread(
                custom.patch_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, name, body
            )
        except ApiException as exc:
            if exc.status == 404:
                raise Gone from exc
            raise

    return patch


async def serve(settings: ActivatorSettings) -> None:
    """Runs until SIGTERM or SIGINT, then drains."""
    client = api_client()
    activator = Activator(settings, kube_patch(client))
    start_http_server(settings.metrics_port, settings.address, registry=metrics.REGISTRY)
    health = await health_server(activator, settings.address, settings.health_port)
    await activator.start()
    activator.watch(client)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    log.info(
        "gpusizer activator %s serving on %s (shared port %s)",
        settings.replica,
        settings.address,
        settings.shared_port,
    )
    await stopping.wait()
    await activator.drain_and_stop()
    await health.cleanup()
    log.info("gpusizer activator %s stopped", settings.replica)
