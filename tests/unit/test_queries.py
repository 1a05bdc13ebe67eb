"""The PromQL the operator sends is valid (promtool parses each as a recording rule), and the
right-sizing window reads what it says: increases of counters per pod, MIG series per instance."""

from __future__ import annotations

from pathlib import Path

from gpusizer.api.v1alpha1 import Server
from gpusizer.signals.queries import (
    GPU_UTIL,
    REPLICA_SIGNALS,
    SERVER_COUNTERS,
    TIMESTAMP_LABEL,
    batched_signals,
    full_read_queries,
    history_queries,
    instance_queries,
    ledger_queries,
    moved_values_query,
    moves_query,
    queue_signal,
    request_rate_signal,
)

from tests.unit.test_docs import assert_valid_promql


def test_every_query_the_operator_sends_parses(tmp_path: Path) -> None:
    queries = [q.promql for q in full_read_queries(Server).values()]
    queries += [q.promql for q in history_queries(3600).values()]
    queries += list(instance_queries(3600).values())
    queries += list(ledger_queries(86400).values())
    moving = {n: s for n, s in batched_signals(Server).items() if n in REPLICA_SIGNALS}
    for selector, _, combine in moving.values():
        queries.append(moves_query(selector, combine, 1.0, 4.0))
        queries.append(moved_values_query(selector, combine, None))
        queries.append(moved_values_query(selector, combine, {"web-0", "web.1", 'odd"\\name'}))
    assert_valid_promql("operator", queries, tmp_path)


def test_a_moved_read_names_its_pods_as_literals_on_either_pod_label() -> None:
    promql = moved_values_query('DCGM_FI_DEV_GPU_UTIL{pod!=""}', "mean", {"web.1", "web-0"})
    # RE2 reads an unescaped dot as any character: web.1 would name webx1 too
    names = '"web-0|web\\\\.1"'
    assert f'DCGM_FI_DEV_GPU_UTIL{{pod!="", pod=~{names}}}' in promql
    assert f'DCGM_FI_DEV_GPU_UTIL{{pod!="", exported_pod=~{names}}}' in promql
    queue = moved_values_query("vllm:num_requests_waiting", "sum", {"a"})
    assert queue.endswith(
        '(vllm:num_requests_waiting{pod=~"a"} or vllm:num_requests_waiting{exported_pod=~"a"})'
    )


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
