"""The /scale view of a Deployment or StatefulSet, read from the object itself in one GET."""

from __future__ import annotations

from gpusizer.actuate.targets import _scale_of, selector_string
from gpusizer.signals.pods import matches_selector


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
