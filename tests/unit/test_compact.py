from __future__ import annotations

import json
from typing import Any

import kopf
from gpusizer.actuate.target_view import target_view
from gpusizer.compact import LONGEST_SHARED, compact
from gpusizer.signals.pods import pod_info

MESSAGE = "m" * (LONGEST_SHARED + 1)
OBJECT = {
    "metadata": {"name": "chat", "labels": {"app": "chat"}, "generation": 3},
    "spec": {
        "replicas": 2,
        "paused": False,
        "ratio": 0.5,
        "none": None,
        "template": {"spec": {"containers": [{"name": "vllm", "image": "vllm/vllm:0.9"}]}},
    },
    "status": {"conditions": [{"type": "Ready", "status": "True", "message": MESSAGE}]},
}


def decoded() -> Any:
    """A copy with its own strings, as each watch event's decoding makes one."""
    return json.loads(json.dumps(OBJECT))


def test_compact_copies_share_keys_and_short_strings_and_keep_every_value() -> None:
    one, two = compact(decoded()), compact(decoded())
    assert one == OBJECT and type(one["spec"]["paused"]) is bool
    (key_one, *_), (key_two, *_) = one, two
    assert key_one is key_two
    condition_one, condition_two = one["status"]["conditions"][0], two["status"]["conditions"][0]
    assert next(iter(condition_one)) is next(iter(condition_two))
    assert condition_one["status"] is condition_two["status"]
    assert (
        one["spec"]["template"]["spec"]["containers"][0]["image"]
        is (two["spec"]["template"]["spec"]["containers"][0]["image"])
    )
    assert condition_one["message"] is not condition_two["message"], "long ones stay apart"


def test_compact_makes_a_kopf_body_a_plain_dict() -> None:
    kept = compact(kopf.Body(decoded()))
    assert type(kept) is dict and type(kept["metadata"]) is dict
    assert type(kept["status"]["conditions"]) is list and kept == OBJECT


def test_what_target_views_and_pod_infos_keep_shares_its_strings() -> None:
    one, two = target_view(decoded()), target_view(decoded())
    assert one.pod_spec == OBJECT["spec"]["template"]["spec"]  # type: ignore[index]
    assert one.pod_spec is not None and two.pod_spec is not None
    assert next(iter(one.pod_spec)) is next(iter(two.pod_spec))
    first, second = pod_info(decoded()), pod_info(decoded())
    assert first.labels == {"app": "chat"}
    assert next(iter(first.labels)) is next(iter(second.labels))
    assert first.labels["app"] is second.labels["app"]
