"""The Makefile's benchmark targets pass their settings through whole."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def dry_run(*args: str) -> str:
    """The last command `make -n` prints: the target's own recipe, after its prerequisites'."""
    make = shutil.which("make")
    assert make is not None, "make is not installed"
    result = subprocess.run(
        [make, "-n", "--no-print-directory", "-C", str(REPO), *args],
        capture_output=True,
        text=True,
        check=True,
    )
    return result.stdout.strip().splitlines()[-1]


def test_bench_scale_runs_every_size_by_default() -> None:
    assert "bench/scale.py --sizes 100,1000,5000 --out bench-scale.json" in dry_run("bench-scale")


def test_bench_scale_takes_the_sizes_and_file_asked_for() -> None:
    command = dry_run("bench-scale", "SIZES=1000,5000", "OUT=/tmp/figures.json")
    assert "--sizes 1000,5000 --out /tmp/figures.json" in command


def test_bench_activator_writes_its_figures_where_asked() -> None:
    assert "bench/activator.py --out bench-activator.json" in dry_run("bench-activator")
    command = dry_run("bench-activator", "ACTIVATOR_OUT=/tmp/activator.json")
    assert command.endswith("bench/activator.py --out /tmp/activator.json")


def test_bench_partitioning_writes_the_file_asked_for() -> None:
    assert "bench/partitioning.py --out bench-partitioning.json" in dry_run("bench-partitioning")
    command = dry_run("bench-partitioning", "PARTITIONING_OUT=/tmp/p.json")
    assert command.endswith("bench/partitioning.py --out /tmp/p.json")
