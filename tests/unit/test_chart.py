"""The Helm chart: lint, schema, hardening, RBAC, and drift against deploy/ and the CRD.

Needs helm (scripts/install-helm.sh builds it into ~/.cache/gpusizer/bin). Without it the
helm tests fail with the command to run: they are never skipped.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from gpusizer.api.crd import GPU_PARTITIONING, KINDS, crd_yaml
from gpusizer.cli import build_parser

from tests.unit.test_handlers import registered

REPO = Path(__file__).parents[2]
CHART = REPO / "charts" / "gpusizer"
DEPLOY = REPO / "deploy"
RELEASE = "gpusizer"
NAMESPACE = "gpusizer-system"
HELM_ONLY_LABELS = ("helm.sh/chart", "app.kubernetes.io/managed-by")


def helm_binary() -> str:
    """helm from GPUSIZER_HELM, the project's cache, or PATH; a clear failure otherwise."""
    candidates = [
        os.environ.get("GPUSIZER_HELM", ""),
        str(
            Path(os.environ.get("GPUSIZER_CACHE", Path.home() / ".cache" / "gpusizer"))
            / "bin"
            / "helm"
        ),
        shutil.which("helm") or "",
    ]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    pytest.fail(
        "helm is not built: run scripts/install-helm.sh (it `go install`s helm v3.21.4 into "
        "${GPUSIZER_CACHE:-~/.cache/gpusizer}/bin/helm), or set GPUSIZER_HELM"
    )


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [helm_binary(), *args], text=True, capture_output=True, timeout=120, check=False
    )
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{result.stderr}")
    return result


def set_args(values: dict[str, str]) -> list[str]:
    out: list[str] = []
    for key, value in values.items():
        out += ["--set-json", f"{key}={value}"]
    return out


@cache
def _render(sets: tuple[tuple[str, str], ...]) -> tuple[dict[str, Any], ...]:
    text = helm(
        "template", RELEASE, str(CHART), "--namespace", NAMESPACE, *set_args(dict(sets))
    ).stdout
    return tuple(d for d in yaml.safe_load_all(text) if d)


def render(**sets: str) -> list[dict[str, Any]]:
    """The chart's objects for `--set-json key=value` pairs (keys with dots passed as kwargs
    through a dict: render(**{"prometheus.url": '"http://x"'}))."""
    return list(_render(tuple(sorted(sets.items()))))


def find(objs: Iterable[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    matches = [o for o in objs if o["kind"] == kind and name in (None, o["metadata"]["name"])]
    assert len(matches) == 1, f"expected one {kind} {name or ''}, found {len(matches)}"
    return matches[0]


def container(objs: Iterable[dict[str, Any]], name: str = RELEASE) -> dict[str, Any]:
    """The operator's container (or, by its Deployment's name, the activator's)."""
    c: dict[str, Any] = find(objs, "Deployment", name)["spec"]["template"]["spec"]["containers"][0]
    return c


def normalise(obj: dict[str, Any]) -> dict[str, Any]:
    """Drop what only Helm adds: its labels and the checksum annotations."""
    obj = yaml.safe_load(yaml.safe_dump(obj))
    metas = [obj["metadata"]]
    if obj["kind"] == "Deployment":
        metas.append(obj["spec"]["template"]["metadata"])
    for meta in metas:
        labels = meta.get("labels") or {}
        for key in HELM_ONLY_LABELS:
            labels.pop(key, None)
        annotations = {
            k: v
            for k, v in (meta.get("annotations") or {}).items()
            if not k.startswith("checksum/")
        }
        meta.pop("annotations", None)
        if annotations:
            meta["annotations"] = annotations
    return obj


def key(obj: dict[str, Any]) -> tuple[str, str, str]:
    return obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"]


def deploy_objects() -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    objs = []
    for name in kustomization["resources"]:
        objs += [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]
    return objs


# --- files that need no helm ------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.kind)
def test_chart_crd_is_the_generated_crd(kind: Any) -> None:
    path = CHART / "crds" / kind.file_name
    assert path.read_text() == crd_yaml(kind), f"{path.relative_to(REPO)} is stale: run `make crds`"


def test_docs_alerts_are_the_charts_alerts() -> None:
    assert (REPO / "docs" / "alerts.yaml").read_text() == (
        CHART / "files" / "alerts.yaml"
    ).read_text(), "docs/alerts.yaml and charts/gpusizer/files/alerts.yaml differ: copy one"


def test_values_yaml_documents_every_top_level_key() -> None:
    text = (CHART / "values.yaml").read_text()
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line and not line.startswith((" ", "#")):
            above = [x for x in lines[max(0, i - 3) : i] if x.strip()]
            nested_docs = any(x.strip().startswith("# --") for x in lines[i : i + 4])
            assert (
                (above and above[-1].startswith("#"))
                or nested_docs
                or line.endswith(("{}", "[]", '""'))
            ), f"values.yaml: {line!r} has no comment"


# --- helm -------------------------------------------------------------------------------


def test_helm_lint_strict() -> None:
    result = helm("lint", "--strict", str(CHART), "--namespace", NAMESPACE)
    assert "0 chart(s) failed" in result.stdout


@pytest.mark.parametrize(
    "values",
    [
        {"watchNamespaces": '["llm","batch"]'},
        {"replicaCount": "2", "peering.enabled": "true"},
        {"metrics.serviceMonitor.enabled": "true", "prometheusRule.enabled": "true"},
        {"prometheus.bearerToken.secretName": '"prom-token"', "prometheus.ca.secretName": '"ca"'},
    ],
    ids=["namespaced", "peering", "monitoring", "auth"],
)
def test_helm_lint_variants(values: dict[str, str]) -> None:
    result = helm("lint", "--strict", str(CHART), *set_args(values))
    assert "0 chart(s) failed" in result.stdout


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"unknownKey": "1"}, "unknownKey"),
        ({"replicaCount": "0"}, "replicaCount"),
        ({"replicaCount": "2"}, "peering"),
        ({"image.pullPolicy": '"Sometimes"'}, "pullPolicy"),
        ({"prometheus.url": '"prometheus:9090"'}, "url"),
        ({"watchNamespaces": '["Not_A_Namespace"]'}, "watchNamespaces"),
        ({"watchNamespaces": '["a","a"]'}, "watchNamespaces"),
        ({"logging.level": '"verbose"'}, "level"),
        ({"metrics.port": "70000"}, "port"),
        ({"resources.requests.memory": "null"}, "memory"),
        ({"prometheus.ca.configMapName": '"a"', "prometheus.ca.secretName": '"b"'}, "ca"),
        (
            {
                "prometheus.bearerToken.secretName": '"a"',
                "prometheus.basicAuth.secretName": '"b"',
            },
            "prometheus",
        ),
        ({"metrics.serviceMonitor.interval": '"often"'}, "interval"),
        ({"syncPeriodSeconds": "0"}, "syncPeriodSeconds"),
        ({"readPeriodSeconds": "0"}, "readPeriodSeconds"),
        ({"queries.tenantLabel": '"not a label"'}, "tenantLabel"),
    ],
)
def test_schema_rejects_bad_values(values: dict[str, str], complaint: str) -> None:
    result = helm("template", RELEASE, str(CHART), *set_args(values), check=False)
    assert result.returncode != 0, f"accepted {values}"
    assert "schema" in result.stderr and complaint in result.stderr, result.stderr


def test_the_read_period_is_passed_and_may_not_exceed_the_sync_period() -> None:
    assert "--read-period=2.5" in container(render(readPeriodSeconds="2.5"))["args"]
    assert not any(a.startswith("--read-period") for a in container(render())["args"])
    result = helm(
        "template",
        RELEASE,
        str(CHART),
        *set_args({"readPeriodSeconds": "20", "syncPeriodSeconds": "15"}),
        check=False,
    )
    assert result.returncode != 0
    assert "readPeriodSeconds must be at most syncPeriodSeconds" in result.stderr


def test_default_render_matches_deploy_manifests() -> None:
    """deploy/ (for kubectl apply -k) is the chart's default render, plus the namespace and the
    generated CRD."""
    chart = {key(o): normalise(o) for o in render()}
    plain = {
        key(o): normalise(o)
        for o in deploy_objects()
        if o["kind"] not in ("Namespace", "CustomResourceDefinition")
    }
    assert sorted(plain) == sorted(chart), "deploy/ and the chart render different objects"
    for k, obj in chart.items():
        assert plain[k] == obj, f"deploy/ differs from `helm template` for {k}"


def test_deploy_kustomization_lists_namespace_and_crds() -> None:
    objs = deploy_objects()
    assert find(objs, "Namespace", NAMESPACE)
    for kind in KINDS:
        crd = find(objs, "CustomResourceDefinition", f"{kind.plural}.gpusizer.io")
        assert yaml.safe_dump(crd) == yaml.safe_dump(yaml.safe_load(crd_yaml(kind)))
    partitionings = yaml.safe_load((DEPLOY / "crd-gpupartitionings.yaml").read_text())
    assert partitionings == yaml.safe_load(crd_yaml(GPU_PARTITIONING))


def test_default_deployment_is_hardened() -> None:
    objs = render()
    deployment = find(objs, "Deployment", RELEASE)
    spec = deployment["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"] == {"type": "Recreate"}
    pod = spec["template"]["spec"]
    assert pod["serviceAccountName"] == "gpusizer"
    # the kubelet's GPUSIZER_METRICS_PORT=tcp://... for the Service gpusizer-metrics would
    # be read as --metrics-port: the operator exited at start on a real node
    assert pod["enableServiceLinks"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] > 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    c = container(objs)
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert "add" not in c["securityContext"]["capabilities"]
    assert set(c["resources"]["requests"]) == {"cpu", "memory"}
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    for probe in ("livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert f"--health-address=0.0.0.0:{ports['health']}" in c["args"]
    assert f"--metrics-port={ports['metrics']}" in c["args"]
    assert c["args"][0] == "run"
    assert not any(a.startswith("--peering") for a in c["args"])
    assert not any(a.startswith("--namespace") for a in c["args"])
    service = find(objs, "Service", f"{RELEASE}-metrics")
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]


def _flags(command: str = "run") -> set[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {s for a in sub.choices[command]._actions for s in a.option_strings}


@pytest.mark.parametrize(
    "values",
    [
        {},
        {
            "watchNamespaces": '["llm"]',
            "peering.enabled": "true",
            "prometheus.bearerToken.secretName": '"t"',
            "prometheus.ca.configMapName": '"ca"',
            "queries.allowCrossNamespace": "true",
            "queries.tenantLabel": '"exported_namespace"',
            "readPeriodSeconds": "2.5",
        },
    ],
    ids=["default", "everything"],
)
def test_every_arg_the_chart_passes_is_a_flag_of_its_command(values: dict[str, str]) -> None:
    objs = render(**values)
    for name, command in ((RELEASE, "run"), (f"{RELEASE}-activator", "activator")):
        args = container(objs, name)["args"]
        assert args[0] == command
        flags = _flags(command)
        unknown = [a for a in args[1:] if a.split("=", 1)[0] not in flags]
        assert not unknown, f"the chart passes flags `gpusizer {command}` lacks: {unknown}"


def _rules(objs: Iterable[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [
        (f"{o['kind']} {o['metadata'].get('namespace', '')}/{o['metadata']['name']}", r)
        for o in objs
        if o["kind"] in ("ClusterRole", "Role")
        for r in o["rules"]
    ]


@pytest.mark.parametrize(
    "values",
    [{}, {"watchNamespaces": '["llm","batch"]', "peering.enabled": "true"}],
    ids=["cluster", "namespaced"],
)
def test_rbac_has_no_wildcards_and_no_secrets(values: dict[str, str]) -> None:
    rules = _rules(render(**values))
    assert rules
    for where, rule in rules:
        for field in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule.get(field, []), f"{where}: wildcard in {field}: {rule}"
        assert "secrets" not in rule["resources"], f"{where}: secrets: {rule}"
        # it posts events, evicts pods from nodes it re-partitions, writes the EndpointSlices
        # that point Services at the activator, and creates its Lease (with peering)
        used = {
            "leases": {"create"},
            "events": {"create"},
            "pods/eviction": {"create"},
            "endpointslices": {"create", "delete"},
        }
        allowed = used.get(rule["resources"][0], set()) if len(rule["resources"]) == 1 else set()
        assert not {"delete", "deletecollection", "create", "escalate", "bind", "impersonate"} & (
            set(rule["verbs"]) - allowed
        ), f"{where}: a verb the operator never uses: {rule}"


def test_rbac_rules_are_commented() -> None:
    """Every rule in the RBAC template says why (a comment right above it, or shared with the
    rule above it in the same comment block)."""
    text = (CHART / "templates" / "rbac.yaml").read_text().splitlines()
    for i, line in enumerate(text):
        if line.strip().startswith("- apiGroups:"):
            above = text[i - 1].strip()
            assert above.startswith("#") or above.startswith("verbs:"), f"line {i + 1}: {line}"
    comments = sum(1 for x in text if x.strip().startswith("# "))
    rules = sum(1 for x in text if x.strip().startswith("- apiGroups:"))
    assert comments * 2 >= rules


def grants(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_cluster_role_matches_the_operators_access() -> None:
    granted = grants(find(render(), "ClusterRole", "gpusizer"))
    needed = {
        ("gpusizer.io", "workloadsizings", "watch"),
        ("gpusizer.io", "workloadsizings/status", "patch"),
        ("", "pods", "watch"),
        ("apps", "deployments", "get"),
        ("apps", "deployments/scale", "update"),
        ("apps", "statefulsets/scale", "update"),
        ("autoscaling", "horizontalpodautoscalers", "list"),
        ("keda.sh", "scaledobjects", "list"),
        ("", "events", "create"),
        ("apiextensions.k8s.io", "customresourcedefinitions", "watch"),
        ("", "nodes", "watch"),
        ("apps", "deployments", "patch"),  # rightSizing.mode Auto moves the pod template
        ("gpusizer.io", "gpupartitionings", "watch"),
        ("gpusizer.io", "gpupartitionings/status", "patch"),
        ("", "nodes", "patch"),  # cordon, nvidia.com/mig.config, the re-partition record
        ("", "pods/eviction", "create"),  # the drain, PodDisruptionBudgets respected
        ("", "configmaps", "patch"),  # the mig-parted configs
    }
    assert needed <= granted, needed - granted
    for verb in ("create", "update", "delete"):
        assert ("apps", "deployments", verb) not in granted
    for verb in ("delete", "update"):
        assert ("", "nodes", verb) not in granted and ("", "pods", verb) not in granted


def test_the_mig_parted_configmap_is_the_only_one_the_operator_may_touch() -> None:
    objs = render(**{"partitioning.migConfigMap": '{"namespace": "gpu", "name": "mig"}'})
    rules = [
        r for r in find(objs, "ClusterRole", RELEASE)["rules"] if "configmaps" in r["resources"]
    ]
    assert rules == [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": ["mig"],
            "verbs": ["get", "patch"],
        }
    ]
    assert "--mig-config-map=gpu/mig" in container(objs)["args"]


def watched_by_the_operator(partitioning: bool = True) -> set[tuple[str, str]]:
    registry = registered(partitioning=partitioning)
    handlers = [
        *registry._indexing.get_all_handlers(),
        *registry._watching.get_all_handlers(),
        *registry._spawning.get_all_handlers(),
    ]
    return {(h.selector.group or "", h.selector.any_name or "") for h in handlers}


@pytest.mark.parametrize("values", [{}, {"watchNamespaces": '["llm"]'}])
def test_every_resource_the_operator_watches_may_be_listed_and_watched(
    values: dict[str, str],
) -> None:
    """kopf lists then watches every resource it indexes or handles; without both verbs it
    retries the forbidden watch forever and the index never fills."""
    objs = render(**values)
    granted = set().union(*(grants(o) for o in objs if o["kind"] in ("ClusterRole", "Role")))
    watched = watched_by_the_operator(partitioning="watchNamespaces" not in values)
    assert ("apps", "deployments") in watched and ("apps", "statefulsets") in watched
    missing = {(g, r, v) for g, r in watched for v in ("list", "watch")} - granted
    assert not missing, missing


def test_reshape_permission_can_be_turned_off() -> None:
    granted = grants(find(render(**{"rightSizing.allowReshape": "false"}), "ClusterRole", RELEASE))
    assert ("apps", "deployments", "patch") not in granted
    assert ("apps", "deployments/scale", "update") in granted


def test_namespaced_mode_uses_roles_and_namespace_flags() -> None:
    objs = render(watchNamespaces='["llm","batch"]')
    args = container(objs)["args"]
    assert "--namespace=llm" in args and "--namespace=batch" in args
    for ns in ("llm", "batch"):
        role = find((o for o in objs if o["metadata"].get("namespace") == ns), "Role", RELEASE)
        binding = find(
            (o for o in objs if o["metadata"].get("namespace") == ns), "RoleBinding", RELEASE
        )
        assert binding["roleRef"]["name"] == role["metadata"]["name"]
        assert binding["subjects"][0]["namespace"] == NAMESPACE
        assert any("workloadsizings/status" in r["resources"] for r in role["rules"])
    cluster_role = find(objs, "ClusterRole", RELEASE)
    cluster_resources = {res for r in cluster_role["rules"] for res in r["resources"]}
    # Only what cannot be namespaced stays cluster-wide (see docs/operations.md).
    assert cluster_resources == {
        "customresourcedefinitions",
        "namespaces",
        "nodes",
        "horizontalpodautoscalers",
        "scaledobjects",
    }


def test_peering_flag_and_objects() -> None:
    objs = render(**{"replicaCount": "2", "peering.enabled": "true"})
    assert "--peering=gpusizer" in container(objs)["args"]
    assert f"--lease={NAMESPACE}/gpusizer" in container(objs)["args"]
    lease_role = find(objs, "Role", f"{RELEASE}-lease")
    assert lease_role["metadata"]["namespace"] == NAMESPACE
    named = next(r for r in lease_role["rules"] if r.get("resourceNames"))
    assert (named["resources"], named["resourceNames"], set(named["verbs"])) == (
        ["leases"],
        ["gpusizer"],
        {"get", "update"},
    )
    binding = find(objs, "RoleBinding", f"{RELEASE}-lease")
    assert binding["roleRef"]["name"] == f"{RELEASE}-lease"
    assert binding["subjects"][0]["name"] == RELEASE
    assert find(objs, "Deployment", RELEASE)["spec"]["replicas"] == 2
    assert find(objs, "ClusterKopfPeering", "gpusizer")
    namespaced = render(**{"peering.enabled": "true", "watchNamespaces": '["llm"]'})
    peering = find(namespaced, "KopfPeering", "gpusizer")
    assert peering["metadata"]["namespace"] == "llm"
    crds = list(yaml.safe_load_all((CHART / "crds" / "kopf.dev_peerings.yaml").read_text()))
    assert {c["spec"]["names"]["kind"] for c in crds} == {"ClusterKopfPeering", "KopfPeering"}


def test_host_network_is_off_unless_asked_for() -> None:
    pod = find(render(), "Deployment", RELEASE)["spec"]["template"]["spec"]
    assert "hostNetwork" not in pod and "dnsPolicy" not in pod
    pod = find(render(hostNetwork="true"), "Deployment", RELEASE)["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True
    assert pod["dnsPolicy"] == "ClusterFirstWithHostNet", "cluster DNS stays reachable"


def test_prometheus_connection_settings() -> None:
    objs = render(
        **{
            "prometheus.url": '"https://prom.example:9090"',
            "prometheus.bearerToken.secretName": '"prom-token"',
            "prometheus.ca.configMapName": '"prom-ca"',
        }
    )
    c = container(objs)
    pod = find(objs, "Deployment", RELEASE)["spec"]["template"]["spec"]
    assert "--prometheus-url=https://prom.example:9090" in c["args"]
    assert "--prometheus-bearer-token-file=/etc/gpusizer/prometheus-token/token" in c["args"]
    assert "--prometheus-ca-file=/etc/gpusizer/prometheus-ca/ca.crt" in c["args"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["prometheus-token"]["secret"]["secretName"] == "prom-token"
    assert volumes["prometheus-ca"]["configMap"]["name"] == "prom-ca"
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["prometheus-token"]["readOnly"] is True

    basic = container(render(**{"prometheus.basicAuth.secretName": '"prom-basic"'}))
    env = {e["name"]: e for e in basic["env"]}
    assert env["GPUSIZER_PROMETHEUS_BASIC_AUTH_USER"]["valueFrom"]["secretKeyRef"] == {
        "name": "prom-basic",
        "key": "username",
    }
    assert (
        env["GPUSIZER_PROMETHEUS_BASIC_AUTH_PASSWORD_FILE"]["value"]
        == "/etc/gpusizer/prometheus-basic-auth/password"
    )
    assert not any("token" in a for a in basic["args"])


def test_catalog_override_is_mounted_and_loads(tmp_path: Path) -> None:
    from gpusizer.catalog.loader import load_catalog

    override = '{"products": {"h100-80gb": {"price_per_hour": 9.5}}}'
    objs = render(**{"catalog.override": override})
    config = find(objs, "ConfigMap", "gpusizer-catalog")
    text = config["data"]["catalog.yaml"]
    assert yaml.safe_load(text) == yaml.safe_load(override)
    path = tmp_path / "catalog.yaml"
    path.write_text(text)
    catalog = load_catalog(path)  # the operator's own loader accepts what the chart renders
    assert catalog.products["h100-80gb"].price_per_hour == 9.5
    c = container(objs)
    assert {"name": "GPUSIZER_CATALOG_FILE", "value": "/etc/gpusizer/catalog.yaml"} in c["env"]
    mount = next(m for m in c["volumeMounts"] if m["name"] == "catalog")
    assert mount["mountPath"] == "/etc/gpusizer/catalog.yaml"
    # A changed override restarts the operator.
    default = find(render(), "Deployment", RELEASE)["spec"]["template"]["metadata"]["annotations"]
    changed = find(objs, "Deployment", RELEASE)["spec"]["template"]["metadata"]["annotations"]
    assert default["checksum/catalog"] != changed["checksum/catalog"]


def test_service_monitor_and_prometheus_rule() -> None:
    assert not [o for o in render() if o["kind"] in ("ServiceMonitor", "PrometheusRule")]
    objs = render(
        **{
            "metrics.serviceMonitor.enabled": "true",
            "metrics.serviceMonitor.labels": '{"release": "kube-prometheus-stack"}',
            "prometheusRule.enabled": "true",
            "prometheusRule.alertLabels": '{"team": "ml"}',
        }
    )
    monitor = find(objs, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    # the ledger and the dashboards group by the workload's namespace label
    assert monitor["spec"]["endpoints"][0]["honorLabels"] is True
    service = find(objs, "Service", f"{RELEASE}-metrics")
    assert all(
        service["metadata"]["labels"].get(k) == v
        for k, v in monitor["spec"]["selector"]["matchLabels"].items()
    )
    rule = find(objs, "PrometheusRule")
    alerts = yaml.safe_load((CHART / "files" / "alerts.yaml").read_text())
    rendered = rule["spec"]["groups"]
    assert [g["name"] for g in rendered] == [g["name"] for g in alerts["groups"]]
    for got, want in zip(rendered[0]["rules"], alerts["groups"][0]["rules"], strict=True):
        assert got["expr"] == want["expr"]
        assert got["labels"] == {**want["labels"], "team": "ml"}
        assert got["annotations"] == want["annotations"]


def test_notes_tell_the_user_what_to_do_next(tmp_path: Path) -> None:
    """NOTES.txt rendered through `helm template` (which otherwise leaves it out) from a copy
    of the chart; e2e/tests/test_install.py checks the real `helm install` prints it."""
    chart = tmp_path / "gpusizer"
    shutil.copytree(CHART, chart)
    (chart / "templates" / "notes-test.yaml").write_text(
        'notes: {{ include (print $.Template.BasePath "/NOTES.txt") . | toJson }}\n'
    )
    rendered = helm(
        "template", RELEASE, str(chart), "-n", NAMESPACE, "--show-only", "templates/notes-test.yaml"
    ).stdout
    notes = yaml.safe_load(rendered)["notes"]
    assert "kubectl -n gpusizer-system rollout status deployment/gpusizer" in notes
    assert "kind: WorkloadSizing" in notes
    assert "mode: Recommend" in notes
    assert "helm uninstall" in notes
    assert "serviceMonitor.enabled=true" in notes


# --- the activator ---------------------------------------------------------------------------

ACTIVATOR = f"{RELEASE}-activator"


def test_the_activator_runs_two_hardened_replicas_behind_a_disruption_budget() -> None:
    objs = render()
    deployment = find(objs, "Deployment", ACTIVATOR)
    spec = deployment["spec"]
    assert spec["replicas"] == 2
    assert spec["strategy"]["rollingUpdate"] == {"maxUnavailable": 0, "maxSurge": 1}
    pod = spec["template"]["spec"]
    assert pod["serviceAccountName"] == ACTIVATOR, "its own ServiceAccount, not the operator's"
    assert pod["securityContext"]["runAsNonRoot"] is True
    c = container(objs, ACTIVATOR)
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    drain = next(a for a in c["args"] if a.startswith("--drain-seconds="))
    assert float(drain.split("=")[1]) < pod["terminationGracePeriodSeconds"]
    budget = find(objs, "PodDisruptionBudget", ACTIVATOR)
    assert budget["spec"]["maxUnavailable"] == 1
    assert budget["spec"]["selector"]["matchLabels"] == spec["selector"]["matchLabels"]
    service = find(objs, "Service", ACTIVATOR)
    assert service["spec"]["selector"] == spec["selector"]["matchLabels"]
    assert f"--activator-service={NAMESPACE}/{ACTIVATOR}" in container(objs)["args"]
    assert pod["enableServiceLinks"] is False, "GPUSIZER_METRICS_PORT=tcp://... from a Service"
    # the operator's Deployment and metrics Service never select the activator's pods
    labels = spec["template"]["metadata"]["labels"]
    for selector in (
        find(objs, "Deployment", RELEASE)["spec"]["selector"]["matchLabels"],
        find(objs, "Service", f"{RELEASE}-metrics")["spec"]["selector"],
    ):
        assert not selector.items() <= labels.items(), selector


def test_the_activator_may_read_workloads_and_endpoints_and_annotate_workloads_only() -> None:
    objs = render()
    assert grants(find(objs, "ClusterRole", ACTIVATOR)) == {
        ("gpusizer.io", "workloadsizings", "list"),
        ("gpusizer.io", "workloadsizings", "watch"),
        ("gpusizer.io", "workloadsizings", "patch"),
        ("discovery.k8s.io", "endpointslices", "list"),
        ("discovery.k8s.io", "endpointslices", "watch"),
    }
    binding = find(objs, "ClusterRoleBinding", ACTIVATOR)
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": ACTIVATOR, "namespace": NAMESPACE}
    ]
    operator = grants(find(objs, "ClusterRole", RELEASE))
    assert ("discovery.k8s.io", "endpointslices", "create") in operator
    assert ("discovery.k8s.io", "endpointslices", "watch") not in operator, "only in its own ns"
    replicas = grants(find(objs, "Role", f"{RELEASE}-activator-replicas"))
    assert replicas == {
        ("discovery.k8s.io", "endpointslices", "list"),
        ("discovery.k8s.io", "endpointslices", "watch"),
    }


def test_the_activator_in_namespaced_mode_has_roles_and_namespace_flags() -> None:
    objs = render(watchNamespaces='["llm","batch"]')
    assert not [
        o for o in objs if o["kind"] == "ClusterRole" and o["metadata"]["name"] == ACTIVATOR
    ]
    for ns in ("llm", "batch"):
        role = next(
            o
            for o in objs
            if o["kind"] == "Role"
            and o["metadata"]["name"] == ACTIVATOR
            and o["metadata"]["namespace"] == ns
        )
        assert ("gpusizer.io", "workloadsizings", "patch") in grants(role)
        assert f"--namespace={ns}" in container(objs, ACTIVATOR)["args"]


def test_the_activator_can_be_left_out() -> None:
    objs = render(**{"activator.enabled": "false"})
    assert not [o for o in objs if "activator" in o["metadata"]["name"]]
    assert not any(a.startswith("--activator-service") for a in container(objs)["args"])
    operator = grants(find(objs, "ClusterRole", RELEASE))
    assert not {r for _, r, _ in operator} & {"endpointslices", "services"}
