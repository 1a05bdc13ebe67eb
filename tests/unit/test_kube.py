"""Access to the API server: the client's time limit, and the shapes kopf's caches come in."""

from __future__ import annotations

import copy
import socket
import threading
from typing import Any

import pytest
import urllib3
from gpusizer.kube import IndexedPods, OnePerKey, drop_managed_fields, instrument
from gpusizer.signals.discovery import NodeInfo
from kubernetes import client as k8s

from tests.unit.test_handlers import workload_body


def test_one_value_per_key_reads_an_index_without_copying_it() -> None:
    first = NodeInfo("gpu-a", "NVIDIA-H100-80GB-HBM3", {"nvidia.com/gpu": 8}, True)
    index: dict[str, list[NodeInfo]] = {"gpu-a": [first], "gpu-gone": []}
    nodes = OnePerKey(index)  # a kopf.Index is such a mapping, of stores
    assert nodes["gpu-a"] is first
    assert nodes.get("gpu-gone") is None and nodes.get("cpu") is None
    assert list(nodes) == ["gpu-a", "gpu-gone"] and len(nodes) == 2
    index["gpu-b"] = [first]
    assert "gpu-b" in nodes  # a view: later index updates show


def pod_body(uid: str | None, version: str | None, ready: bool) -> dict[str, Any]:
    meta = {"name": "chat-1", "namespace": "llm", "labels": {"app": "chat"}}
    meta.update({k: v for k, v in (("uid", uid), ("resourceVersion", version)) if v})
    condition = {"type": "Ready", "status": "True" if ready else "False"}
    return {"metadata": meta, "status": {"phase": "Running", "conditions": [condition]}}


def test_the_pod_indexes_share_one_pod_info_per_version_of_a_pod() -> None:
    indexed = IndexedPods()
    first = indexed(pod_body("u1", "10", ready=False))
    assert indexed(pod_body("u1", "10", ready=False)) is first  # the next index, same event
    later = indexed(pod_body("u1", "11", ready=True))
    assert later is not first and later.ready and not first.ready
    other = indexed(pod_body("u2", "11", ready=False))
    assert other is not later and other.uid == "u2"


@pytest.mark.parametrize(("uid", "version"), [(None, "10"), ("u1", None), (None, None)])
def test_a_pod_without_uid_or_version_shares_nothing(uid: str | None, version: str | None) -> None:
    indexed = IndexedPods()
    first = indexed(pod_body(uid, version, ready=False))
    second = indexed(pod_body(uid, version, ready=True))
    assert second is not first and second.ready


def test_dropping_managed_fields_keeps_everything_else() -> None:
    event: dict[str, Any] = {"type": "MODIFIED", "object": workload_body("7", "f")}
    expected = copy.deepcopy(event)
    del expected["object"]["metadata"]["managedFields"]
    drop_managed_fields(event)
    assert event == expected


@pytest.mark.parametrize(
    "event",
    [{}, {"object": None}, {"object": "text"}, {"object": {"metadata": ["x"]}}, {"object": {}}],
)
def test_dropping_managed_fields_of_a_malformed_event_changes_nothing(
    event: dict[str, Any],
) -> None:
    before = copy.deepcopy(event)
    drop_managed_fields(event)
    assert event == before


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
