"""A WorkloadSizing's spec is validated once per generation, not once per cycle."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import pytest
from gpusizer.api.v1alpha1 import WorkloadSizingSpec
from gpusizer.memory import SpecCache
from pydantic import ValidationError


def raw(max_replicas: int) -> dict[str, Any]:
    replicas = {"min": 1, "max": max_replicas, "targetGPUUtilization": 70}
    return {"targetRef": {"name": "chat"}, "replicas": replicas}


def test_the_same_generation_is_not_validated_again() -> None:
    specs = SpecCache()
    first = specs.get("llm", "chat", 3, raw(4))
    assert specs.get("llm", "chat", 3, raw(4)) is first
    assert specs.get("llm", "other", 3, raw(4)) is not first  # another workload


def test_a_new_generation_is_validated_and_its_errors_are_raised() -> None:
    specs = SpecCache()
    specs.get("llm", "chat", 3, raw(4))
    assert specs.get("llm", "chat", 4, raw(6)).replicas.maximum == 6
    with pytest.raises(ValidationError):
        specs.get("llm", "chat", 5, raw(-1))
    with pytest.raises(ValidationError):  # a failure is not remembered as a success
        specs.get("llm", "chat", 5, raw(-1))


def test_without_a_generation_every_call_validates() -> None:
    specs = SpecCache()
    assert specs.get("llm", "chat", None, raw(4)) is not specs.get("llm", "chat", None, raw(4))


def test_a_forgotten_workload_is_validated_again() -> None:
    specs = SpecCache()
    first = specs.get("llm", "chat", 3, raw(4))
    specs.forget("llm", "chat")
    assert specs.get("llm", "chat", 3, raw(4)) is not first


def test_equal_parts_of_different_specs_are_one_object_for_as_long_as_one_is_held() -> None:
    specs = SpecCache()
    chat = specs.get("llm", "chat", 3, raw(4))
    code = specs.get("llm", "code", 1, raw(4) | {"targetRef": {"name": "code"}})
    embed = specs.get("llm", "embed", 1, raw(8) | {"targetRef": {"name": "embed"}})
    assert chat.replicas is code.replicas and chat.metrics is code.metrics
    assert chat.right_sizing is embed.right_sizing  # both at their defaults
    assert embed.replicas is not chat.replicas and embed.replicas.maximum == 8
    assert code.target_ref.name == "code" and chat.target_ref.name == "chat"
    assert code == WorkloadSizingSpec.model_validate(raw(4) | {"targetRef": {"name": "code"}})

    only_embeds = weakref.ref(embed.replicas)
    specs.forget("llm", "embed")
    del embed
    gc.collect()
    assert only_embeds() is None  # a part no spec holds is not kept for later ones
    again = specs.get("llm", "embed", 2, raw(8) | {"targetRef": {"name": "embed"}})
    assert again.replicas is not chat.replicas and again.replicas.maximum == 8
    assert again.right_sizing is chat.right_sizing
