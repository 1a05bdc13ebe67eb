"""The savings ledger: what a workload's pods held between two turns, and the ledger read back
from the operator's own series, per workload and fleet-wide."""

from __future__ import annotations

from typing import Any

import pytest
from gpusizer.catalog import Slice, load_catalog
from gpusizer.ledger import LedgerRow, fleet, held, ledger_rows
from gpusizer.signals.parse import LabelledValue
from gpusizer.signals.pods import PodInfo

from tests.unit.test_reconcile import NOW
from tests.unit.test_reconcile import pod as reconcile_pod

CATALOG = load_catalog()


def slice_(name: str) -> Slice:
    found = CATALOG.slice(name, "h100-80gb")
    assert found is not None
    return found


H100, MIG_3G = slice_("gpu-h100"), slice_("mig-3g.40gb")


def pod(name: str, age: float = 3600, **kw: Any) -> PodInfo:
    return reconcile_pod(name, created=NOW - age, **kw)


@pytest.mark.parametrize(
    ("label", "pods", "previous", "gpu_seconds", "idle_joules", "gpus_now"),
    [
        ("two H100s for 10 s", [(pod("a"), H100), (pod("b"), H100)], NOW - 10, 20, 1400, 2),
        # a 3g.40gb is half an H100 for its price, 3/7 of its compute for its idle draw
        ("a MIG slice counts as its share", [(pod("a"), MIG_3G)], NOW - 10, 5, 300, 0.5),
        # created 4 s ago, after the previous turn: counted from its creation
        ("a pod started since", [(pod("a", age=4), H100)], NOW - 10, 4, 280, 1),
        ("the first turn counts nothing", [(pod("a"), H100)], None, 0, 0, 1),
        # longer than the gap the ledger counts: another replica was in charge
        ("a long gap counts nothing", [(pod("a"), H100)], NOW - 3600, 0, 0, 1),
        ("a clock that went back counts nothing", [(pod("a"), H100)], NOW + 5, 0, 0, 1),
        ("an unscheduled pod holds nothing", [(pod("a", node=None), H100)], NOW - 10, 0, 0, 0),
        (
            "a terminating pod is gone for the ledger",
            [(pod("a", terminating=True), H100)],
            NOW - 10,
            0,
            0,
            0,
        ),
        ("a slice not in the catalog holds nothing known", [(pod("a"), None)], NOW - 10, 0, 0, 0),
    ],
)
def test_what_the_pods_held_since_the_previous_turn(
    label: str,
    pods: list[tuple[PodInfo, Slice | None]],
    previous: float | None,
    gpu_seconds: float,
    idle_joules: float,
    gpus_now: float,
) -> None:
    found = held(pods, previous, NOW, max_gap_seconds=120, watts=400.0)
    assert found.gpu_seconds == pytest.approx(gpu_seconds)
    assert found.idle_joules == pytest.approx(idle_joules)
    assert found.gpus == pytest.approx(gpus_now)
    assert found.cost == pytest.approx(gpu_seconds * 3.00 / 3600)
    assert found.joules == pytest.approx(400.0 * found.seconds)


def labelled(namespace: str, name: str, value: float) -> LabelledValue:
    return LabelledValue({"namespace": namespace, "name": name}, value)


def test_the_ledger_read_back_per_workload() -> None:
    # chat: 2 GPU-hours over 4 h followed, peak 1 GPU; used 1.8 kWh, idle of the extra 2 h 0.14
    answers = {
        "gpu_seconds_used": [labelled("llm", "chat", 7200)],
        "gpu_seconds_static": [labelled("llm", "chat", 14_400)],
        "cost_used": [labelled("llm", "chat", 6.0)],
        "cost_static": [labelled("llm", "chat", 12.0)],
        "joules_used": [labelled("llm", "chat", 1.8 * 3.6e6)],
        "idle_joules_extra": [labelled("llm", "chat", 70 * 7200)],
        "unrelated": [labelled("llm", "chat", 1)],
    }
    [row] = ledger_rows("24h", answers)
    assert row == LedgerRow(
        "llm",
        "chat",
        "24h",
        gpu_hours_used=2.0,
        gpu_hours_static=4.0,
        cost_used=6.0,
        cost_static=12.0,
        kwh_used=pytest.approx(1.8),
        kwh_static=pytest.approx(1.8 + 0.14),
    )
    assert row.saved(row.cost_used, row.cost_static) == 6.0


def test_a_workload_without_energy_has_no_kwh_but_keeps_its_gpu_hours() -> None:
    answers = {
        "gpu_seconds_used": [labelled("llm", "code", 3600)],
        "idle_joules_extra": [labelled("llm", "code", 1000)],
        "cost_used": [LabelledValue({"namespace": "llm"}, 1.0)],  # no name: not a workload's
    }
    [row] = ledger_rows("7d", answers)
    assert row.gpu_hours_used == 1.0 and row.kwh_used is None and row.kwh_static is None
    assert row.cost_used is None


def test_the_fleet_is_every_workload_at_its_own_peak() -> None:
    rows = [
        LedgerRow("a", "x", "24h", 1.0, 2.0, 3.0, 6.0, 0.5, None),
        LedgerRow("b", "y", "24h", 2.0, 2.0, 6.0, 6.0, None, None),
    ]
    total = fleet("24h", rows)
    assert (total.namespace, total.name) == ("", "")
    assert (total.gpu_hours_used, total.gpu_hours_static) == (3.0, 4.0)
    assert (total.cost_used, total.cost_static) == (9.0, 12.0)
    assert (total.kwh_used, total.kwh_static) == (0.5, None)
