"""The real operator on the local cluster, under the shipped RBAC, and helpers to drive it.

The operator runs as a host process (kwok pods execute nothing) with a token of the
ServiceAccount that deploy/rbac.yaml binds, so any permission the manifests lack fails a test.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pytest
import requests
import yaml

from e2e.tests.conftest import REPO, Cluster, wait_until
from tests.support import free_port

OPERATOR_NAMESPACE = "gpusizer-system"
H100 = "NVIDIA-H100-80GB-HBM3"


def service_account_kubeconfig(
    cluster: Cluster,
    path: Path,
    server: str | None = None,
    account: tuple[str, str] = (OPERATOR_NAMESPACE, "gpusizer"),
) -> Path:
    """A kubeconfig holding a fresh token of the operator's ServiceAccount (``account``:
    namespace, name), for the API server at ``server`` (e.g. a proxy in front of it; default:
    the admin kubeconfig's)."""
    namespace, name = account
    token = cluster.kubectl(
        "create", "token", name, "-n", namespace, "--duration=24h"
    ).stdout.strip()
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    endpoint = dict(admin["clusters"][0]["cluster"])
    if server is not None:
        endpoint["server"] = server
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "local", "cluster": endpoint}],
                "users": [{"name": "gpusizer", "user": {"token": token}}],
                "contexts": [
                    {"name": "gpusizer", "context": {"cluster": "local", "user": "gpusizer"}}
                ],
                "current-context": "gpusizer",
            }
        )
    )
    return path


def install_manifests(cluster: Cluster) -> None:
    """The CRDs, namespace and RBAC exactly as users apply them from deploy/."""
    deploy = REPO / "deploy"
    for name in ("crd.yaml", "crd-gpupartitionings.yaml", "namespace.yaml", "rbac.yaml"):
        cluster.kubectl("apply", "-f", str(deploy / name))
    cluster.kubectl(
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/workloadsizings.gpusizer.io",
        "crd/gpupartitionings.gpusizer.io",
    )


def deployment_manifest(
    name: str,
    namespace: str,
    *,
    replicas: int = 1,
    resource: str = "nvidia.com/gpu",
    product: str = H100,
    capacity_rps: float = 10,
    memory_mib: int = 16000,
    startup_seconds: float = 2,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    args: list[str] | None = None,
) -> dict[str, Any]:
    """A vLLM Deployment of GPU pods, with the emulator's annotations for its load model."""
    annotations = {
        "gpusim.gpusizer.io/capacity-rps": str(capacity_rps),
        "gpusim.gpusizer.io/memory-mib": str(memory_mib),
        "gpusim.gpusizer.io/startup-seconds": str(startup_seconds),
        **(annotations or {}),
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels or {},
            "annotations": annotations,
        },
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "nodeSelector": {"nvidia.com/gpu.product": product},
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [
                        {
                            "name": "vllm",
                            "image": "vllm/vllm-openai:v0.11.0",
                            "resources": {"limits": {resource: 1}},
                            **({"args": args} if args else {}),
                        }
                    ],
                },
            },
        },
    }


def recommend(
    cluster: Cluster, history_seconds: int, *args: str, check: bool, timeout: float | None = None
) -> subprocess.CompletedProcess[str]:
    """`gpusizer recommend` against the cluster, as a user runs it."""
    return subprocess.run(
        [
            str(REPO / ".venv" / "bin" / "gpusizer"),
            "recommend",
            "--prometheus-url",
            cluster.prometheus_url,
            "--history-seconds",
            str(history_seconds),
            *args,
        ],
        env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig)},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=check,
    )


@dataclass(eq=False)
class Operator:
    """One ``gpusizer run`` host process under the ServiceAccount's identity.

    ``name`` names its kubeconfig and logs (``<name>-<start>.log`` in ``workdir``);
    ``api_server`` and ``prometheus_url`` point it at proxies (fault_support.py) instead of the
    real servers; ``account`` is the ServiceAccount it runs as (namespace, name: the chart's, for
    a Helm install); ``extra_args`` are more ``gpusizer run`` options; ``scrape`` makes Prometheus
    scrape its /metrics as job ``gpusizer``, every ``scrape_interval`` (Prometheus duration) or
    at the cluster's 5 s when None. Every start mints a new token, so an operator
    stopped while the ServiceAccount is deleted and re-created (test_install.py) starts again.
    """

    cluster: Cluster
    workdir: Path
    name: str = "operator"
    sync_period: float = 2.0
    read_period: float | None = None  # None: the operator's default
    prometheus_url: str | None = None
    api_server: str | None = None
    account: tuple[str, str] = (OPERATOR_NAMESPACE, "gpusizer")
    extra_args: list[str] = field(default_factory=list)
    scrape: bool = False
    scrape_interval: str | None = None
    process: subprocess.Popen[bytes] | None = None
    metrics_port: int = 0
    health_port: int = 0
    starts: int = 0
    logs: list[Path] = field(default_factory=list)

    # every operator of the session that may be running, for stop_operators()
    started: ClassVar[list[Operator]] = []

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / f"{self.name}.kubeconfig"

    def start(self) -> None:
        service_account_kubeconfig(self.cluster, self.kubeconfig, self.api_server, self.account)
        self.metrics_port, self.health_port = free_port(), free_port()
        self.starts += 1
        log_path = self.workdir / f"{self.name}-{self.starts}.log"
        self.logs.append(log_path)
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        command = [
            str(REPO / ".venv" / "bin" / "gpusizer"),
            "run",
            "--prometheus-url",
            self.prometheus_url or self.cluster.prometheus_url,
            "--prometheus-timeout",
            "3",
            "--sync-period",
            str(self.sync_period),
            *(["--read-period", str(self.read_period)] if self.read_period else []),
            "--metrics-port",
            str(self.metrics_port),
            "--health-address",
            f"127.0.0.1:{self.health_port}",
            "--log-format",
            "full",
            # the activator's Service as deploy/ names it (test_activator.py runs its pods)
            "--activator-service",
            f"{OPERATOR_NAMESPACE}/gpusizer-activator",
            *self.extra_args,
        ]
        with log_path.open("wb") as log:
            self.process = subprocess.Popen(
                command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        if self not in Operator.started:
            Operator.started.append(self)
        wait_until(self._healthy, timeout=60, what=f"operator /healthz (log: {log_path})")
        if self.scrape:
            self.cluster.register_scrape_target(
                "gpusizer-operator",
                [f"127.0.0.1:{self.metrics_port}"],
                job="gpusizer",
                # a timeout no longer than the interval, which Prometheus requires
                labels={
                    "__scrape_interval__": self.scrape_interval,
                    "__scrape_timeout__": self.scrape_interval,
                }
                if self.scrape_interval
                else None,
            )

    def _healthy(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(f"operator exited: {self.log_tail()}")
        try:
            return requests.get(f"http://127.0.0.1:{self.health_port}/healthz", timeout=1).ok
        except requests.RequestException:
            return False

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if not self.running():
            return
        assert self.process is not None
        os.killpg(self.process.pid, sig)
        self.process.wait(timeout=30)

    def restart(self) -> None:
        self.stop()
        self.start()

    def log_tail(self, lines: int = 40) -> str:
        if not self.logs:
            return ""
        return "\n".join(self.logs[-1].read_text(errors="replace").splitlines()[-lines:])

    def log_text(self) -> str:
        """Everything this operator logged, over all its starts."""
        return "\n".join(p.read_text(errors="replace") for p in self.logs if p.exists())

    def _exposition(self) -> list[str]:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        return requests.get(url, timeout=5).text.splitlines()

    def metric(self, series: str, **labels: str) -> float:
        """The current value of one of the operator's own series (0 when absent)."""
        total = 0.0
        for line in self._exposition():
            if not line.startswith((series + "{", series + " ")):
                continue
            if all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def sample(self, series: str, **labels: str) -> float | None:
        """The value of one of the operator's own series; None when it exports none."""
        found = [
            float(line.rsplit(" ", 1)[1])
            for line in self._exposition()
            if line.startswith(series + "{")
            and all(f'{k}="{v}"' in line for k, v in labels.items())
        ]
        return sum(found) if found else None

    def decisions(self) -> float:
        """How many WorkloadSizings this process has decided so far."""
        for line in self._exposition():
            if line.startswith("gpusizer_reconcile_duration_seconds_count"):
                return float(line.rsplit(" ", 1)[1])
        return 0.0


def stop_operators() -> list[Operator]:
    """Stop every operator process of this session that runs (for a module that needs none,
    or its own): returns them, for the module to start again when it is done."""
    running = [op for op in Operator.started if op.running()]
    for op in running:
        op.stop()
    return running


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport() -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed test's report ends with what each running operator logged last: CI keeps
    only the output, and the logs go with the cluster."""
    report = yield
    if report.failed:
        for op in Operator.started:
            if op.running() and op.logs:
                report.sections.append((f"{op.logs[-1]} (last 80 lines)", op.log_tail(80)))
    return report


@pytest.fixture(scope="session")
def manifests(cluster: Cluster) -> Cluster:
    """The CRD and RBAC from deploy/, applied once."""
    install_manifests(cluster)
    return cluster


@pytest.fixture(scope="session")
def operator(manifests: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    cluster = manifests
    # the emulated mig-manager reads the ConfigMap through the API, not a kubelet-refreshed file;
    # the right-sizing window read every 10 s, not every minute: tests wait on what it shows
    op = Operator(
        cluster,
        tmp_path_factory.mktemp("operator"),
        scrape=True,
        extra_args=["--mig-config-settle", "0", "--rightsizing-period", "10"],
    )
    try:
        op.start()
        yield op
    finally:
        op.stop()


class Workloads:
    """Inference Deployments and their WorkloadSizings in one namespace of their own."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        self.cluster = cluster
        self.namespace = namespace
        # a rerun on a reused cluster starts from an empty namespace, and without the demand
        # and queue the emulator kept for its workloads (a backlog saturates the new pods)
        cluster.kubectl("delete", "namespace", namespace, "--ignore-not-found", "--wait=true")
        requests.delete(
            f"{cluster.gpusim_url}/v1/workloads/{namespace}", timeout=10
        ).raise_for_status()
        cluster.kubectl("create", "namespace", namespace)

    def apply(self, obj: dict[str, Any], check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.cluster.kubectl("apply", "-f", "-", stdin=json.dumps(obj), check=check)

    def deployment(self, name: str, **options: Any) -> None:
        """Apply deployment_manifest(name, this namespace, **options)."""
        self.apply(deployment_manifest(name, self.namespace, **options))

    def sizing(
        self, name: str, spec: dict[str, Any], **metadata: Any
    ) -> subprocess.CompletedProcess[str]:
        obj = {
            "apiVersion": "gpusizer.io/v1alpha1",
            "kind": "WorkloadSizing",
            "metadata": {"name": name, "namespace": self.namespace, **metadata},
            "spec": spec,
        }
        return self.apply(obj, check=False)

    def pods(self, name: str) -> list[dict[str, Any]]:
        items = self.cluster.kubectl_json("get", "pods", "-n", self.namespace, "-l", f"app={name}")
        return [p for p in items["items"] if not p["metadata"].get("deletionTimestamp")]

    def template(self, name: str) -> dict[str, Any]:
        dep = self.cluster.kubectl_json("get", "deployment", name, "-n", self.namespace)
        return dict(dep)

    def replicas(self, name: str) -> int:
        scale = self.cluster.kubectl_json("get", "deployment", name, "-n", self.namespace)
        return int(scale["spec"].get("replicas", 0))

    def ready(self, name: str) -> int:
        dep = self.cluster.kubectl_json("get", "deployment", name, "-n", self.namespace)
        return int(dep.get("status", {}).get("readyReplicas", 0))

    def status(self, name: str) -> dict[str, Any]:
        obj = self.cluster.kubectl_json("get", "workloadsizing", name, "-n", self.namespace)
        status: dict[str, Any] = obj.get("status") or {}
        return status

    def condition(self, name: str, type_: str) -> dict[str, Any] | None:
        for c in self.status(name).get("conditions", []):
            if c["type"] == type_:
                return dict(c)
        return None

    def wait_condition(
        self, name: str, type_: str, status: str, reason: str | None = None, timeout: float = 90
    ) -> dict[str, Any]:
        seen: dict[str, Any] | None = None

        def matches() -> dict[str, Any] | None:
            nonlocal seen
            c = seen = self.condition(name, type_)
            if c and c["status"] == status and (reason is None or c["reason"] == reason):
                return c
            return None

        try:
            found: dict[str, Any] = wait_until(
                matches, timeout=timeout, what=f"{name} {type_}={status} {reason or ''}"
            )
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}; last seen: {seen}") from None
        return found

    def event_reasons(self, name: str) -> list[str]:
        events = self.cluster.kubectl_json(
            "get", "events", "-n", self.namespace, "--field-selector", f"involvedObject.name={name}"
        )
        return [e.get("reason", "") for e in events.get("items", [])]

    def emulated(self, name: str) -> dict[str, Any]:
        """What the emulator knows of the workload, ground truth included (`accounting`)."""
        r = requests.get(
            f"{self.cluster.gpusim_url}/v1/workloads/{self.namespace}/{name}", timeout=10
        )
        r.raise_for_status()
        return dict(r.json())

    def restart_server(self, pod: str) -> None:
        """The inference server of `pod` restarts, as after a crash: its counters start over."""
        r = requests.post(
            f"{self.cluster.gpusim_url}/v1/pods/{self.namespace}/{pod}/restart", timeout=10
        )
        r.raise_for_status()

    def load(self, name: str, rps: float) -> None:
        r = requests.put(
            f"{self.cluster.gpusim_url}/v1/workloads/{self.namespace}/{name}/load",
            json={"requestsPerSecond": rps},
            timeout=10,
        )
        r.raise_for_status()

    def busy(self, name: str, replicas: int) -> None:
        """``replicas`` ready replicas of ``name`` at 70 %, as Prometheus reads them, before a
        sizing exists. The load starts once they are ready: a backlog queued while they start
        would run them at 100 % until drained (the operator rightly adds a replica), and a
        first decision on the idle samples from before the load could scale down or to zero."""
        wait_until(lambda: self.ready(name) == replicas, 90, what=f"{replicas} ready")
        self.load(name, 7 * replicas)  # capacity 10 rps each
        query = f'DCGM_FI_DEV_GPU_UTIL{{namespace="{self.namespace}",pod=~"{name}-.+"}}'

        def busy() -> bool:
            values = [float(s["value"][1]) for s in self.cluster.promql(query)]
            return len(values) == replicas and all(abs(v - 70) <= 2 for v in values)

        wait_until(busy, 60, what=f"Prometheus reading {name}'s {replicas} replicas at 70 %")

    def wait_replicas(self, name: str, predicate: Any, timeout: float, what: str) -> int:
        def check() -> tuple[int] | None:
            n = self.replicas(name)
            return (n,) if predicate(n) else None  # a tuple: 0 replicas is a valid answer

        found: tuple[int] = wait_until(check, timeout=timeout, what=f"{name}: {what}")
        return found[0]


def stop_prometheus(cluster: Cluster) -> list[bytes]:
    """Stop the cluster's Prometheus; returns its command line to start it again."""
    pid = int((cluster.state_dir / "prometheus.pid").read_text().strip())
    command = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
    os.kill(pid, signal.SIGTERM)
    wait_until(lambda: _gone(pid), 30, what="prometheus exit")
    return command


def start_prometheus(cluster: Cluster, command: list[bytes]) -> None:
    log = (cluster.state_dir / "logs" / "prometheus.log").open("ab")
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    (cluster.state_dir / "prometheus.pid").write_text(f"{proc.pid}\n")
    wait_until(
        lambda: requests.get(f"{cluster.prometheus_url}/-/ready", timeout=1).ok,
        timeout=60,
        what="prometheus ready again",
    )


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


def sizing_spec(name: str, **overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "targetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
        "replicas": {
            "min": 1,
            "max": 8,
            "targetGPUUtilization": 70,
            "scaleUp": {
                "stabilizationWindowSeconds": 0,
                "maxReplicasPerStep": 8,
                "periodSeconds": 2,
            },
            "scaleDown": {
                "stabilizationWindowSeconds": 6,
                "maxReplicasPerStep": 8,
                "periodSeconds": 2,
            },
        },
        "metrics": {"server": "vllm", "maxSampleAgeSeconds": 30},
        "rightSizing": {"mode": "Off"},
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(spec.get(key), dict):
            spec[key] = {**spec[key], **value}
        else:
            spec[key] = value
    return spec


@pytest.fixture
def workloads(manifests: Cluster, request: pytest.FixtureRequest) -> Iterator[Workloads]:
    """A namespace of the test's own, deleted afterwards so its GPUs go back to the pool. Its
    name is a DNS label: one cut after a word ends in a hyphen, which the API server refuses."""
    words = request.node.name.removeprefix("test_").replace("_", "-")
    namespace = "e2e-" + words[:50].rstrip("-")
    yield Workloads(manifests, namespace)
    manifests.kubectl("delete", "namespace", namespace, "--wait=true", "--timeout=120s")
