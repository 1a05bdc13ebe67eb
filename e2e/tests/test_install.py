"""Installing gpusizer the way users do, on the real API server: Helm and `kubectl apply -k`.

Each install runs twice (idempotent), is checked object by object, and is uninstalled while a
user's Deployment (with a WorkloadSizing pointing at it) runs in another namespace: the
Deployment must come out untouched, replicas included. kwok pods execute nothing, so the
operator's pod becomes Running without running the operator (the operator itself is tested as
a host process in test_operator.py); what this proves is the objects, the Pod Security
admission of the pod, and the RBAC, against the real API server.

The kubectl install uses the fixed names the operator tests use (gpusizer-system/gpusizer), so
its uninstall pulls the CRD and the ServiceAccount from under the operators of
operator_support.py: the ``no_operators`` fixture stops any that run for this module, then puts
deploy/'s manifests back if they were there and starts the operators again.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from e2e.tests.conftest import REPO, Cluster, wait_until
from e2e.tests.operator_support import Operator, install_manifests, stop_operators

CHART = REPO / "charts" / "gpusizer"
DEPLOY = REPO / "deploy"
OPERATOR_NAMESPACE = "gpusizer-system"
OPERATOR_SA = f"system:serviceaccount:{OPERATOR_NAMESPACE}:gpusizer"
CRD = "workloadsizings.gpusizer.io"
USER_NAMESPACE = "install-user"


def helm_binary() -> str:
    cache = Path(os.environ.get("GPUSIZER_CACHE", Path.home() / ".cache" / "gpusizer"))
    for candidate in (os.environ.get("GPUSIZER_HELM", ""), str(cache / "bin" / "helm")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which("helm")
    if found:
        return found
    pytest.fail(
        "helm is not built: run scripts/install-helm.sh (it `go install`s helm v3.21.4 into "
        "${GPUSIZER_CACHE:-~/.cache/gpusizer}/bin/helm), or set GPUSIZER_HELM"
    )


@dataclass
class Helm:
    cluster: Cluster
    home: Path

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {
            **os.environ,
            "HELM_CACHE_HOME": str(self.home / "cache"),
            "HELM_CONFIG_HOME": str(self.home / "config"),
            "HELM_DATA_HOME": str(self.home / "data"),
        }
        result = subprocess.run(
            [helm_binary(), "--kubeconfig", str(self.cluster.kubeconfig), *args],
            text=True,
            capture_output=True,
            env=env,
            timeout=300,
            check=False,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)}:\n{result.stdout}\n{result.stderr}")
        return result

    def install(
        self, release: str, namespace: str, *options: str
    ) -> subprocess.CompletedProcess[str]:
        """`helm upgrade --install` of the chart, waiting for its Deployment."""
        return self(
            "upgrade",
            "--install",
            release,
            str(CHART),
            "--namespace",
            namespace,
            "--create-namespace",
            *options,
            "--wait",
            "--timeout",
            "180s",
        )


@pytest.fixture(scope="module", autouse=True)
def no_operators(cluster: Cluster) -> Iterator[None]:
    """No operator of operator_support.py runs during this module (it would act on the user's
    WorkloadSizing, and its ServiceAccount is deleted); what the module removes of the
    operator tests' set-up is put back afterwards, and the stopped operators start again (each
    start mints a token of the new ServiceAccount)."""
    installed = get(cluster, "crd", CRD) is not None and (
        get(cluster, "serviceaccount", "gpusizer", "-n", OPERATOR_NAMESPACE) is not None
    )
    stopped = stop_operators()
    try:
        yield
    finally:
        if installed:
            install_manifests(cluster)
        for operator in stopped:
            operator.start()


@pytest.fixture(scope="module")
def helm(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(cluster, tmp_path_factory.mktemp("helm"))


def get(cluster: Cluster, *args: str) -> dict[str, Any] | None:
    result = cluster.kubectl("get", *args, "-o", "json", check=False)
    if result.returncode != 0:
        if "NotFound" in result.stderr or "not found" in result.stderr:
            return None
        raise AssertionError(result.stderr)
    obj: dict[str, Any] = json.loads(result.stdout)
    return obj


def can_i(cluster: Cluster, user: str, *args: str) -> bool:
    result = cluster.kubectl("auth", "can-i", *args, f"--as={user}", check=False)
    answer = result.stdout.strip()
    assert answer in ("yes", "no"), f"kubectl auth can-i {args}: {result.stdout} {result.stderr}"
    return answer == "yes"


def access_review(cluster: Cluster, user: str, verb: str, group: str, resource: str) -> bool:
    """A SubjectAccessReview for a resource the API server does not serve (kubectl auth can-i
    cannot resolve it, e.g. KEDA's ScaledObjects when KEDA is not installed)."""
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": user,
            "groups": ["system:serviceaccounts", "system:authenticated"],
            "resourceAttributes": {"verb": verb, "group": group, "resource": resource},
        },
    }
    result = cluster.kubectl("create", "-o", "json", "-f", "-", stdin=json.dumps(review))
    return bool(json.loads(result.stdout)["status"].get("allowed"))


# --- a user's workload that must survive every uninstall --------------------------------


@dataclass
class UserWorkload:
    cluster: Cluster
    name: str = "chat"
    namespace: str = USER_NAMESPACE

    def snapshot(self) -> dict[str, Any]:
        dep = get(self.cluster, "deployment", self.name, "-n", self.namespace)
        assert dep is not None, "the user's Deployment is gone"
        return {
            "uid": dep["metadata"]["uid"],
            "generation": dep["metadata"]["generation"],
            "replicas": dep["spec"]["replicas"],
            "template": dep["spec"]["template"],
            "ownerReferences": dep["metadata"].get("ownerReferences"),
            "ready": dep.get("status", {}).get("readyReplicas", 0),
        }

    def add_sizing(self) -> None:
        """A WorkloadSizing on the Deployment (needs the CRD)."""
        sizing = {
            "apiVersion": "gpusizer.io/v1alpha1",
            "kind": "WorkloadSizing",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": {
                "targetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": self.name},
                "mode": "Auto",
                "replicas": {"min": 1, "max": 8, "targetGPUUtilization": 70},
            },
        }
        self.cluster.kubectl("apply", "-f", "-", stdin=json.dumps(sizing))

    def assert_untouched(self, before: dict[str, Any]) -> None:
        after = self.snapshot()
        assert after == before, f"the user's Deployment changed:\n{before}\n->\n{after}"
        pods = self.cluster.kubectl_json(
            "get", "pods", "-n", self.namespace, "-l", f"app={self.name}"
        )["items"]
        running = [p for p in pods if p["status"].get("phase") == "Running"]
        assert len(running) == before["replicas"], [p["status"].get("phase") for p in pods]


@pytest.fixture(scope="module")
def user_workload(cluster: Cluster) -> Iterator[UserWorkload]:
    workload = UserWorkload(cluster)
    fresh_namespace(cluster, workload.namespace)
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": workload.name, "namespace": workload.namespace},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": workload.name}},
            "template": {
                "metadata": {"labels": {"app": workload.name}},
                "spec": {
                    "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-L4"},
                    "containers": [
                        {
                            "name": "vllm",
                            "image": "vllm/vllm-openai:v0.11.0",
                            "resources": {"limits": {"nvidia.com/gpu": 1}},
                        }
                    ],
                },
            },
        },
    }
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(deployment))
    wait_until(
        lambda: workload.snapshot()["ready"] == 2, timeout=120, what="the user's 2 replicas ready"
    )
    yield workload
    cluster.kubectl("delete", "namespace", workload.namespace, "--wait=false", check=False)


def wait_out_terminating(cluster: Cluster, name: str) -> dict[str, Any] | None:
    """The namespace, or None once gone if it was terminating: the API server refuses new
    objects in a namespace that is still terminating."""
    existing = get(cluster, "namespace", name)
    if existing is not None and existing["status"].get("phase") == "Terminating":
        wait_gone(cluster, "namespace", name)
        return None
    return existing


def fresh_namespace(cluster: Cluster, name: str) -> None:
    """Create a namespace, first waiting out a previous run's copy that is still terminating."""
    existing = wait_out_terminating(cluster, name)
    cluster.kubectl("create", "namespace", name, check=existing is None)


def wait_deployment_available(cluster: Cluster, name: str, namespace: str) -> dict[str, Any]:
    def available() -> dict[str, Any] | None:
        dep = get(cluster, "deployment", name, "-n", namespace)
        if dep and dep.get("status", {}).get("availableReplicas", 0) == dep["spec"]["replicas"]:
            return dep
        return None

    found: dict[str, Any] = wait_until(
        available, timeout=120, what=f"deployment {namespace}/{name} available"
    )
    return found


def wait_gone(cluster: Cluster, *args: str, timeout: float = 180) -> None:
    wait_until(lambda: get(cluster, *args) is None, timeout=timeout, what=f"{args} deleted")


def uids(cluster: Cluster, objects: list[tuple[str, ...]]) -> dict[tuple[str, ...], str]:
    out = {}
    for obj in objects:
        found = get(cluster, *obj)
        assert found is not None, f"{obj} missing"
        out[obj] = found["metadata"]["uid"]
    return out


# --- Helm -------------------------------------------------------------------------------


def test_helm_lint(helm: Helm) -> None:
    result = helm("lint", "--strict", str(CHART))
    assert "0 chart(s) failed" in result.stdout


def test_helm_install_upgrade_uninstall(
    cluster: Cluster, helm: Helm, user_workload: UserWorkload
) -> None:
    release, namespace = "gpusizer-helm", "gpusizer-helm"
    objects = [
        ("serviceaccount", release, "-n", namespace),
        ("clusterrole", release),
        ("clusterrolebinding", release),
        ("configmap", f"{release}-catalog", "-n", namespace),
        ("service", f"{release}-metrics", "-n", namespace),
        ("deployment", release, "-n", namespace),
    ]
    fresh_namespace(cluster, namespace)
    first = helm.install(release, namespace)
    assert "NOTES:" in first.stdout and f"deployment/{release}" in first.stdout
    assert get(cluster, "crd", CRD) is not None, "the chart's crds/ installed the CRD"
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", f"crd/{CRD}")
    user_workload.add_sizing()
    before = user_workload.snapshot()
    dep = wait_deployment_available(cluster, release, namespace)
    installed = uids(cluster, objects)

    helm.install(release, namespace)  # twice in a row: a no-op upgrade
    again = wait_deployment_available(cluster, release, namespace)
    assert uids(cluster, objects) == installed, "the second install replaced objects"
    assert again["metadata"]["generation"] == dep["metadata"]["generation"], "no new rollout"
    history = json.loads(helm("history", release, "-n", namespace, "-o", "json").stdout)
    assert [h["status"] for h in history] == ["superseded", "deployed"]

    helm("uninstall", release, "--namespace", namespace, "--wait")
    for obj in objects:
        wait_gone(cluster, *obj)
    assert get(cluster, "crd", CRD) is not None, "Helm keeps the CRD"
    assert get(cluster, "workloadsizing", user_workload.name, "-n", USER_NAMESPACE)
    user_workload.assert_untouched(before)
    cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def test_helm_namespaced_install_grants_only_watched_namespaces(
    cluster: Cluster, helm: Helm
) -> None:
    release, namespace = "gpusizer-ns", "gpusizer-ns"
    sa = f"system:serviceaccount:{namespace}:{release}"
    for ns in ("team-a", "team-b", namespace):
        fresh_namespace(cluster, ns)
    helm.install(
        release,
        namespace,
        "--set-json",
        'watchNamespaces=["team-a"]',
        "--set",
        "rightSizing.allowReshape=false",
    )
    try:
        dep = wait_deployment_available(cluster, release, namespace)
        args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
        assert "--namespace=team-a" in args
        assert can_i(
            cluster, sa, "update", "deployments.apps", "--subresource=scale", "-n", "team-a"
        )
        assert can_i(cluster, sa, "watch", "pods", "-n", "team-a")
        assert can_i(
            cluster,
            sa,
            "patch",
            "workloadsizings.gpusizer.io",
            "--subresource=status",
            "-n",
            "team-a",
        )
        assert not can_i(
            cluster, sa, "update", "deployments.apps", "--subresource=scale", "-n", "team-b"
        )
        assert not can_i(cluster, sa, "watch", "pods", "-n", "team-b")
        assert not can_i(cluster, sa, "watch", "workloadsizings.gpusizer.io", "-n", "team-b")
        assert not can_i(cluster, sa, "patch", "deployments.apps", "-n", "team-a")
        # What stays cluster-wide (docs/operations.md): CRDs, nodes, other autoscalers.
        assert can_i(cluster, sa, "watch", "customresourcedefinitions.apiextensions.k8s.io")
        assert can_i(cluster, sa, "watch", "nodes")
        assert can_i(cluster, sa, "list", "horizontalpodautoscalers.autoscaling", "-A")
    finally:
        helm("uninstall", release, "--namespace", namespace, "--wait")
        for ns in ("team-a", "team-b", namespace):
            cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


# --- kubectl apply -k deploy/ -----------------------------------------------------------


def apply_deploy(cluster: Cluster) -> subprocess.CompletedProcess[str]:
    """`kubectl apply -k deploy/`, first waiting out an earlier uninstall's namespace."""
    wait_out_terminating(cluster, OPERATOR_NAMESPACE)
    return cluster.kubectl("apply", "-k", str(DEPLOY))


def test_kubectl_apply_install_twice_then_delete(
    cluster: Cluster, user_workload: UserWorkload
) -> None:
    first = apply_deploy(cluster)
    assert f"customresourcedefinition.apiextensions.k8s.io/{CRD}" in first.stdout
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", f"crd/{CRD}")
    # The namespace enforces the "restricted" Pod Security Standard: the pod was admitted.
    dep = wait_deployment_available(cluster, "gpusizer", OPERATOR_NAMESPACE)
    objects = [
        ("namespace", OPERATOR_NAMESPACE),
        ("serviceaccount", "gpusizer", "-n", OPERATOR_NAMESPACE),
        ("clusterrole", "gpusizer"),
        ("clusterrolebinding", "gpusizer"),
        ("configmap", "gpusizer-catalog", "-n", OPERATOR_NAMESPACE),
        ("service", "gpusizer-metrics", "-n", OPERATOR_NAMESPACE),
        ("deployment", "gpusizer", "-n", OPERATOR_NAMESPACE),
    ]
    installed = uids(cluster, objects)
    budget = get(cluster, "poddisruptionbudget", "gpusizer-activator", "-n", OPERATOR_NAMESPACE)

    second = cluster.kubectl("apply", "-k", str(DEPLOY))
    lines = [line for line in second.stdout.splitlines() if line.strip()]
    # kubectl reports a PodDisruptionBudget "configured" at every client-side apply: its
    # selector's patch strategy is replace, so the patch it computes is never empty. Its
    # generation says whether anything changed.
    pdb = "poddisruptionbudget.policy/gpusizer-activator configured"
    assert lines and all(x.endswith(" unchanged") or x == pdb for x in lines), second.stdout
    assert uids(cluster, objects) == installed
    again_budget = get(
        cluster, "poddisruptionbudget", "gpusizer-activator", "-n", OPERATOR_NAMESPACE
    )
    assert budget is not None and again_budget is not None
    assert again_budget["metadata"]["generation"] == budget["metadata"]["generation"]
    again = get(cluster, "deployment", "gpusizer", "-n", OPERATOR_NAMESPACE)
    assert again is not None and again["metadata"]["generation"] == dep["metadata"]["generation"]

    check_service_account_permissions(cluster)

    user_workload.add_sizing()
    before = user_workload.snapshot()
    # kubectl returns at once; each object's deletion is waited for below, so a slow
    # deletion meets wait_gone's time limit, not the harness's limit on one kubectl call
    cluster.kubectl("delete", "-k", str(DEPLOY), "--wait=false")
    for obj in objects:
        wait_gone(cluster, *obj)
    wait_gone(cluster, "crd", CRD)
    user_workload.assert_untouched(before)


def check_service_account_permissions(cluster: Cluster) -> None:
    """What the operator's ServiceAccount may and may not do (kubectl auth can-i)."""
    sa = OPERATOR_SA
    ns = USER_NAMESPACE
    allowed = [
        ("patch", "workloadsizings.gpusizer.io", "--subresource=status", "-n", ns),
        ("watch", "workloadsizings.gpusizer.io", "-A"),
        ("update", "deployments.apps", "--subresource=scale", "-n", ns),
        ("update", "statefulsets.apps", "--subresource=scale", "-n", ns),
        ("get", "deployments.apps", "-n", ns),
        ("patch", "deployments.apps", "-n", ns),  # rightSizing Auto moves the pod template
        ("watch", "pods", "-A"),
        ("watch", "nodes"),
        ("list", "horizontalpodautoscalers.autoscaling", "-A"),
        ("create", "events", "-n", ns),
        ("watch", "customresourcedefinitions.apiextensions.k8s.io"),
        # GPUPartitioning: cordon and relabel nodes, drain through evictions, its ConfigMap
        ("watch", "gpupartitionings.gpusizer.io"),
        ("patch", "gpupartitionings.gpusizer.io", "--subresource=status"),
        ("patch", "nodes"),
        ("create", "pods", "--subresource=eviction", "-n", ns),
        ("patch", "configmaps/custom-mig-parted-config", "-n", "gpu-operator"),
    ]
    denied = [
        ("get", "secrets", "-n", ns),
        ("list", "secrets", "-A"),
        ("get", "secrets", "-n", OPERATOR_NAMESPACE),
        ("delete", "pods", "-n", ns),
        ("create", "pods", "-n", ns),
        ("create", "deployments.apps", "-n", ns),
        ("update", "deployments.apps", "-n", ns),
        ("delete", "deployments.apps", "-n", ns),
        ("create", "customresourcedefinitions.apiextensions.k8s.io"),
        ("delete", "customresourcedefinitions.apiextensions.k8s.io"),
        ("update", "workloadsizings.gpusizer.io", "-n", ns),
        ("delete", "workloadsizings.gpusizer.io", "-n", ns),
        ("delete", "nodes"),
        ("update", "nodes"),
        ("patch", "configmaps", "-n", ns),
        ("delete", "gpupartitionings.gpusizer.io"),
        ("create", "clusterrolebindings.rbac.authorization.k8s.io"),
        ("impersonate", "serviceaccounts", "-A"),
    ]
    assert access_review(cluster, sa, "list", "keda.sh", "scaledobjects")
    assert not access_review(cluster, sa, "delete", "keda.sh", "scaledobjects")
    wrong = [a for a in allowed if not can_i(cluster, sa, *a)]
    wrong += [("NOT", *d) for d in denied if can_i(cluster, sa, *d)]
    assert not wrong, f"{sa}: unexpected permissions {wrong}"


# --- uninstalls with WorkloadSizings present, the operator running or gone --------------


def handled(cluster: Cluster, name: str) -> bool:
    """The operator has decided the user's WorkloadSizing at least once."""
    obj = get(cluster, "workloadsizing", name, "-n", USER_NAMESPACE)
    return bool(obj and (obj.get("status") or {}).get("conditions"))


@contextmanager
def operator_handling(
    cluster: Cluster,
    workload: UserWorkload,
    workdir: Path,
    account: tuple[str, str],
    runs: bool,
) -> Iterator[Operator]:
    """The real operator (a host process under the installed ServiceAccount) has handled the
    user's WorkloadSizing; then it goes on running, or is stopped, as `runs` says."""
    operator = Operator(cluster, workdir, name="installed", account=account)
    operator.start()
    try:
        workload.add_sizing()
        wait_until(lambda: handled(cluster, workload.name), 90, what="the sizing handled")
        obj = get(cluster, "workloadsizing", workload.name, "-n", USER_NAMESPACE)
        assert obj is not None and not obj["metadata"].get("finalizers"), obj
        if not runs:
            operator.stop()
        yield operator
    finally:
        operator.stop()


@pytest.mark.parametrize("runs", [True, False], ids=["operator-running", "operator-gone"])
def test_kubectl_delete_with_sizings_leaves_nothing_stuck(
    cluster: Cluster, user_workload: UserWorkload, tmp_path: Path, runs: bool
) -> None:
    """`kubectl delete -k deploy/` deletes the CRD, so every WorkloadSizing, and the RBAC the
    operator would need to release a finalizer: it completes, the operator running or not."""
    apply_deploy(cluster)
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", f"crd/{CRD}")
    account = (OPERATOR_NAMESPACE, "gpusizer")
    with operator_handling(cluster, user_workload, tmp_path, account, runs):
        before = user_workload.snapshot()
        cluster.kubectl("delete", "-k", str(DEPLOY), "--wait=false")
        wait_gone(cluster, "crd", CRD)  # the CRD goes last: after every WorkloadSizing
        wait_gone(cluster, "namespace", OPERATOR_NAMESPACE)
        user_workload.assert_untouched(before)


@pytest.mark.parametrize("runs", [True, False], ids=["operator-running", "operator-gone"])
def test_helm_uninstall_with_sizings_leaves_nothing_stuck(
    cluster: Cluster, helm: Helm, user_workload: UserWorkload, tmp_path: Path, runs: bool
) -> None:
    """Helm keeps the CRD and the WorkloadSizings: deleting them afterwards, with no operator
    left, waits for nothing."""
    release = namespace = "gpusizer-uninstall"
    fresh_namespace(cluster, namespace)
    helm.install(release, namespace)
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", f"crd/{CRD}")
    with operator_handling(cluster, user_workload, tmp_path, (namespace, release), runs):
        before = user_workload.snapshot()
        helm("uninstall", release, "--namespace", namespace, "--wait")
        assert get(cluster, "workloadsizing", user_workload.name, "-n", USER_NAMESPACE)
        user_workload.assert_untouched(before)
    cluster.kubectl(
        "delete", "workloadsizing", user_workload.name, "-n", USER_NAMESPACE, "--timeout=30s"
    )
    user_workload.assert_untouched(before)
    cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
