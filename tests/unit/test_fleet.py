"""The fleet report's pure parts: ownership and totals."""

from __future__ import annotations

import json
from dataclasses import replace

from gpusizer.ledger import LedgerRow, fleet
from gpusizer.report.fleet import (
    FleetRow,
    owners,
    render_json,
    render_ledger,
    render_table,
    totals,
)


def test_pods_resolve_to_their_deployment_through_the_replicaset() -> None:
    replica_sets = [
        {
            "metadata": {
                "namespace": "llm",
                "name": "chat-5c4b",
                "ownerReferences": [{"kind": "Deployment", "name": "chat", "controller": True}],
            }
        }
    ]
    pods = [
        {
            "metadata": {
                "uid": "u1",
                "namespace": "llm",
                "name": "chat-5c4b-x",
                "ownerReferences": [
                    {"kind": "ReplicaSet", "name": "chat-5c4b", "controller": True}
                ],
            }
        },
        {"metadata": {"uid": "u2", "namespace": "llm", "name": "bare"}},
        {
            "metadata": {
                "uid": "u3",
                "namespace": "llm",
                "name": "db-0",
                "ownerReferences": [{"kind": "StatefulSet", "name": "db", "controller": True}],
            }
        },
    ]
    assert owners(pods, replica_sets) == {
        "u1": ("llm", "Deployment", "chat"),
        "u2": ("llm", "Pod", "bare"),
        "u3": ("llm", "StatefulSet", "db"),
    }


def row(name: str, now: float | None, after: float | None) -> FleetRow:
    return FleetRow(
        "llm",
        "Deployment",
        name,
        None,
        "gpu-h100",
        "h100-80gb",
        2,
        12000.0,
        10.0,
        1.0,
        "mig-3g.40gb" if after else None,
        "h100-80gb",
        1,
        now,
        after,
        "why",
    )


def test_totals_keep_the_cost_of_workloads_without_a_recommendation() -> None:
    rows = [row("a", 4380.0, 1095.0), row("b", 2190.0, None)]
    assert totals(rows) == (6570.0, 3285.0)
    table = render_table(rows)
    assert "1 x mig-3g.40gb@h100-80gb" in table
    assert "$6,570/month now, $3,285/month after" in table


def test_the_table_shows_what_a_result_costs_now_and_after() -> None:
    measured = replace(
        row("a", 4380.0, 1095.0),
        per_result_now={"cost_per_1k_requests": 0.4567, "kwh_per_1k_requests": 0.0312},
        per_result_after={"cost_per_1k_requests": 0.1142, "kwh_per_1k_requests": None},
        unknown="output tokens: no series for 2 of 2 pods",
        throughput="Estimated",
    )
    table = render_table([measured])
    line = next(x for x in table.splitlines() if x.startswith("llm"))
    assert line.split()[-4:] == ["0.4567", "0.1142", "0.0312", "-"]
    assert "unknown: output tokens: no series for 2 of 2 pods" in table
    document = json.loads(render_json([measured], "EUR"))
    assert document["currency"] == "EUR" and "ledger" not in document
    assert document["workloads"][0]["per_result_after"]["cost_per_1k_requests"] == 0.1142


def test_the_ledger_per_workload_and_for_the_fleet() -> None:
    rows = [
        LedgerRow("llm", "chat", "24h", 2.0, 8.0, 6.0, 24.0, 0.5, 1.0),
        LedgerRow("llm", "code", "24h", 1.0, 2.0, 3.0, 6.0, None, None),
    ]
    text = render_ledger([*rows, fleet("24h", rows)], [], "USD")
    lines = text.splitlines()
    chat = next(x for x in lines if "llm/chat" in x).split()
    assert chat == ["24h", "llm/chat", "2.000", "8.000", "6.00", "24.00", "0.500", "1.000", "75%"]
    total = next(x for x in lines if x.startswith("24h") and "fleet" in x).split()
    assert total[2:6] == ["3.000", "10.000", "9.00", "30.00"] and total[-1] == "70%"
    assert "USD USED" in text


def test_no_ledger_says_why() -> None:
    assert "must scrape the operator" in render_ledger([], [], "USD")
    assert "24h/cost_used: down" in render_ledger([], ["24h/cost_used: down"], "USD")
