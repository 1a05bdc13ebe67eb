"""bench/ledger_cost.py writes every series the ledger's queries read, a week of each: a series
they read that the operator's exports (`report.metrics`) lack would measure queries over nothing."""

from __future__ import annotations

import io
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import ledger_cost as bench
from gpusizer.ledger import WINDOWS
from gpusizer.signals.queries import ledger_queries


def test_the_bench_writes_every_series_the_ledger_reads_for_a_week() -> None:
    out = io.StringIO()
    bench.write_series(out, workloads=2, scrape=3600)
    lines = out.getvalue().splitlines()
    written = {line.split("{")[0] for line in lines if not line.startswith("#")}
    read = {
        name
        for window in WINDOWS.values()
        for promql in ledger_queries(window).values()
        for name in re.findall(r"\b(gpusizer_\w+)\[", promql)
    }
    assert read and read <= written, read - written
    stamps = [int(line.split()[-1]) for line in lines if line.startswith(sorted(read)[0])]
    assert max(stamps) - min(stamps) >= max(WINDOWS.values()) - 3600
    assert lines[-1] == "# EOF"
