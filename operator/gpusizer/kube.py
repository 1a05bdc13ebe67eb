"""Access to the Kubernetes API: the kubernetes client's configuration and instrumentation,
kopf's own session, and the shapes kopf's caches come in."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, TypeVar

import aiohttp
import kopf
import urllib3
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from gpusizer.report import metrics
from gpusizer.signals.pods import PodInfo, pod_info

K = TypeVar("K")
V = TypeVar("V")

# Every workload's target read, scale write and status write runs in a worker thread: asyncio's
# default pool has min(32, CPUs + 4) threads, which held thousands of workloads waiting for
# threads (bench/README.md).
WORKER_THREADS = 32
# The kubernetes client waits forever by default. A request cut off mid-way by a restarted or
# partitioned API server then held its decision, and its worker thread kept the process from
# exiting on SIGTERM (e2e/tests/test_faults.py). Each attempt now gives up after this long
# (urllib3 tries reads and PUTs up to four times) unless the request sets its own limit.
API_TIMEOUT_SECONDS = 10.0
# kopf's own requests (finalizers, peering) in flight at once; its watches are not counted.
KOPF_REQUESTS_AT_ONCE = 16
# what the kubernetes client raises for a request the API server never answered: a refused or
# reset connection, a read timeout, urllib3's retries spent
UNANSWERED = (urllib3.exceptions.HTTPError, OSError)


class SaidOnce:
    """A request repeated every few seconds that keeps failing: its failure logged once, and
    again only when it changes or after the request succeeded."""

    def __init__(self, logger: logging.Logger, what: str) -> None:
        self._logger, self._what = logger, what
        self._last = ""

    def failed(self, exc: Exception) -> None:
        if str(exc) != self._last:
            self._logger.warning("%s failed: %s", self._what, exc)
        self._last = str(exc)

    def succeeded(self) -> None:
        self._last = ""


def api_client(timeout_seconds: float = API_TIMEOUT_SECONDS) -> k8s.ApiClient:
    """Kubernetes access the usual way: in-cluster, else KUBECONFIG."""
    try:
        k8s_config.load_incluster_config()
    except k8s_config.ConfigException:
        k8s_config.load_kube_config()
    configuration = k8s.Configuration.get_default_copy()
    # one connection per worker thread; urllib3 otherwise opens (TLS) and drops extra ones
    configuration.connection_pool_maxsize = WORKER_THREADS
    client = k8s.ApiClient(configuration)
    instrument(client, timeout_seconds)
    return client


def instrument(client: k8s.ApiClient, timeout_seconds: float) -> None:
    """Every request of this client counts in gpusizer_kube_api_requests_total and gives up
    after `timeout_seconds` unless it sets its own limit."""
    rest = client.rest_client
    send = rest.request

    def instrumented(
        method: str, url: str, *args: Any, _request_timeout: Any = None, **kwargs: Any
    ) -> Any:
        metrics.KUBE_API_REQUESTS.labels(verb=method.upper()).inc()
        timeout = timeout_seconds if _request_timeout is None else _request_timeout
        return send(method, url, *args, _request_timeout=timeout, **kwargs)

    rest.request = instrumented


def one_connection_per_request_slot(at_once: int) -> aiohttp.ClientMiddlewareType:
    """At most `at_once` requests in flight, each read to its end before its slot frees, so
    its connection goes back to the pool for the next: kopf's pool is unbounded, and adding
    the finalizers of thousands of new WorkloadSizings at once opened a TLS connection for
    each, with a read buffer apiece (bench/README.md, "Measurements behind the code").
    Watches stream for hours and pass ungated."""
    slots = asyncio.Semaphore(at_once)

    async def gated(
        request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType
    ) -> aiohttp.ClientResponse:
        if request.url.query.get("watch") == "true":
            return await handler(request)
        async with slots:
            response = await handler(request)
            await response.read()
            return response

    return gated


async def kopf_login(**kwargs: Any) -> kopf.AiohttpSession | None:
    """kopf's own login through the kubernetes client's configuration, on a session whose
    requests share `KOPF_REQUESTS_AT_ONCE` connections."""
    info = kopf.login_via_client(**kwargs)
    if info is None:
        return None
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, ssl=info.as_ssl_context()),
        headers=info.as_http_headers(),
        proxy=info.proxy_url,
        trust_env=info.trust_env,
        middlewares=(one_connection_per_request_slot(KOPF_REQUESTS_AT_ONCE),),
    )
    return kopf.AiohttpSession(
        aiohttp_session=session,
        server=info.server,
        default_namespace=info.default_namespace,
        priority=info.priority,
        expiration=info.expiration,
    )


def drop_managed_fields(event: Mapping[str, Any]) -> None:
    """Removes metadata.managedFields from a watch event's object, in place.

    The fleet keeps each WorkloadSizing's latest body: the very dict of the event its handler
    receives (startup.Runtime.saw). managedFields was about half of it (bench/README.md), and
    nothing reads it. controller-runtime's caches drop it the same way
    (TransformStripManagedFields)."""
    obj = event.get("object")
    metadata = obj.get("metadata") if isinstance(obj, dict) else None
    if isinstance(metadata, dict):
        metadata.pop("managedFields", None)


class IndexedPods:
    """pod_info for the pod indexes, one PodInfo between them: kopf calls each index with one
    event's body in turn, and each kept a PodInfo of its own, three a pod at 10,000 pods
    (bench/README.md, "Issue 29: one PodInfo a pod"). Shared only for one uid at one
    resourceVersion: the same object as the API server had it."""

    def __init__(self) -> None:
        self._latest: tuple[str, str, PodInfo] | None = None

    def __call__(self, pod: Mapping[str, Any]) -> PodInfo:
        meta = pod.get("metadata") or {}
        uid, version = meta.get("uid"), meta.get("resourceVersion")
        if self._latest is not None and uid and version and self._latest[:2] == (uid, version):
            return self._latest[2]
        info = pod_info(pod)
        if uid and version:
            self._latest = (uid, version, info)
        return info


class OnePerKey(Mapping[K, V]):
    """A kopf index holding one value per key, read as a plain mapping without copying it:
    copying the GPU nodes for every workload every cycle showed in the operator's profile
    (bench/README.md)."""

    def __init__(self, index: Mapping[K, Iterable[V]]) -> None:
        self._index = index

    def __getitem__(self, key: K) -> V:
        for value in self._index.get(key, ()):
            return value
        raise KeyError(key)

    def __iter__(self) -> Iterator[K]:
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._index)
