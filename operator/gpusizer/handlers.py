"""Kopf registrations only: every decision lives in reconcile and below.

Registered by `register()` when the operator starts, so the sync period comes from settings
rather than from import time, and dependencies arrive through kopf's memo.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import kopf
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from prometheus_client import start_http_server

from gpusizer.actuate.targets import Targets
from gpusizer.api.v1alpha1 import GROUP, PLURAL, VERSION
from gpusizer.reconcile import CycleCache, Dependencies, reconcile
from gpusizer.report import metrics
from gpusizer.signals.autoscalers import AutoscalerLister
from gpusizer.signals.pods import PodInfo, pod_info
from gpusizer.signals.source import PrometheusSettings, PrometheusSource

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OperatorSettings:
    prometheus: PrometheusSettings
    sync_period_seconds: float = 15.0
    metrics_port: int = 8080
    peering: str | None = None  # a kopf peering name; None runs standalone


def _api_client() -> k8s.ApiClient:
    try:
        k8s_config.load_incluster_config()
    except k8s_config.ConfigException:
        k8s_config.load_kube_config()
    return k8s.ApiClient()


def register(settings: OperatorSettings) -> None:
    @kopf.on.startup()
    async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
        config: OperatorSettings = memo.config
        settings.posting.level = logging.CRITICAL  # log lines are not Events; we post our own
        if config.peering:
            settings.peering.name = config.peering
            settings.peering.standalone = False
            settings.peering.mandatory = True
        else:
            settings.peering.standalone = True
        api_client = _api_client()
        prometheus = PrometheusSource(config.prometheus)
        memo.deps = Dependencies(
            prometheus=prometheus,
            targets=Targets(api_client),
            cycles=CycleCache(
                prometheus, AutoscalerLister(api_client).list, config.sync_period_seconds
            ),
        )
        start_http_server(config.metrics_port)
        log.info(
            "gpusizer started: prometheus %s, sync every %ss",
            config.prometheus.url,
            config.sync_period_seconds,
        )

    @kopf.on.probe(id="prometheus")
    def prometheus_url(memo: kopf.Memo, **_: Any) -> str:
        config: OperatorSettings = memo.config
        return config.prometheus.url

    @kopf.index("", "v1", "pods")
    def pods_by_namespace(
        *, namespace: str | None, body: kopf.Body, **_: Any
    ) -> dict[str, PodInfo]:
        return {namespace or "": pod_info(body)}

    @kopf.timer(GROUP, VERSION, PLURAL, interval=settings.sync_period_seconds, sharp=True)
    async def size_workload(
        *,
        name: str,
        namespace: str | None,
        spec: kopf.Spec,
        status: kopf.Status,
        meta: kopf.Meta,
        body: kopf.Body,
        patch: kopf.Patch,
        memo: kopf.Memo,
        **kwargs: Any,
    ) -> None:
        pods_by_namespace: kopf.Index[str, PodInfo] = kwargs["pods_by_namespace"]
        assert namespace is not None  # WorkloadSizing is namespaced
        try:
            outcome = await reconcile(
                namespace,
                name,
                dict(spec),
                dict(status),
                dict(meta.annotations),
                meta.get("generation"),
                list(pods_by_namespace.get(namespace, [])),
                memo.deps,
            )
        except Exception:
            metrics.RECONCILE_ERRORS.labels(namespace, name).inc()
            raise
        for event in outcome.events:
            kopf.event(body, type=event.type, reason=event.reason.value, message=event.message)
        if outcome.status_patch:
            patch.status.update(outcome.status_patch)

    @kopf.on.event(GROUP, VERSION, PLURAL)
    def forget_deleted(*, type: str, name: str, namespace: str | None, **_: Any) -> None:
        if type == "DELETED" and namespace:
            metrics.forget(namespace, name)
