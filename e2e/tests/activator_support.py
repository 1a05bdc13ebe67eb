"""The activator on the local cluster: its manifests from deploy/, its pods' processes run
on this host at the pods' IPs, and this module playing their kubelet.

kwok runs no process. For the activator's pods (annotated e2e.gpusizer.io/external-readiness,
which kwok leaves not Ready and does not delete), `ActivatorPods` does what a kubelet does:
starts the container's command with its args and env (the pod's name from the downward API, a
token of the pod's ServiceAccount) once the pod has an IP, probes `/readyz` and writes the
pod's Ready condition as the readiness probe would, sends SIGTERM when the pod is deleted and
SIGKILL after its grace period, deletes the pod object once the process has exited, and starts
a process that died again, marking the pod not Ready meanwhile. So the Deployment, its
rollouts, the EndpointSlice controller and the operator's watch of the activator's replicas
are all the real ones.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pytest
import requests
import yaml
from gpusizer.watches import Obj, Store, follow, start
from kubernetes import client as k8s

from e2e.tests.conftest import REPO, Cluster, wait_until
from e2e.tests.operator_support import OPERATOR_NAMESPACE, service_account_kubeconfig

ACTIVATOR = "gpusizer-activator"
EXTERNAL_READINESS = "e2e.gpusizer.io/external-readiness"
SELECTOR = "app.kubernetes.io/component=activator"
PROBE_SECONDS = 0.2  # the manifests' readinessProbe says 2 s; the tests do not wait for it
# SIGKILL when the thread that started it (the kubelet's loop) ends: a session killed before
# its fixtures' teardown would otherwise leave processes listening at pod IPs
DIE_WITH_THE_SESSION = ["setpriv", "--pdeathsig", "KILL"] if shutil.which("setpriv") else []


def activator_manifests() -> list[dict[str, Any]]:
    """deploy/activator.yaml, its pods annotated so kwok leaves their readiness to us."""
    docs = [d for d in yaml.safe_load_all((REPO / "deploy" / "activator.yaml").read_text()) if d]
    for doc in docs:
        if doc["kind"] == "Deployment":
            template = doc["spec"]["template"]["metadata"]
            template.setdefault("annotations", {})[EXTERNAL_READINESS] = "true"
    return docs


@dataclass
class Container:
    """One pod's process."""

    pod: str
    ip: str
    process: subprocess.Popen[bytes]
    log: Path
    ports: dict[str, int]  # the container's ports by name
    ready: bool = False
    deleted_at: float | None = None  # when its pod was deleted (SIGTERM sent)
    grace: float = 60.0

    def url(self, port: str, path: str) -> str:
        return f"http://{self.ip}:{self.ports[port]}{path}"


@dataclass
class ActivatorPods:
    cluster: Cluster
    workdir: Path
    containers: dict[str, Container] = field(default_factory=dict)
    gone: list[Container] = field(default_factory=list)  # exited after their pod was deleted
    _pods: Store = field(default_factory=Store)
    _stop: threading.Event = field(default_factory=threading.Event)
    starts: int = 0

    installed: ClassVar[list[ActivatorPods]] = []  # for the logs of a failed test

    def install(self) -> None:
        """deploy/activator.yaml, from scratch: a Deployment another module left (say
        test_install.py's, whose pods kwok runs and marks Ready with no process behind them)
        goes first."""
        ActivatorPods.installed.append(self)
        self.cluster.kubectl(
            "delete",
            "deployment",
            ACTIVATOR,
            "-n",
            OPERATOR_NAMESPACE,
            "--ignore-not-found",
            "--wait=true",
        )
        for doc in activator_manifests():
            self.cluster.kubectl("apply", "-f", "-", stdin=json.dumps(doc))
        self._core = k8s.CoreV1Api(self.cluster.api_client())
        start(
            functools.partial(
                follow,
                "the activator's pods",
                self._core.list_namespaced_pod,
                OPERATOR_NAMESPACE,
                label_selector=SELECTOR,
                listed=self._pods.listed,
                changed=self._pods.changed,
                stop=self._stop,
            ),
            "activator-pods",
        )
        start(self._kubelet, "activator-kubelet")

    def uninstall(self) -> None:
        ActivatorPods.installed.remove(self)
        self.cluster.kubectl(
            "delete", "deployment", ACTIVATOR, "-n", OPERATOR_NAMESPACE, "--ignore-not-found"
        )
        self._stop.set()
        for container in list(self.containers.values()):
            _signal(container, signal.SIGKILL)
        self.cluster.kubectl(
            "delete",
            "pods",
            "-n",
            OPERATOR_NAMESPACE,
            "-l",
            SELECTOR,
            "--grace-period=0",
            "--force",
            "--ignore-not-found",
        )

    # --- the kubelet ------------------------------------------------------------------------

    def _kubelet(self) -> None:
        while not self._stop.is_set():
            pods = {p["metadata"]["name"]: copy.deepcopy(p) for p in self._pods.objects()}
            for name, pod in pods.items():
                self._sync(name, pod)
            for name in set(self.containers) - set(pods):
                self._terminate(name)
            self._stop.wait(PROBE_SECONDS)

    def _sync(self, name: str, pod: Obj) -> None:
        if (pod["metadata"].get("annotations") or {}).get(EXTERNAL_READINESS) != "true":
            return  # kwok's to run: no process of ours
        ip = (pod.get("status") or {}).get("podIP")
        if pod["metadata"].get("deletionTimestamp"):
            self._terminate(name)
            return
        container = self.containers.get(name)
        if container is None or container.process.poll() is not None:
            if ip is None:
                return
            if container is not None:  # it died: not ready until it is up again
                self._set_ready(name, False)
            container = self.containers[name] = self._run(name, ip, pod)
        ready = self._probe(container)
        if ready != container.ready:
            self._set_ready(name, ready)
            container.ready = ready

    def _run(self, name: str, ip: str, pod: Obj) -> Container:
        spec = pod["spec"]["containers"][0]
        kubeconfig = service_account_kubeconfig(
            self.cluster,
            self.workdir / f"{name}.kubeconfig",
            account=(pod["metadata"]["namespace"], pod["spec"]["serviceAccountName"]),
        )
        self.starts += 1
        log = self.workdir / f"{name}-{self.starts}.log"
        env = {**os.environ, "KUBECONFIG": str(kubeconfig), "GPUSIZER_REPLICA": name}
        command = [
            # it goes with the test session, however that ends, as a pod's with its node
            *DIE_WITH_THE_SESSION,
            str(REPO / ".venv" / "bin" / "gpusizer"),
            *spec["args"],
            f"--address={ip}",
            "--log-format=full",
        ]
        with log.open("wb") as out:
            process = subprocess.Popen(
                command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        grace = float(pod["spec"].get("terminationGracePeriodSeconds") or 30)
        ports = {p["name"]: int(p["containerPort"]) for p in spec.get("ports") or []}
        return Container(name, ip, process, log, ports, grace=grace)

    def _probe(self, container: Container) -> bool:
        try:
            return requests.get(container.url("health", "/readyz"), timeout=1).ok
        except requests.RequestException:
            return False

    def _set_ready(self, name: str, ready: bool) -> None:
        """The pod's Ready and ContainersReady conditions and its container's `ready`, as the
        kubelet writes them (containerStatuses is replaced whole: the rest is kept)."""
        pod = next((p for p in self._pods.objects() if p["metadata"]["name"] == name), {})
        value = "True" if ready else "False"
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        statuses = [
            {**s, "ready": ready} for s in (pod.get("status") or {}).get("containerStatuses") or []
        ]
        body = {
            "status": {
                "conditions": [
                    {"type": "Ready", "status": value, "lastTransitionTime": now},
                    {"type": "ContainersReady", "status": value, "lastTransitionTime": now},
                ],
                "containerStatuses": statuses,
            }
        }
        try:
            self._core.patch_namespaced_pod_status(
                name,
                OPERATOR_NAMESPACE,
                body,
                _content_type="application/strategic-merge-patch+json",
            )
        except k8s.ApiException as exc:
            if exc.status != 404:
                raise

    def _terminate(self, name: str) -> None:
        """SIGTERM once, SIGKILL after the pod's grace period; once it exited, the pod object
        goes (its IP free for another pod only then)."""
        container = self.containers.get(name)
        if container is None:
            return
        if container.deleted_at is None:
            container.deleted_at = time.monotonic()
            _signal(container, signal.SIGTERM)
        elif time.monotonic() - container.deleted_at > container.grace:
            _signal(container, signal.SIGKILL)
        if container.process.poll() is None:
            return
        del self.containers[name]
        self.gone.append(container)
        try:
            self._core.delete_namespaced_pod(name, OPERATOR_NAMESPACE, grace_period_seconds=0)
        except k8s.ApiException as exc:
            if exc.status != 404:
                raise

    # --- for the tests ---------------------------------------------------------------------

    def ready_pods(self) -> list[Container]:
        return [c for c in list(self.containers.values()) if c.ready and c.deleted_at is None]

    def wait_ready(self, count: int, timeout: float = 60) -> list[Container]:
        def ready() -> list[Container] | None:
            pods = self.ready_pods()
            return pods if len(pods) == count else None

        found: list[Container] = wait_until(ready, timeout, what=f"{count} ready activators")
        return found

    def kill(self, container: Container) -> None:
        """SIGKILL, as the OOM killer or a crashed node would: no drain."""
        _signal(container, signal.SIGKILL)
        container.process.wait(timeout=10)

    def metric(self, container: Container, series: str, **labels: str) -> float:
        text = requests.get(container.url("metrics", "/metrics"), timeout=5).text
        total = 0.0
        for line in text.splitlines():
            if line.startswith(series + "{") and all(
                f'{k}="{v}"' in line for k, v in labels.items()
            ):
                total += float(line.rsplit(" ", 1)[1])
        return total

    async def until_held(self, replicas: list[Container], namespace: str, count: int) -> None:
        """Until each replica holds `count` requests of the namespace, as its own gauge says
        (a condition polled, with a deadline)."""

        def held() -> float:
            return min(
                self.metric(c, "gpusizer_activator_pending_requests", namespace=namespace)
                for c in replicas
            )

        async with asyncio.timeout(30):
            while await asyncio.to_thread(held) < count:  # noqa: ASYNC110
                await asyncio.sleep(0.1)

    def log_tail(self, lines: int = 60) -> str:
        parts = []
        for c in [*self.containers.values(), *self.gone]:
            text = c.log.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {c.log.name}\n" + "\n".join(text))
        return "\n".join(parts)


def _signal(container: Container, sig: int) -> None:
    if container.process.poll() is None:
        os.killpg(container.process.pid, sig)


class ReplicaWatch:
    """When a Deployment's spec.replicas changed, as a watch of it shows (the time the
    operator's /scale write reached the API server, to the watch's delay)."""

    def __init__(self, cluster: Cluster, namespace: str, name: str) -> None:
        self.changes: list[tuple[float, int]] = []
        self._stop = threading.Event()
        apps = k8s.AppsV1Api(cluster.api_client())

        def listed(items: list[Obj]) -> None:
            for obj in items:
                self._saw(obj)

        def changed(kind: str, obj: Obj) -> None:
            if kind != "DELETED":
                self._saw(obj)

        start(
            functools.partial(
                follow,
                f"Deployment {namespace}/{name}",
                apps.list_namespaced_deployment,
                namespace,
                field_selector=f"metadata.name={name}",
                listed=listed,
                changed=changed,
                stop=self._stop,
            ),
            f"replicas-{name}",
        )

    def _saw(self, obj: Obj) -> None:
        replicas = int((obj.get("spec") or {}).get("replicas") or 0)
        if not self.changes or self.changes[-1][1] != replicas:
            self.changes.append((time.time(), replicas))

    def woken_after(self, moment: float) -> float | None:
        """When replicas first went above 0 after `moment`."""
        return next((t for t, n in self.changes if t >= moment and n > 0), None)

    def stop(self) -> None:
        self._stop.set()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport() -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed test's report ends with what each activator replica logged last."""
    report = yield
    if report.failed:
        for pods in ActivatorPods.installed:
            report.sections.append(("activator replicas (last 60 lines each)", pods.log_tail()))
    return report
