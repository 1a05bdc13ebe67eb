"""The operator's image, built by `make image` and run as users run it.

Each check runs the image as the chart runs it (the chart's user, read-only root, no
capabilities): what it answers, what it holds, and what it runs as. Each check is also run
against an image spoilt on purpose (built FROM the real one), where it must fail: an image
without the catalog, running as root, that the chart's user cannot read, with a package the
lock does not have, or with a compiler. Last, `gpusizer run` from the image sizes a
WorkloadSizing on the local cluster with the arguments, ServiceAccount and catalog ConfigMap
that `helm install` of the chart created.
"""

from __future__ import annotations

import json
import os
import subprocess
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.utils import canonicalize_name

from e2e.tests.conftest import REPO, Cluster, wait_until
from e2e.tests.image_support import (
    RunningContainer,
    container_run,
    delete_sizings_namespace,
    podman,
    start_container,
)
from e2e.tests.operator_support import Workloads, sizing_spec, stop_operators
from e2e.tests.test_install import Helm, fresh_namespace, helm_binary
from tests.support import free_port
from tests.unit.test_dockerfile import lock_pins

CHART = REPO / "charts" / "gpusizer"
CHART_VALUES = yaml.safe_load((CHART / "values.yaml").read_text())
CHART_USER = int(CHART_VALUES["runAsUser"])
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
# Every command the image serves.
COMMANDS = ["run", "activator", "simulate", "recommend", "crds"]
# A price no default has, so a cost computed from it proves the override was read.
CATALOG_OVERRIDE = {"products": {"h100-80gb": {"price_per_hour": 4.25}}}
COMPILERS = ["cc", "gcc", "c++", "g++", "clang", "ld", "as", "make", "rustc", "go"]


def as_the_chart(
    image: str, *args: str, entrypoint: str | None = None, mounts: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    """Run ``args`` in ``image`` as the chart's container runs (no network)."""
    options = [
        "run",
        "--rm",
        "--network=none",
        f"--user={CHART_USER}:{CHART_USER}",
        "--read-only",
        "--read-only-tmpfs=false",
        "--tmpfs=/tmp:rw,size=64m,mode=1777",
        "--cap-drop=ALL",
        "--security-opt=no-new-privileges",
    ]
    options += [f"--volume={m}" for m in mounts]
    if entrypoint:
        options.append(f"--entrypoint={entrypoint}")
    return podman(*options, image, *args, check=False, timeout=120)


def python_in(image: str, code: str, mounts: tuple[str, ...] = ()) -> str:
    result = as_the_chart(image, "-c", code, entrypoint="python", mounts=mounts)
    assert result.returncode == 0, f"python in the image failed:\n{result.stderr}"
    return result.stdout


# --- checks: each takes an image and raises AssertionError --------------------------------


def check_user(image: str, tmp: Path) -> None:
    """The image's own user is the chart's runAsUser: numeric and non-root, so runAsNonRoot
    can verify it, and the files the image holds are made for it."""
    user = podman("image", "inspect", "--format", "{{.Config.User}}", image).stdout.strip()
    assert user == f"{CHART_USER}:{CHART_USER}", f"the image runs as {user!r}"


def check_commands(image: str, tmp: Path) -> None:
    for command in COMMANDS:
        result = as_the_chart(image, command, "--help")
        assert result.returncode == 0, f"gpusizer {command} --help:\n{result.stderr}"
        assert result.stdout.startswith(f"usage: gpusizer {command}"), result.stdout


def check_version(image: str, tmp: Path) -> None:
    result = as_the_chart(image, "--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"gpusizer {VERSION}\n"
    version_label = '{{index .Labels "org.opencontainers.image.version"}}'
    label = podman("image", "inspect", "--format", version_label, image).stdout.strip()
    assert label == VERSION


def check_crds(image: str, tmp: Path) -> None:
    result = as_the_chart(image, "crds")
    assert result.returncode == 0, result.stderr
    assert result.stdout == (REPO / "crds" / "gpusizer.io_workloadsizings.yaml").read_text()


def check_packages_are_the_lock(image: str, tmp: Path) -> None:
    listed = python_in(
        image,
        "import importlib.metadata as m\n"
        "for d in m.distributions(): print(d.metadata['Name'], d.version)",
    )
    installed = sorted(
        f"{canonicalize_name(name)}=={version}"
        for name, version in (line.split() for line in listed.splitlines())
    )
    expected = sorted([*lock_pins(), f"gpusizer=={VERSION}"])
    assert installed == expected, (
        f"in the image, not the lock: {sorted(set(installed) - set(expected))}; "
        f"in the lock, not the image: {sorted(set(expected) - set(installed))}"
    )


def chart_catalog_configmap(tmp: Path) -> Path:
    """The catalog ConfigMap's file as `helm template` renders it with CATALOG_OVERRIDE."""
    rendered = subprocess.run(
        [helm_binary(), "template", str(CHART), "--show-only", "templates/catalog.yaml",
         "--set-json", f"catalog.override={json.dumps(CATALOG_OVERRIDE)}"],
        text=True, capture_output=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    path = tmp / "catalog.yaml"
    path.write_text(yaml.safe_load(rendered)["data"]["catalog.yaml"])
    path.chmod(0o644)
    return path


def check_catalog(image: str, tmp: Path) -> None:
    """The packaged catalog and the chart's override, mounted where the chart mounts it."""
    override = chart_catalog_configmap(tmp)
    price = python_in(
        image,
        "from pathlib import Path\n"
        "from gpusizer.catalog import load_catalog\n"
        "catalog = load_catalog(Path('/etc/gpusizer/catalog.yaml'))\n"
        "print(catalog.products['h100-80gb'].price_per_hour, len(catalog.products))",
        mounts=(f"{override}:/etc/gpusizer/catalog.yaml:ro",),
    )
    product_price, products = price.split()
    assert float(product_price) == CATALOG_OVERRIDE["products"]["h100-80gb"]["price_per_hour"]
    assert int(products) > 1, "the packaged products, not only the override's"


def check_no_compilers(image: str, tmp: Path) -> None:
    found = python_in(
        image,
        "import shutil\n"
        f"for tool in {COMPILERS!r} + ['pip', 'pip3']:\n"
        "    if shutil.which(tool): print(tool, shutil.which(tool))",
    )
    assert not found, f"build tools in the runtime image: {found}"


CHECKS: dict[str, Callable[[str, Path], None]] = {
    "user": check_user,
    "commands": check_commands,
    "version": check_version,
    "crds": check_crds,
    "packages": check_packages_are_the_lock,
    "catalog": check_catalog,
    "no compilers": check_no_compilers,
}


@pytest.mark.parametrize("name", CHECKS)
def test_image(name: str, image: str, tmp_path: Path) -> None:
    CHECKS[name](image, tmp_path)


# --- the same checks fail on a spoilt image -----------------------------------------------

SITE = "/opt/gpusizer/lib/python3.11/site-packages"
SPOILT = {
    "runs as root": ("USER 0", "user"),
    "without the catalog": (f"RUN rm {SITE}/gpusizer/catalog/default.yaml", "catalog"),
    "unreadable by its user": ("RUN chmod 0750 /opt/gpusizer", "commands"),
    "a package missing": (f"RUN rm -r {SITE}/tqdm-*.dist-info", "packages"),
    "a compiler": ("RUN ln -s /bin/true /usr/local/bin/cc", "no compilers"),
}


@pytest.mark.parametrize("spoilt", SPOILT)
def test_a_spoilt_image_fails_its_check(
    spoilt: str,
    image: str,
    tmp_path: Path,
) -> None:
    change, check = SPOILT[spoilt]
    user = f"{CHART_USER}:{CHART_USER}"
    lines = [f"FROM {image}", "USER 0", change]
    if change != "USER 0":
        lines.append(f"USER {user}")
    tag = f"localhost/gpusizer-spoilt:{os.getpid()}-{list(SPOILT).index(spoilt)}"
    podman(
        "build", "--quiet", "--network=none", "--pull=never", "--tag", tag, "--file", "-",
        str(tmp_path), stdin="\n".join(lines) + "\n",
    )  # fmt: skip
    try:
        with pytest.raises(AssertionError):
            CHECKS[check](tag, tmp_path)
    finally:
        podman("rmi", "--force", tag, check=False)


# --- gpusizer run from the image, as the chart's pod, on the local cluster ----------------

RELEASE = NAMESPACE = "gpusizer-image"


@pytest.fixture(scope="module")
def helm(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(cluster, tmp_path_factory.mktemp("helm"))


@pytest.fixture
def chart_release(cluster: Cluster, helm: Helm, image: str) -> Iterator[dict[str, Any]]:
    """`helm install` of the chart pointed at the local Prometheus; yields its Deployment.
    No other operator runs meanwhile (they would size the same objects)."""
    stopped = stop_operators()
    fresh_namespace(cluster, NAMESPACE)
    repository, tag = image.rsplit(":", 1)
    helm(
        "upgrade", "--install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--wait",
        "--set", f"image.repository={repository}", "--set", f"image.tag={tag}",
        "--set", f"prometheus.url={cluster.prometheus_url}",
        "--set", "syncPeriodSeconds=2", "--set", "rightSizing.periodSeconds=5",
        # the container shares the host's network: ports of its own
        "--set", f"metrics.port={free_port()}", "--set", f"health.port={free_port()}",
        "--set-json", f"catalog.override={json.dumps(CATALOG_OVERRIDE)}",
    )  # fmt: skip
    try:
        yield cluster.kubectl_json("get", "deployment", RELEASE, "-n", NAMESPACE)
    finally:
        helm("uninstall", RELEASE, "--namespace", NAMESPACE, "--wait")
        cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)
        for operator in stopped:
            operator.start()


@pytest.fixture
def operator_container(
    cluster: Cluster,
    chart_release: dict[str, Any],
    image: str,
    tmp_path: Path,
) -> Iterator[RunningContainer]:
    pod = chart_release["spec"]["template"]["spec"]
    configmaps = {
        v["configMap"]["name"]: cluster.kubectl_json(
            "get", "configmap", v["configMap"]["name"], "-n", NAMESPACE
        )["data"]
        for v in pod["volumes"]
        if "configMap" in v
    }
    configmaps["kube-root-ca.crt"] = cluster.kubectl_json(
        "get", "configmap", "kube-root-ca.crt", "-n", NAMESPACE
    )["data"]
    token = cluster.kubectl(
        "create", "token", pod["serviceAccountName"], "-n", NAMESPACE, "--duration=1h"
    ).stdout.strip()
    spec = container_run(chart_release, configmaps, cluster, token, tmp_path, image)
    assert spec.args[0] == "run" and f"--prometheus-url={cluster.prometheus_url}" in spec.args
    yield from start_container(spec, f"gpusizer-e2e-{os.getpid()}")


def test_the_image_sizes_a_workload_as_the_charts_pod(
    operator_container: RunningContainer, cluster: Cluster
) -> None:
    workloads = Workloads(cluster, "e2e-image")
    try:
        workloads.deployment("chat", replicas=1, capacity_rps=10)
        workloads.busy("chat", 1)
        workloads.load("chat", 21)  # 21 / (10 x 0.7): 3 replicas
        spec = sizing_spec("chat", rightSizing={"mode": "Recommend", "historySeconds": 60})
        assert workloads.sizing("chat", spec).returncode == 0
        workloads.wait_replicas("chat", lambda n: n >= 3, 120, "scaled up by the image")
        price = CATALOG_OVERRIDE["products"]["h100-80gb"]["price_per_hour"]

        def costed() -> dict[str, Any] | None:
            status = workloads.status("chat")
            recommendation = status.get("recommendation") or {}
            current = recommendation.get("currentCostPerHour")
            replicas = status.get("currentReplicas")
            return status if current and replicas and current == replicas * price else None

        wait_until(costed, 120, what="the current cost at the chart's catalog price")
    except BaseException:
        print(operator_container.logs())
        raise
    finally:
        delete_sizings_namespace(cluster, workloads.namespace, operator_runs=True)
