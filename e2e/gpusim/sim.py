"""Ties the cluster source, devices, load model and exposition together, behind one lock."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpusizer.catalog import Catalog

from e2e.gpusim.cluster import (
    PRODUCT_LABEL,
    ClusterSource,
    NodeInfo,
    PodInfo,
    Rederived,
    WorkloadKey,
)
from e2e.gpusim.devices import Allocator, Device, DeviceKey, NodeDevices
from e2e.gpusim.exposition import PodServerReading, View
from e2e.gpusim.model import (
    MODEL_NAME,
    LoadModel,
    ModelConfig,
    Replica,
    ReplicaState,
    WorkloadState,
    annotation,
)
from e2e.gpusim.openai import DEFAULT_TOKEN_SECONDS, TOKEN_SECONDS, Served, ServingPod
from e2e.gpusim.telemetry import DeviceReading, device_readings
from e2e.gpusim.traces import ConstantRate, TraceRate, load_trace

log = logging.getLogger(__name__)


@dataclass
class Account:
    """What a workload's pods used while they held their devices: the power of their own
    devices (`DeviceReading.own_power_w`), their slices' price, and GPU-seconds (a slice counts
    as its share of its GPU)."""

    energy_joules: float = 0.0
    cost: float = 0.0
    gpu_seconds: float = 0.0


class Simulator:
    def __init__(
        self,
        source: ClusterSource,
        catalog: Catalog,
        config: ModelConfig | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.source = source
        self.catalog = catalog
        self.clock = clock
        self.model = LoadModel(config)
        self._allocator = Allocator()
        self._node_devices = NodeDevices(catalog)
        self._lock = threading.Lock()
        self._energy: dict[tuple[str, int], float] = {}
        self._accounts: dict[WorkloadKey, Account] = {}
        self._last: float | None = None
        self._pods: dict[str, PodInfo] = {}
        self._assignment: dict[str, list[Device]] = {}
        # each pod's replica and the node its slice was read from, made again only when the
        # pod or the node is another object; and each ready server's reading, made again only
        # when its pod or figures changed. Thousands of idle pods then cost a tick no new
        # objects: objects made at every tick were most of its garbage collections.
        self._replicas: dict[str, tuple[NodeInfo | None, Replica]] = {}
        self._server_readings: dict[str, tuple[PodInfo, PodServerReading]] = {}
        self._readings: dict[DeviceKey, DeviceReading] = {}  # the last tick's, by device
        # each Ready pod's server, derived again only when its PodInfo is another object
        self._serving: Rederived[PodInfo, ServingPod] = Rederived(_server)
        self._view = View(devices=[], energy_mj={}, servers=[], workloads={})
        self.served = Served()  # what the pods' HTTP endpoints answered
        # opens the inference servers of the pods that serve, before any is marked Ready (as a
        # readiness probe passes only once the server listens): openai.OpenAIEndpoints.update
        self.serve: Callable[[list[ServingPod]], None] = lambda _: None

    def view(self) -> View:
        """The last tick's view, without the lock: a tick replaces it whole, and a scrape must
        not wait for a tick in progress."""
        return self._view

    def step(self) -> None:
        """Advance to the clock's now: read the cluster, serve load, patch pods, refresh series."""
        snapshot = self.source.snapshot()
        with self._lock:
            now = self.clock()
            devices = self._node_devices.of(snapshot.nodes)
            pods = [p for p in snapshot.pods if not p.terminating]
            self._assignment = self._allocator.update(pods, devices)
            self._pods = {p.uid: p for p in pods}
            result = self.model.tick(now, self._placed(pods, snapshot.nodes))
            by_device = device_readings(
                devices, self._assignment, self._pods, self.model.replicas, self._readings
            )
            self._readings = by_device
            readings = list(by_device.values())
            dt = 0.0 if self._last is None else max(0.0, now - self._last)
            self._last = now
            seen: set[tuple[str, int]] = set()
            for reading in readings:
                gpu = (reading.device.node, reading.device.gpu)
                if gpu not in seen:
                    seen.add(gpu)
                    self._energy[gpu] = self._energy.get(gpu, 0.0) + reading.power_w * dt * 1000
                if reading.pod is not None:
                    self._account(reading, dt)
            self._view = View(
                devices=readings,
                energy_mj=dict(self._energy),
                servers=self._servers(pods),
                workloads=dict(self.model.workloads),
            )
        self.serve(self.serving())
        for pod in result.mark_ready:
            self._patch(self.source.mark_ready, pod)
        for pod in result.ooms:
            log.info("pod %s/%s: CUDA out of memory, restarting", pod.namespace, pod.name)
            self._patch(lambda p: self.source.record_oom(p, now), pod)

    def _placed(self, pods: list[PodInfo], nodes: Mapping[str, NodeInfo]) -> list[Replica]:
        """Each pod as a replica, with the slice its node's GPU gives it."""
        placed: dict[str, tuple[NodeInfo | None, Replica]] = {}
        for pod in pods:
            node = nodes.get(pod.node or "")
            known = self._replicas.get(pod.uid)
            if known is None or known[0] is not node or known[1].pod is not pod:
                label = node.labels.get(PRODUCT_LABEL, "") if node else ""
                found = self.catalog.slice_for(pod.resource, label) if node else None
                known = (node, Replica(pod=pod, slice=found))
            placed[pod.uid] = known
        self._replicas = placed
        return [replica for _, replica in placed.values()]

    def _account(self, reading: DeviceReading, dt: float) -> None:
        """What the device's pod used this tick: its own power, and its slice's price."""
        assert reading.pod is not None
        device = reading.device
        held = self.catalog.slice_for(device.resource, device.product.gfd_label)
        account = self._accounts.get(reading.pod.workload)
        if account is None:  # not setdefault: that would make an Account at every call
            account = self._accounts[reading.pod.workload] = Account()
        account.energy_joules += reading.own_power_w * dt
        if held is not None:
            account.cost += held.price_per_hour * dt / 3600
            account.gpu_seconds += held.share * dt

    def restart(self, namespace: str, name: str) -> bool:
        """Restart a pod's server, as a crash would; False when no such pod is emulated."""
        with self._lock:
            pod = next(
                (p for p in self._pods.values() if (p.namespace, p.name) == (namespace, name)),
                None,
            )
            at = self.clock()
            if pod is None or not self.model.restart(pod.uid, at):
                return False
        self._patch(lambda p: self.source.record_restart(p, at), pod)
        return True

    @staticmethod
    def _patch(action: Callable[[PodInfo], None], pod: PodInfo) -> None:
        try:
            action(pod)
        except Exception:  # the next tick retries; a vanished pod is not an emulator failure
            log.exception("patching pod %s/%s failed", pod.namespace, pod.name)

    def _servers(self, pods: list[PodInfo]) -> list[PodServerReading]:
        readings: dict[str, tuple[PodInfo, PodServerReading]] = {}
        for pod in pods:
            state = self.model.replicas.get(pod.uid)
            if state is None or not state.ready:
                continue
            known = self._server_readings.get(pod.uid)
            if known is None or known[0] is not pod or not _reads(known[1], state):
                known = (pod, _server_reading(pod, state))
            readings[pod.uid] = known
        self._server_readings = readings
        return [reading for _, reading in readings.values()]

    def serving(self) -> list[ServingPod]:
        """The pods ready to serve, with an IP: each serves the OpenAI API there (openai.py)."""
        with self._lock:
            return self._serving.of(
                (uid, pod)
                for uid, pod in self._pods.items()
                if (state := self.model.replicas.get(uid)) is not None and state.ready and pod.ip
            )

    def set_load(self, key: WorkloadKey, rps: float) -> None:
        with self._lock:
            self.model.set_rate(key, ConstantRate(rps))

    def forget_namespace(self, namespace: str) -> list[str]:
        """Drop the demand and backlog of every workload of a namespace (their names): a
        namespace created again starts without what its predecessor's workloads queued."""
        with self._lock:
            gone = [key for key in self.model.workloads if key[0] == namespace]
            for key in gone:
                del self.model.workloads[key]
            for key in [k for k in self._accounts if k[0] == namespace]:
                del self._accounts[key]
        self.served.forget(namespace)
        return sorted(name for _, name in gone)

    def replay(
        self,
        key: WorkloadKey,
        trace: Path,
        speedup: float,
        scale: float,
        offset: float = 0.0,
        loop: bool = False,
    ) -> float:
        """Start a trace now, `offset` seconds (of the trace) in; returns how long one pass
        lasts in wall seconds."""
        parsed = load_trace(trace)
        if offset >= parsed.duration:
            raise ValueError(f"offsetSeconds {offset:g} is past the trace's {parsed.duration:g}s")
        with self._lock:
            rate = TraceRate(parsed, self.clock(), speedup, scale, offset, loop)
            self.model.set_rate(key, rate)
        return (parsed.duration - offset) / speedup

    def describe_namespace(self, namespace: str) -> list[dict[str, Any]]:
        """Every workload of a namespace with a demand or replicas, as `describe` has it."""
        with self._lock:
            keys = {k for k in self.model.workloads if k[0] == namespace}
            keys |= {p.workload for p in self._pods.values() if p.namespace == namespace}
        return [self.describe(key) for key in sorted(keys)]

    def describe(self, key: WorkloadKey) -> dict[str, Any]:
        with self._lock:
            now = self.clock()
            state = self.model.workloads.get(key) or WorkloadState()
            pods = []
            for uid, pod in sorted(self._pods.items(), key=lambda item: item[1].name):
                replica = self.model.replicas.get(uid)
                if pod.workload != key or replica is None:
                    continue
                pods.append(
                    {
                        "name": pod.name,
                        "node": pod.node,
                        "slice": _slice_name(self._replicas.get(uid)),
                        "resource": pod.resource,
                        "devices": [
                            {"gpu": d.gpu, "uuid": d.uuid, "gpuInstanceId": d.instance_id}
                            for d in self._assignment.get(uid, [])
                        ],
                        "ready": replica.ready,
                        "oomKilled": replica.oom,
                        "restarts": replica.ooms,
                        "capacityRps": replica.capacity_rps,
                        "utilization": replica.utilisation,
                        "queue": replica.waiting,
                        "running": replica.running,
                        "memoryMiB": replica.memory_need_mib,
                    }
                )
            rate = state.rate
            account = self._accounts.get(key, Account())
            return {
                "namespace": key[0],
                "name": key[1],
                "requestsPerSecond": rate.rate(now),
                "replay": isinstance(rate, TraceRate),
                "queue": state.queue,
                "servedPerSecond": state.served_rps,
                "readyReplicas": state.ready_replicas,
                "gatewayPending": state.gateway_pending,
                "pods": pods,
                "viewedAt": self._last,  # the tick that read these pods from the cluster
                **self.served.describe(key),
                # since the emulator started, whatever the servers' restarts: ground truth
                "accounting": {
                    "servedRequests": state.served_total,
                    "outputTokens": state.output_tokens_total,
                    "promptTokens": state.prompt_tokens_total,
                    "energyJoules": account.energy_joules,
                    "cost": account.cost,
                    "gpuSeconds": account.gpu_seconds,
                    "time": now,
                },
            }

    def run(
        self, interval: float, stop: threading.Event, then: Callable[[], object] = lambda: None
    ) -> None:
        """Tick, and call `then` after each step, until stopped; a failing tick is logged and
        retried, never fatal."""
        while not stop.is_set():
            try:
                self.step()
                then()
            except Exception:
                log.exception("simulator tick failed")
            stop.wait(interval)


def _server(pod: PodInfo) -> ServingPod:
    assert pod.ip, "serving() gives only the pods with an IP"
    return ServingPod(
        uid=pod.uid,
        address=pod.ip,
        port=pod.http_port,
        workload=pod.workload,
        model=pod.annotations.get(MODEL_NAME, pod.workload[1]),
        token_seconds=annotation(pod.annotations, TOKEN_SECONDS, DEFAULT_TOKEN_SECONDS),
        running_since=pod.running_since or 0.0,
    )


def _server_reading(pod: PodInfo, state: ReplicaState) -> PodServerReading:
    return PodServerReading(
        namespace=pod.namespace,
        pod=pod.name,
        node=pod.node or "",
        model_name=pod.annotations.get(MODEL_NAME, pod.workload[1]),
        waiting=state.waiting,
        running=state.running,
        kv_cache_usage=state.kv_cache_usage,
        success_total=state.success_total,
        generation_tokens_total=state.generation_tokens_total,
        prompt_tokens_total=state.prompt_tokens_total,
    )


def _reads(reading: PodServerReading, state: ReplicaState) -> bool:
    """Whether a server's reading still says what its state does."""
    return (
        reading.waiting == state.waiting
        and reading.running == state.running
        and reading.kv_cache_usage == state.kv_cache_usage
        and reading.success_total == state.success_total
        and reading.generation_tokens_total == state.generation_tokens_total
        and reading.prompt_tokens_total == state.prompt_tokens_total
    )


def _slice_name(placed: tuple[NodeInfo | None, Replica] | None) -> str | None:
    found = placed[1].slice if placed else None
    return found.name if found else None
