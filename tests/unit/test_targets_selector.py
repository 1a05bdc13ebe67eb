"""The /scale view of a Deployment or StatefulSet, read from the object itself: from one GET, or
from the operator's watch of them."""

from __future__ import annotations

from typing import Any

from gpusizer.actuate.target_view import TargetView, _scale_of, selector_string, target_view
from gpusizer.api.v1alpha1 import TargetRef
from gpusizer.cluster import ClusterView
from gpusizer.signals.pods import matches_selector, requests_gpu


def test_selector_string_matches_what_the_scale_subresource_shows() -> None:
    selector = {
        "matchLabels": {"app": "chat", "tier": "gpu"},
        "matchExpressions": [
            {"key": "zone", "operator": "In", "values": ["b", "a"]},
            {"key": "canary", "operator": "NotIn", "values": ["true"]},
            {"key": "model", "operator": "Exists"},
            {"key": "legacy", "operator": "DoesNotExist"},
        ],
    }
    text = selector_string(selector)
    assert text == "app=chat,tier=gpu,zone in (a,b),canary notin (true),model,!legacy"
    pod = {"app": "chat", "tier": "gpu", "zone": "a", "model": "llama"}
    assert matches_selector(pod, text)
    assert not matches_selector({**pod, "legacy": "1"}, text)
    assert not matches_selector({**pod, "zone": "c"}, text)


def test_scale_of_a_deployment() -> None:
    obj = {
        "metadata": {"resourceVersion": "42"},
        "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "chat"}}},
    }
    assert _scale_of(obj) == {
        "spec": {"replicas": 3},
        "status": {"selector": "app=chat"},
        "metadata": {"resourceVersion": "42"},
    }
    assert _scale_of({"spec": {"replicas": 0}})["spec"]["replicas"] == 0
    assert _scale_of({"spec": {}})["spec"]["replicas"] == 1  # the API server's default


DEPLOYMENT = {
    "metadata": {
        "resourceVersion": "42",
        "generation": 7,
        "annotations": {
            "gpusizer.io/paused": "true",
            "gpusizer.io/reshape": '{"to": "mig-3g.40gb"}',
            "kubectl.kubernetes.io/last-applied-configuration": "{" + "x" * 10_000 + "}",
        },
    },
    "spec": {
        "replicas": 3,
        "selector": {"matchLabels": {"app": "chat"}},
        "template": {"spec": {"containers": [{"name": "vllm"}]}},
    },
}


def test_target_view_keeps_what_decisions_read_and_only_the_operators_annotations() -> None:
    view = target_view(DEPLOYMENT)
    assert view == TargetView(
        replicas=3,
        selector="app=chat",
        resource_version="42",
        annotations={"gpusizer.io/paused": "true", "gpusizer.io/reshape": '{"to": "mig-3g.40gb"}'},
        generation=7,
        pod_spec={"containers": [{"name": "vllm"}]},
    )


def test_watched_targets_are_served_from_the_watch_and_others_from_the_api_server() -> None:
    chat = target_view(DEPLOYMENT)
    db = TargetView(replicas=1, selector="app=db", resource_version="9")
    view = ClusterView(
        {}, {}, targets={"Deployment": {("llm", "chat"): chat}, "StatefulSet": {("llm", "db"): db}}
    )
    assert view.target("llm", TargetRef.model_validate({"name": "chat"})) is chat
    assert view.target("llm", TargetRef.model_validate({"kind": "StatefulSet", "name": "db"})) is db
    # not in the watch (yet): read from the API server, which says why if it does not exist
    assert view.target("other", TargetRef.model_validate({"name": "chat"})) is None
    assert view.target("llm", TargetRef.model_validate({"name": "db"})) is None
    # another API group's kind of the same name is not what the operator watches
    other_group = TargetRef.model_validate(
        {"apiVersion": "example.com/v1", "kind": "Deployment", "name": "chat"}
    )
    assert view.target("llm", other_group) is None
    assert ClusterView({}, {}).target("llm", TargetRef.model_validate({"name": "chat"})) is None


def test_only_targets_asking_for_an_nvidia_gpu_are_kept_in_the_watch_cache() -> None:
    def template(*resources: dict[str, Any]) -> dict[str, Any]:
        return {"containers": [{"name": f"c{i}", "resources": r} for i, r in enumerate(resources)]}

    assert requests_gpu(template({"limits": {"nvidia.com/gpu": "1"}}))
    assert requests_gpu(
        template({"limits": {"cpu": "1"}}, {"requests": {"nvidia.com/mig-1g.10gb": 1}})
    )
    assert not requests_gpu(template({"limits": {"cpu": "1", "memory": "1Gi"}}))
    assert not requests_gpu(template({}))
    assert not requests_gpu({})
    assert not requests_gpu(None)
