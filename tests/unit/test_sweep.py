"""Pods kopf's cache kept after they were deleted while a watch was down: found by listing
what the API server has, and left out of every view of the cluster."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import replace
from types import SimpleNamespace

import pytest
from gpusizer.cluster import ClusterView
from gpusizer.partition.objects import GpuPod, present_pods
from gpusizer.report import metrics
from gpusizer.signals.pods import PodInfo
from gpusizer.sweep import PodSweep, listed_uids

NS = "llm"


def pod(name: str, uid: str, app: str = "chat") -> PodInfo:
    return PodInfo(
        namespace=NS,
        name=name,
        labels={"app": app},
        node="gpu-0",
        ready=True,
        terminating=False,
        phase="Running",
        gpu_resource="nvidia.com/gpu",
        gpu_container="server",
        oom_kills=0,
        uid=uid,
    )


LIVE, GHOST, OTHER = pod("chat-a", "u1"), pod("chat-b", "u2"), pod("embed-a", "u3", app="embed")


def view(gone: set[str]) -> ClusterView:
    return ClusterView(
        {NS: [LIVE, GHOST, OTHER]},
        {},
        pods_by_label={(NS, "app", "chat"): [LIVE, GHOST], (NS, "app", "embed"): [OTHER]},
        gone=gone,
    )


@pytest.mark.parametrize("selector", ["app=chat", "app in (chat)"], ids=["by label", "scan"])
def test_a_gone_pod_is_in_no_view_of_the_cluster(selector: str) -> None:
    assert view(set()).selected(NS, selector) == [LIVE, GHOST]
    assert view({"u2"}).selected(NS, selector) == [LIVE]
    assert list(view({"u2"}).all_pods()) == [LIVE, OTHER]


def test_the_partition_planner_sees_the_pod_that_replaced_a_gone_one() -> None:
    def gpu_pod(uid: str) -> GpuPod:
        return GpuPod(NS, "chat-0", "gpu-0", "nvidia.com/mig-3g.40gb", 1, False, None, uid)

    ghost, replacement = gpu_pod("u1"), gpu_pod("u2")  # a StatefulSet's pod, made again
    index = {"llm/chat-0": [ghost, replacement]}
    assert present_pods(index, {"u1"}) == [replacement]
    assert present_pods(index, set()) == [ghost, replacement]


def test_the_cached_pods_the_list_lacks_are_gone_and_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sweep = PodSweep()
    cached = {p.uid: p for p in (LIVE, GHOST, OTHER)}
    with caplog.at_level(logging.WARNING, logger="gpusizer.sweep"):
        sweep.found(cached, {"u1", "u3", "u4"})  # u4: created after the cache was read
        sweep.found(cached, {"u1", "u3"})
    assert sweep.gone == {"u2"}
    assert [r.getMessage() for r in caplog.records] == [
        "1 pod(s) deleted while a watch was down are still in the watch's cache; left out of "
        "every decision: llm/chat-b"
    ]
    assert metrics.PODS_MISSED_DELETIONS._value.get() == 1
    sweep.found({LIVE.uid: LIVE}, {"u1"})  # kopf dropped it after all
    assert sweep.gone == set()
    assert metrics.PODS_MISSED_DELETIONS._value.get() == 0


async def test_a_failed_sweep_is_said_once_keeps_what_was_found_and_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    swept = asyncio.Event()

    class Sweep(PodSweep):
        def found(self, cached: dict[str, PodInfo], listed: set[str]) -> None:
            super().found(cached, listed)
            swept.set()

    sweep = Sweep(gone={"u2"})
    answers: list[set[str] | Exception] = [
        OSError("refused"),
        OSError("refused"),
        TypeError("a bug"),
        {"u1", "u3"},
    ]
    asked: list[list[str]] = []

    def lister(namespaces: Iterable[str]) -> set[str]:
        asked.append(list(namespaces))
        answer = answers.pop(0) if len(answers) > 1 else answers[0]
        if isinstance(answer, Exception):
            assert sweep.gone == {"u2"}, "a failed list drops nothing"
            raise answer
        return answer

    cache = {NS: [LIVE, replace(GHOST, uid="u5"), OTHER]}  # u2 is gone from kopf's cache too
    with caplog.at_level(logging.WARNING, logger="gpusizer.sweep"):
        task = asyncio.create_task(sweep.run(cache, lister, every=0.001))
        await asyncio.wait_for(swept.wait(), 10)
        task.cancel()
    assert len(asked) >= 4 and all(namespaces == [NS] for namespaces in asked)
    assert sweep.gone == {"u5"}
    failures = [(r.getMessage(), r.exc_info is not None) for r in caplog.records]
    assert failures[:2] == [
        ("listing pods to find those the watch missed deleting failed: refused", False),
        ("the pod sweep failed; it runs again in 0s", True),  # the bug's traceback
    ]


def test_a_namespace_whose_list_is_null_holds_none() -> None:
    """The API server's metadata-only list of a namespace with nothing in it has "items":
    null (seen on the local cluster's kube-apiserver); the sweep failed on it every minute."""
    answers = {
        "empty": b'{"kind":"PartialObjectMetadataList","metadata":{},"items":null}',
        NS: b'{"metadata":{},"items":[{"metadata":{"uid":"u1"}},{"metadata":{"uid":"u3"}}]}',
    }

    def list_namespaced(namespace: str, **_: object) -> SimpleNamespace:
        return SimpleNamespace(data=answers[namespace])

    assert listed_uids(list_namespaced, ["empty", NS], page_size=500) == {"u1", "u3"}
