"""The measuring step's ledger: the energy it counts between two turns is the pods' recent
draw, read on its own, not the right-sizing window's mean."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import pytest
from gpusizer.api.v1alpha1 import WorkloadSizingSpec
from gpusizer.catalog.loader import load_catalog
from gpusizer.measurement import Measurer
from gpusizer.signals.parse import PodSamples, Problem, Sample
from gpusizer.signals.queries import ENERGY, POWER, PodQuery
from gpusizer.signals.reader import DRAW_WINDOW_FLOOR_SECONDS, HistoryCache
from gpusizer.throughput import ThroughputBook

from tests.fakes import FakeMetrics
from tests.unit.test_reconcile import NODE, NOW, NS, pod, spec, target
from tests.unit.test_report_metrics import scraped

WINDOW = 3600
SPEC = WorkloadSizingSpec.model_validate(spec(rightSizing={"historySeconds": WINDOW}))


@dataclass
class WindowedMetrics(FakeMetrics):
    """Each pod query answered by the window it asks over: `by_window[seconds][signal]`."""

    by_window: dict[int, dict[str, PodSamples]] | None = None

    async def per_pod_batch(
        self, wanted: Mapping[str, PodQuery]
    ) -> tuple[dict[str, PodSamples], dict[str, Problem]]:
        samples: dict[str, PodSamples] = {}
        for name, query in wanted.items():
            self.asked.append((name, query.promql))
            for seconds, answers in (self.by_window or {}).items():
                if f"[{seconds}s]" in query.promql and name in answers:
                    samples[name] = answers[name]
        return samples, {}


def watts(*values: tuple[str, float]) -> PodSamples:
    return PodSamples(samples={(NS, name): Sample(w, NOW) for name, w in values})


async def measured_joules(name: str, window_watts: float, draw_watts: float | None) -> float:
    """The ledger's energy counted for workload `name` over a turn 10 s after its first."""
    pods = [pod(f"{name}-a"), pod(f"{name}-b")]
    over_window = {POWER: watts(*((p.name, window_watts) for p in pods))}
    # an hour's energy to match the mean, so the efficiency figures read it, not the gauge
    over_window[ENERGY] = watts(*((p.name, window_watts * WINDOW * 1000) for p in pods))
    draw = {} if draw_watts is None else {POWER: watts(*((p.name, draw_watts) for p in pods))}
    source = WindowedMetrics(by_window={WINDOW: over_window, DRAW_WINDOW_FLOOR_SECONDS: draw})
    measurer = Measurer(load_catalog(), HistoryCache(source, 60, wall=lambda: NOW))
    book, key = ThroughputBook(), (NS, name)
    for previous, now in ((None, NOW), (NOW, NOW + 10)):
        found = await measurer.measure(
            SPEC, key, target(), pods, {NODE.name: NODE}, {}, book, previous, now
        )
    assert found.efficiency.watts == pytest.approx(2 * window_watts), "the window's, as before"
    return scraped(name, NS).get(("gpusizer_energy_joules_total", ()), 0.0)


async def test_the_ledger_counts_the_recent_draw_not_the_windows_mean() -> None:
    # two pods drawing 600 W each for the last minute, 100 W on average over the hour
    assert await measured_joules("busy-now", 100.0, 600.0) == pytest.approx(2 * 600.0 * 10)


async def test_without_a_recent_draw_the_ledger_counts_no_energy() -> None:
    assert await measured_joules("no-draw", 100.0, None) == 0.0
