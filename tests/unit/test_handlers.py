"""What the kopf handlers hand to reconcile."""

from __future__ import annotations

import inspect
import socket
import threading

import kopf
import urllib3
from gpusizer.handlers import (
    DECISION_GRACE_SECONDS,
    OnePerKey,
    OperatorSettings,
    Workload,
    instrument,
    register,
)
from gpusizer.reconcile import Cycle
from gpusizer.signals.discovery import NodeInfo
from gpusizer.signals.source import PrometheusSettings, Snapshot
from kopf._core.intents.handlers import DaemonHandler, TimerHandler
from kubernetes import client as k8s


def test_one_value_per_key_reads_an_index_without_copying_it() -> None:
    first = NodeInfo("gpu-a", "NVIDIA-H100-80GB-HBM3", {"nvidia.com/gpu": 8}, True)
    index: dict[str, list[NodeInfo]] = {"gpu-a": [first], "gpu-gone": []}
    nodes = OnePerKey(index)  # type: ignore[arg-type]  # a kopf.Index is a mapping of stores
    assert nodes["gpu-a"] is first
    assert nodes.get("gpu-gone") is None and nodes.get("cpu") is None
    assert list(nodes) == ["gpu-a", "gpu-gone"] and len(nodes) == 2
    index["gpu-b"] = [first]
    assert "gpu-b" in nodes  # a view: later index updates show


def registered(sync_period_seconds: float = 15) -> kopf.OperatorRegistry:
    """The handlers `gpusizer run` registers, in a registry of their own."""
    previous = kopf.get_default_registry()
    registry = kopf.OperatorRegistry()
    kopf.set_default_registry(registry)
    try:
        register(
            OperatorSettings(
                PrometheusSettings(url="http://prometheus"),
                sync_period_seconds=sync_period_seconds,
            )
        )
    finally:
        kopf.set_default_registry(previous)
    return registry


def test_a_workload_is_urgent_when_a_pod_it_read_moved_or_it_read_none() -> None:
    body = kopf.Body({})
    logger = kopf.LocalObjectLogger(body=body, settings=kopf.OperatorSettings())
    workload = Workload("ns", "chat", body, logger)
    moved = Cycle(Snapshot(time=0.0), autoscalers={}, moved=frozenset({("ns", "chat-1")}))
    assert workload.urgent(moved)  # not decided yet
    workload.pods = (("ns", "chat-0"),)
    assert not workload.urgent(moved)
    workload.pods = (("ns", "chat-0"), ("ns", "chat-1"))
    assert workload.urgent(moved)


def test_workloads_are_driven_by_the_cycle_clock_not_by_timers() -> None:
    registry = registered(sync_period_seconds=7)
    spawned = registry._spawning.get_all_handlers()
    assert not [h for h in spawned if isinstance(h, TimerHandler)]
    daemons = [h for h in spawned if isinstance(h, DaemonHandler)]
    assert [d.id for d in daemons] == ["size_workload"]
    # a failed decision is retried at the next period; one under way when kopf stops the daemon
    # (deleted, paused behind a peer) is given time to finish rather than being cancelled
    assert daemons[0].backoff == 7
    assert daemons[0].cancellation_backoff == DECISION_GRACE_SECONDS > 0


def test_no_handler_is_sent_to_a_thread() -> None:
    """kopf runs a plain function in a worker thread, behind a shielded task, for every event:
    the pod and target indexes see tens of thousands of events while 5,000 workloads start."""
    registry = registered()
    handlers = [
        *registry._activities.get_all_handlers(),
        *registry._indexing.get_all_handlers(),
        *registry._watching.get_all_handlers(),
        *registry._spawning.get_all_handlers(),
    ]
    assert len(handlers) >= 8
    assert [h.id for h in handlers if not inspect.iscoroutinefunction(h.fn)] == []


def test_a_request_to_a_silent_api_server_gives_up() -> None:
    """The client waits forever by default: a request the API server never answers (cut off
    by a restart or a partition) must end, with an error the caller reports."""
    silent = socket.create_server(("127.0.0.1", 0))  # connects, never answers
    configuration = k8s.Configuration(host=f"http://127.0.0.1:{silent.getsockname()[1]}")
    configuration.retries = False  # one attempt: the operator's client retries reads thrice
    client = k8s.ApiClient(configuration)
    instrument(client, timeout_seconds=0.2)
    outcome: list[BaseException] = []

    def request() -> None:
        try:
            k8s.CoreV1Api(client).list_namespace()
        except BaseException as exc:  # whatever ends it is the outcome
            outcome.append(exc)

    caller = threading.Thread(target=request, daemon=True)
    caller.start()
    caller.join(timeout=30)
    silent.close()  # resets the connection: a caller still waiting ends now
    assert not caller.is_alive() and outcome, "the request still waited after 30 s"
    assert isinstance(outcome[0], urllib3.exceptions.ReadTimeoutError), outcome
