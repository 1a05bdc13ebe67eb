"""A WorkloadSizing's spec is validated once per generation, not once per cycle."""

from __future__ import annotations

from typing import Any

import pytest
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
