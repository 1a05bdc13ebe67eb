"""The operator's image under podman and runc, run the way the chart's pod runs it.

scripts/build-image.sh builds the image (or finds it built from this same tree: it is named
after the hash of its inputs). ``container_run`` turns the operator container of the chart's
Deployment, as the API server holds it, into ``podman run`` options, the way a kubelet would
run the same spec: its user and group, read-only root, dropped capabilities, no privilege
escalation, memory limit, its volumes (emptyDir as tmpfs, ConfigMaps as read-only files, the
ServiceAccount's token, CA and namespace where the kubelet puts them) and its arguments. A
part of the spec it cannot reproduce fails the test and names it, so a chart change cannot
silently go untested. The one difference from a pod: the container shares the host's network
and reaches the API server at its loopback address (no kube-proxy here), which the in-cluster
configuration reads from KUBERNETES_SERVICE_HOST/PORT as in a pod.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import requests

from e2e.tests.conftest import REPO, Cluster
from tests.support import wait_for

CONTAINERS_CONF = REPO / "scripts" / "containers.conf"
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def podman(
    *args: str, check: bool = True, timeout: float = 300, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """podman with the project's settings (runc, cgroupfs, the ulimits runc can set here)."""
    result = subprocess.run(
        ["podman", *args],
        env={**os.environ, "CONTAINERS_CONF": str(CONTAINERS_CONF)},
        text=True,
        capture_output=True,
        input=stdin,
        timeout=timeout,
        check=False,
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"podman {' '.join(args)} exited {result.returncode}:\n{result.stderr}"
        )
    return result


@pytest.fixture(scope="session")
def image() -> str:
    """The image of this tree (`make image`), built now if it is not built yet."""
    result = subprocess.run(
        [str(REPO / "scripts" / "build-image.sh")],
        text=True,
        capture_output=True,
        timeout=1800,
        check=False,
    )
    if result.returncode != 0:
        pytest.fail(f"scripts/build-image.sh failed:\n{result.stderr}")
    return result.stdout.strip().splitlines()[-1]


@dataclass
class ContainerRun:
    """One container of a pod spec as `podman run` options; ``ports`` by name."""

    image: str
    options: list[str]
    args: list[str]
    ports: dict[str, int]
    readiness_path: str
    readiness_port: int

    def command(self, name: str) -> list[str]:
        return ["run", "--detach", "--name", name, *self.options, self.image, *self.args]


def _security(pod: Mapping[str, Any], container: Mapping[str, Any]) -> list[str]:
    context = {**(pod.get("securityContext") or {}), **(container.get("securityContext") or {})}
    known = {
        "runAsNonRoot",
        "runAsUser",
        "runAsGroup",
        "seccompProfile",  # RuntimeDefault: podman's default seccomp profile
        "allowPrivilegeEscalation",
        "readOnlyRootFilesystem",
        "privileged",
        "capabilities",
    }
    unknown = set(context) - known
    assert not unknown, f"the chart's securityContext has {unknown}: teach container_run"
    assert context.get("seccompProfile", {}).get("type", "RuntimeDefault") == "RuntimeDefault"
    assert not context.get("privileged"), "a privileged operator"
    options = []
    if "runAsUser" in context:
        user = str(context["runAsUser"])
        options += ["--user", f"{user}:{context.get('runAsGroup', user)}"]
    if context.get("runAsNonRoot"):
        # the kubelet refuses to start the container otherwise
        assert context.get("runAsUser", -1) != 0, "runAsNonRoot with runAsUser 0"
    if context.get("readOnlyRootFilesystem"):
        # podman would otherwise mount tmpfs on /tmp, /run and /var/tmp: a pod has none
        options += ["--read-only", "--read-only-tmpfs=false"]
    if context.get("allowPrivilegeEscalation") is False:
        options += ["--security-opt", "no-new-privileges"]
    capabilities = context.get("capabilities") or {}
    options += [f"--cap-drop={c}" for c in capabilities.get("drop", [])]
    options += [f"--cap-add={c}" for c in capabilities.get("add", [])]
    return options


def _volumes(
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    configmaps: Mapping[str, Mapping[str, str]],
    workdir: Path,
) -> list[str]:
    volumes = {v["name"]: v for v in pod.get("volumes") or []}
    options = []
    for mount in container.get("volumeMounts") or []:
        volume = volumes[mount["name"]]
        path = mount["mountPath"]
        if "emptyDir" in volume:
            size = (volume["emptyDir"] or {}).get("sizeLimit", "64Mi").replace("Mi", "m")
            options += ["--tmpfs", f"{path}:rw,size={size},mode=1777"]
        elif "configMap" in volume:
            data = configmaps[volume["configMap"]["name"]]
            directory = workdir / "configmaps" / mount["name"]
            directory.mkdir(parents=True, exist_ok=True)
            for key, text in data.items():
                (directory / key).write_text(text)
                (directory / key).chmod(0o644)  # the kubelet's defaultMode
            source = directory / mount["subPath"] if mount.get("subPath") else directory
            options += ["--volume", f"{source}:{path}:ro"]
        else:
            raise AssertionError(f"volume {volume}: teach container_run this kind")
    return options


def container_run(
    deployment: Mapping[str, Any],
    configmaps: Mapping[str, Mapping[str, str]],
    cluster: Cluster,
    token: str,
    workdir: Path,
    image: str,
) -> ContainerRun:
    """The Deployment's one container, with the ServiceAccount ``token``, on ``image``."""
    pod = deployment["spec"]["template"]["spec"]
    namespace = deployment["metadata"]["namespace"]
    (container,) = pod["containers"]
    assert pod.get("enableServiceLinks") is False, (
        "the kubelet would add every Service's Docker-link variables: teach container_run"
    )
    options = _security(pod, container)
    options += _volumes(pod, container, configmaps, workdir)

    account = workdir / "serviceaccount"
    account.mkdir(parents=True, exist_ok=True)
    (account / "token").write_text(token)
    (account / "namespace").write_text(namespace)
    (account / "ca.crt").write_text(configmaps["kube-root-ca.crt"]["ca.crt"])
    for f in account.iterdir():
        f.chmod(0o644)
    api = urlsplit(cluster.apiserver_url)
    options += [
        "--volume",
        f"{account}:{SERVICE_ACCOUNT_DIR}:ro",
        "--env",
        f"KUBERNETES_SERVICE_HOST={api.hostname}",
        "--env",
        f"KUBERNETES_SERVICE_PORT={api.port}",
        "--network",
        "host",
    ]
    for env in container.get("env") or []:
        assert "value" in env, f"env {env['name']}: teach container_run valueFrom"
        options += ["--env", f"{env['name']}={env['value']}"]
    memory = (container.get("resources") or {}).get("limits", {}).get("memory")
    if memory:
        options += ["--memory", memory.replace("Mi", "m").replace("Gi", "g")]
    if container.get("command"):
        options += ["--entrypoint", container["command"][0]]
    ports = {p["name"]: p["containerPort"] for p in container.get("ports") or []}
    probe = container["readinessProbe"]["httpGet"]
    port = probe["port"]
    return ContainerRun(
        image=image,
        options=options,
        args=[*container.get("command", [])[1:], *container.get("args", [])],
        ports=ports,
        readiness_path=probe["path"],
        readiness_port=ports[port] if isinstance(port, str) else int(port),
    )


@dataclass
class RunningContainer:
    name: str
    spec: ContainerRun

    def logs(self, lines: int = 80) -> str:
        result = podman("logs", "--tail", str(lines), self.name, check=False)
        return result.stdout + result.stderr

    def ready(self) -> bool:
        state = podman("inspect", "--format", "{{.State.Running}}", self.name).stdout.strip()
        if state != "true":
            raise AssertionError(f"the container stopped:\n{self.logs()}")
        url = f"http://127.0.0.1:{self.spec.readiness_port}{self.spec.readiness_path}"
        try:
            return requests.get(url, timeout=2).ok
        except requests.RequestException:
            return False


def start_container(spec: ContainerRun, name: str) -> Iterator[RunningContainer]:
    """Run ``spec`` until the generator is closed; ready through its readiness probe's URL."""
    podman("rm", "--force", "--ignore", name)
    podman(*spec.command(name))
    running = RunningContainer(name, spec)
    try:
        wait_for(running.ready, timeout=90, what=f"{name} ready", interval=0.5)
        yield running
    finally:
        podman("rm", "--force", "--time", "10", name, check=False)


def delete_sizings_namespace(cluster: Cluster, namespace: str, *, operator_runs: bool) -> None:
    """Delete a namespace whose WorkloadSizings an operator has handled, and wait until it is
    gone: a running operator removes kopf's finalizer from each; without one (or if it does not
    within a minute) the finalizers go by hand, as docs/operations.md tells users. Nothing is
    left Terminating, which would hold a later deletion of the CRD."""
    if operator_runs:
        deleted = cluster.kubectl(
            "delete", "namespace", namespace, "--ignore-not-found", "--timeout=60s", check=False
        )
        if deleted.returncode == 0:
            return
    sizings = cluster.kubectl(
        "get", "workloadsizings", "-n", namespace, "-o", "name", check=False
    ).stdout.split()
    for sizing in sizings:
        cluster.kubectl(
            "patch", sizing, "-n", namespace, "--type=merge",
            "-p", '{"metadata": {"finalizers": null}}', check=False,
        )  # fmt: skip
    cluster.kubectl("delete", "namespace", namespace, "--ignore-not-found", "--timeout=60s")
