"""bench/partitioning.py's exact optimum is exact: checked on fleets small enough to know."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest
from gpusizer.catalog import layout_is_valid

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import partitioning as bench


def test_every_maximal_layout_is_valid_and_full() -> None:
    layouts = bench.maximal_layouts(bench.H100)
    assert ("1g.10gb",) * 7 in layouts and ("3g.40gb", "4g.40gb") in layouts
    assert ("7g.80gb",) in layouts and ("3g.40gb", "3g.40gb") in layouts
    assert ("4g.40gb", "4g.40gb") not in layouts
    mig = bench.H100.mig
    assert mig is not None
    for layout in layouts:
        assert layout_is_valid(bench.H100, list(layout))
        assert not any(layout_is_valid(bench.H100, [*layout, p]) for p in mig.profiles)


@pytest.mark.parametrize(
    ("wanted", "gpus"),
    [
        ({"3g.40gb": 3}, 2),
        ({"1g.10gb": 8}, 2),
        ({"4g.40gb": 2, "3g.40gb": 2}, 2),
        ({"gpu": 2, "1g.20gb": 4}, 3),
        ({"1g.10gb": 6, "1g.20gb": 1}, 1),
        ({"2g.20gb": 4}, 2),
    ],
)
def test_the_optimum_of_fleets_small_enough_to_know(wanted: dict[str, int], gpus: int) -> None:
    assert bench.optimum(Counter(wanted)) == gpus
