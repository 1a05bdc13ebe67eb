"""The per-condition series: exactly one per condition type, following status and reason."""

from __future__ import annotations

from gpusizer.report import metrics
from prometheus_client import REGISTRY


def shown(name: str) -> dict[tuple[str, str, str], float]:
    return {
        (s.labels["type"], s.labels["status"], s.labels["reason"]): s.value
        for family in REGISTRY.collect()
        if family.name == "gpusizer_condition"
        for s in family.samples
        if s.labels.get("name") == name
    }


def ready(status: str, reason: str) -> dict[str, str]:
    return {"type": "Ready", "status": status, "reason": reason}


def test_one_series_per_condition_follows_its_status_and_reason() -> None:
    metrics.set_conditions("ns", "cond-a", [ready("True", "Acting")])
    metrics.set_conditions("ns", "cond-a", [ready("True", "Acting")])  # unchanged
    assert shown("cond-a") == {("Ready", "True", "Acting"): 1.0}
    metrics.set_conditions("ns", "cond-a", [ready("False", "TargetNotFound")])
    assert shown("cond-a") == {("Ready", "False", "TargetNotFound"): 1.0}
    metrics.set_conditions("ns", "cond-a", [ready("False", "TargetNotFound")])
    assert shown("cond-a") == {("Ready", "False", "TargetNotFound"): 1.0}
    metrics.forget("ns", "cond-a")
    assert shown("cond-a") == {}
