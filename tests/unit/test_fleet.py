"""The fleet report's pure parts: ownership and totals."""

from __future__ import annotations

from gpusizer.report.fleet import FleetRow, owners, render_table, totals


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
