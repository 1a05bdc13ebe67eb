"""The docs stay true: generated API reference, every reason explained, every metric documented,
alert and dashboard expressions valid PromQL (promtool) over series the operator exports."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from gpusizer.activator import metrics as activator_metrics
from gpusizer.report import metrics
from gpusizer.vocabulary import ConditionType, Reason
from prometheus_client.metrics import MetricWrapperBase

REPO = Path(__file__).parents[2]
DOCS = REPO / "docs"
ALERTS = DOCS / "alerts.yaml"
DASHBOARD = DOCS / "grafana-dashboard.json"


def promtool() -> str:
    found = os.environ.get("GPUSIZER_PROMTOOL") or shutil.which("promtool") or "/usr/bin/promtool"
    if not os.access(found, os.X_OK):
        pytest.fail("promtool is missing: `make prometheus` installs Debian's prometheus package")
    return found


def exported_metrics() -> dict[str, str]:
    """Series name -> type for everything in gpusizer.report.metrics (the operator's) and
    gpusizer.activator.metrics (the activator's)."""
    out: dict[str, str] = {}
    for value in [*vars(metrics).values(), *vars(activator_metrics).values()]:
        if isinstance(value, MetricWrapperBase):
            for family in value.describe():
                name = family.name
                if family.type == "counter":
                    name += "_total"
                out[name] = family.type
    out.update((family.exposed, family.kind) for family in metrics.WORKLOAD_FAMILIES)
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {
        slug(line.lstrip("#"))
        for line in path.read_text().splitlines()
        if re.match(r"^#{1,6} ", line)
    }


def gpusizer_series(expr: str) -> set[str]:
    names = set(re.findall(r"\bgpusizer_[a-z0-9_]+", expr))
    return {re.sub(r"_(bucket|sum|count)$", "", n) for n in names}


def rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(ALERTS.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def dashboard_exprs() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


# --- API reference ----------------------------------------------------------------------


def test_api_reference_is_generated_from_the_models() -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gen_api_docs.py")],
        text=True,
        capture_output=True,
        timeout=60,
        check=True,
    )
    assert (DOCS / "api-reference.md").read_text() == result.stdout, (
        "docs/api-reference.md is stale: .venv/bin/python scripts/gen_api_docs.py "
        "> docs/api-reference.md"
    )


def test_api_reference_covers_every_spec_field() -> None:
    from gpusizer.api.v1alpha1 import WorkloadSizingSpec

    text = (DOCS / "api-reference.md").read_text()
    for name, info in WorkloadSizingSpec.model_fields.items():
        assert f"| `{info.alias or name}` |" in text
    assert "self.min <= self.max" in text, "CEL rules are listed"


# --- troubleshooting --------------------------------------------------------------------


def test_every_reason_has_a_troubleshooting_section() -> None:
    headings = {
        line[4:].strip()
        for line in (DOCS / "troubleshooting.md").read_text().splitlines()
        if line.startswith("### ")
    }
    missing = [r.value for r in Reason if r.value not in headings]
    assert not missing, f"docs/troubleshooting.md has no `### <Reason>` section for {missing}"


def test_every_condition_type_has_a_section() -> None:
    headings = {
        line[3:].strip()
        for line in (DOCS / "troubleshooting.md").read_text().splitlines()
        if line.startswith("## ")
    }
    assert {c.value for c in ConditionType} <= headings


# --- metrics, alerts, dashboard ---------------------------------------------------------


def test_operations_documents_every_operator_metric() -> None:
    text = (DOCS / "operations.md").read_text()
    missing = [name for name in exported_metrics() if f"`{name}`" not in text]
    assert not missing, f"docs/operations.md does not document {missing}"


def test_alert_rules_pass_promtool(tmp_path: Path) -> None:
    result = subprocess.run(
        [promtool(), "check", "rules", str(ALERTS)],
        text=True,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules())} rules found" in result.stdout


def test_alerts_fire_on_what_users_must_act_on(tmp_path: Path) -> None:
    """promtool unit tests: the alerts fire on the series the operator exports."""
    tests = {
        "rule_files": [str(ALERTS)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {
                        "series": 'gpusizer_metrics_available{namespace="llm", name="chat"}',
                        "values": "0x30",
                    },
                    {
                        "series": 'gpusizer_metrics_available{namespace="llm", name="ok"}',
                        "values": "1x30",
                    },
                    {
                        "series": 'gpusizer_scale_writes_total{namespace="llm", name="chat", '
                        'result="error"}',
                        "values": "0+1x30",
                    },
                    {
                        "series": 'gpusizer_condition{namespace="llm", name="chat", '
                        'type="Ready", status="False", reason="ConflictingAutoscaler"}',
                        "values": "1x30",
                    },
                    {"series": 'up{job="gpusizer"}', "values": "0x30"},
                ],
                "alert_rule_test": [
                    {
                        "eval_time": "20m",
                        "alertname": "GpusizerMetricsUnavailable",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "severity": "warning",
                                    "namespace": "llm",
                                    "name": "chat",
                                },
                                "exp_annotations": rule_annotations(
                                    "GpusizerMetricsUnavailable", namespace="llm", name="chat"
                                ),
                            }
                        ],
                    },
                    {
                        "eval_time": "20m",
                        "alertname": "GpusizerScaleFailed",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "severity": "warning",
                                    "namespace": "llm",
                                    "name": "chat",
                                },
                                "exp_annotations": rule_annotations(
                                    "GpusizerScaleFailed", namespace="llm", name="chat"
                                ),
                            }
                        ],
                    },
                    {
                        "eval_time": "20m",
                        "alertname": "GpusizerConflictingAutoscaler",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "severity": "warning",
                                    "namespace": "llm",
                                    "name": "chat",
                                    "type": "Ready",
                                    "status": "False",
                                    "reason": "ConflictingAutoscaler",
                                },
                                "exp_annotations": rule_annotations(
                                    "GpusizerConflictingAutoscaler", namespace="llm", name="chat"
                                ),
                            }
                        ],
                    },
                    {"eval_time": "5m", "alertname": "GpusizerMetricsUnavailable"},
                    {
                        "eval_time": "20m",
                        "alertname": "GpusizerOperatorDown",
                        "exp_alerts": [
                            {
                                "exp_labels": {"severity": "critical"},
                                "exp_annotations": rule_annotations("GpusizerOperatorDown"),
                            }
                        ],
                    },
                ],
            }
        ],
    }
    path = tmp_path / "tests.yaml"
    path.write_text(yaml.safe_dump(tests))
    result = subprocess.run(
        [promtool(), "test", "rules", str(path)],
        text=True,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def rule_annotations(alert: str, **labels: str) -> dict[str, str]:
    rule = next(r for r in rules() if r["alert"] == alert)
    out = {}
    for key, value in rule["annotations"].items():
        for label, label_value in labels.items():
            value = value.replace(f"{{{{ $labels.{label} }}}}", label_value)
        out[key] = value
    return out


def test_alerts_use_only_exported_series() -> None:
    exported = exported_metrics()
    for rule in rules():
        unknown = gpusizer_series(rule["expr"]) - set(exported)
        assert not unknown, f"{rule['alert']} uses series the operator does not export: {unknown}"
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}
        assert rule["annotations"]["summary"]


def test_alert_runbooks_point_at_existing_sections() -> None:
    for rule in rules():
        page, _, anchor = rule["annotations"]["runbook"].partition("#")
        path = REPO / page
        assert path.exists(), rule["alert"]
        assert anchor in anchors(path), f"{rule['alert']}: no section #{anchor} in {page}"


def test_alerts_cover_what_users_must_act_on() -> None:
    exprs = " ".join(r["expr"] for r in rules())
    for needle in (
        "gpusizer_metrics_available",
        "ConflictingAutoscaler",
        "TargetNotFound",
        "gpusizer_scale_writes_total",
        "gpusizer_reconcile_errors_total",
    ):
        assert needle in exprs, needle


def test_dashboard_shows_every_operator_metric_and_gpu_use() -> None:
    exprs = dashboard_exprs()
    used = set().union(*(gpusizer_series(e) for e in exprs))
    assert used == set(exported_metrics()), set(exported_metrics()) ^ used
    text = " ".join(exprs)
    gpu_series = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_PROF_GR_ENGINE_ACTIVE")
    for series in (*gpu_series, "DCGM_FI_DEV_POWER_USAGE"):
        assert series in text


def assert_valid_promql(name: str, exprs: list[str], tmp_path: Path) -> None:
    """Each expression checked by promtool as a recording rule."""
    group = {
        "groups": [
            {
                "name": name,
                "rules": [{"record": f"{name}:query{i}", "expr": e} for i, e in enumerate(exprs)],
            }
        ]
    }
    path = tmp_path / f"{name}-rules.yaml"
    path.write_text(yaml.safe_dump(group))
    result = subprocess.run(
        [promtool(), "check", "rules", str(path)],
        text=True,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_dashboard_queries_are_valid_promql(tmp_path: Path) -> None:
    """Grafana's variables substituted."""
    substituted = [
        e.replace("$__rate_interval", "5m").replace("$namespace", ".*").replace("$name", ".*")
        for e in dashboard_exprs()
    ]
    assert_valid_promql("dashboard", substituted, tmp_path)


def test_dashboard_panels_are_laid_out_and_use_the_datasource_variable() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"datasource", "namespace", "name"} <= variables
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}"
            assert panel["targets"]


def test_concepts_give_the_formulas() -> None:
    text = (DOCS / "concepts.md").read_text()
    for formula in ("ceil(R * U / T_u)", "ceil(Q / T_q)", "max(P_u, P_q)", "maxReplicasPerStep"):
        assert formula in text


def test_getting_started_covers_kubectl_and_helm() -> None:
    text = (DOCS / "getting-started.md").read_text()
    assert "kubectl apply -k deploy/" in text
    assert "helm install gpusizer charts/gpusizer" in text
