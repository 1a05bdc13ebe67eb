"""The PromQL the operator sends is valid (promtool parses each as a recording rule), and the
right-sizing window reads what it says: increases of counters per pod, MIG series per instance."""

from __future__ import annotations

from pathlib import Path

from gpusizer.api.v1alpha1 import Server
from gpusizer.signals.queries import (
    GPU_UTIL,
    SERVER_COUNTERS,
    TIMESTAMP_LABEL,
    full_read_queries,
    history_queries,
    instance_queries,
    ledger_queries,
    queue_signal,
    request_rate_signal,
)

from tests.unit.test_docs import assert_valid_promql


def test_every_query_the_operator_sends_parses(tmp_path: Path) -> None:
    queries = [q.promql for q in full_read_queries(Server).values()]
    queries += [q.promql for q in history_queries(3600).values()]
    queries += list(instance_queries(3600).values())
    queries += list(ledger_queries(86400).values())
    assert_valid_promql("operator", queries, tmp_path)


def test_every_servers_counters_are_read_and_increases_are_taken_before_summing() -> None:
    history = history_queries(600)
    for signal, counters in SERVER_COUNTERS.items():
        promql = history[signal].promql
        for counter in filter(None, counters.values()):
            # increase() of each series, then the sum: a sum of counters has no resets to see
            assert f"increase({counter}[600s])" in promql
    assert 'DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{GPU_I_ID="", pod!=""}' in history["energy"].promql


def test_mig_energy_is_read_per_instance_never_summed_per_pod() -> None:
    for promql in instance_queries(600).values():
        assert promql.startswith("sum by (UUID, GPU_I_ID, GPU_I_PROFILE, modelName, namespace")
        assert 'GPU_I_ID!=""' in promql


def test_sampled_signals_ask_for_their_age_and_windowed_ones_do_not() -> None:
    queries = full_read_queries([Server.VLLM, Server.TRITON])
    for name in (GPU_UTIL, queue_signal(Server.VLLM)):
        assert TIMESTAMP_LABEL in queries[name].promql
        assert "timestamp(" in queries[name].promql
    for server in (Server.VLLM, Server.TRITON):
        promql = queries[request_rate_signal(server)].promql
        assert "timestamp(" not in promql and TIMESTAMP_LABEL not in promql, promql
        assert promql.count("rate(") == 1
