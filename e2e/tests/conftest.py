"""Fixtures of the end-to-end tests: a local GPU cluster started by e2e/scripts/cluster-up.sh.

The session-scoped ``cluster`` fixture starts an isolated cluster in a temporary state dir
(``GPUSIZER_CLUSTER_DIR``) and stops it at the end of the session. To reuse a running
cluster instead (faster while iterating), set ``GPUSIZER_E2E_CLUSTER_DIR`` to its state dir
(e.g. ``.cluster`` after ``make cluster-up``): it is started if needed and never stopped.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "e2e" / "scripts"


def read_env_file(path: Path) -> dict[str, str]:
    """Parse a KEY=VALUE file such as ``.cluster/env``."""
    env: dict[str, str] = {}
    for line in path.read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep and key and not key.startswith("#"):
            env[key.strip()] = value.strip()
    return env


class KubectlFailed(subprocess.CalledProcessError):
    """A failed kubectl call whose message carries kubectl's own error, which pytest's report
    of a plain CalledProcessError leaves out."""

    def __str__(self) -> str:
        return f"{super().__str__()}\nstderr: {self.stderr.strip()}"


def kubectl_binary() -> str:
    venv = REPO / ".venv" / "bin" / "kubectl"
    return str(venv) if venv.exists() else "kubectl"


def run_script(name: str, state_dir: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GPUSIZER_CLUSTER_DIR": str(state_dir), **extra}
    return subprocess.run(
        [str(SCRIPTS / name)], env=env, text=True, capture_output=True, timeout=1800, check=False
    )


def wait_until(
    check: Callable[[], Any], timeout: float = 60.0, interval: float = 0.25, what: str = ""
) -> Any:
    """Poll ``check`` until it returns a truthy value (returned) or raise after ``timeout``."""
    deadline = time.monotonic() + timeout
    last_exc: Exception | None = None
    while True:
        try:
            value = check()
            if value:
                return value
        except Exception as exc:  # keep polling; report the last error on timeout
            last_exc = exc
        if time.monotonic() > deadline:
            msg = f"timed out after {timeout}s waiting for {what or check!r}"
            if last_exc is not None:
                msg += f" (last error: {last_exc!r})"
            raise TimeoutError(msg)
        time.sleep(interval)


@dataclass
class Cluster:
    """A running local GPU cluster; the fields mirror ``<state_dir>/env``."""

    state_dir: Path
    kubeconfig: Path
    prometheus_url: str
    gpusim_url: str
    apiserver_url: str
    operator_kubeconfig: Path
    prometheus_targets_dir: Path
    env: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_state_dir(cls, state_dir: Path) -> Cluster:
        env = read_env_file(state_dir / "env")
        return cls(
            state_dir=state_dir,
            kubeconfig=Path(env["KUBECONFIG"]),
            prometheus_url=env["PROMETHEUS_URL"],
            gpusim_url=env["GPUSIM_URL"],
            apiserver_url=env.get("APISERVER_URL", ""),
            operator_kubeconfig=Path(env.get("OPERATOR_KUBECONFIG", "")),
            prometheus_targets_dir=Path(
                env.get("PROMETHEUS_TARGETS_DIR", str(state_dir / "prometheus-targets"))
            ),
            env=env,
        )

    def kubectl(
        self,
        *args: str,
        check: bool = True,
        kubeconfig: Path | None = None,
        stdin: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl against this cluster (admin identity unless ``kubeconfig`` is given)."""
        result = subprocess.run(
            [kubectl_binary(), "--kubeconfig", str(kubeconfig or self.kubeconfig), *args],
            text=True,
            capture_output=True,
            input=stdin,
            timeout=120,
            check=False,
        )
        if check and result.returncode != 0:
            raise KubectlFailed(result.returncode, result.args, result.stdout, result.stderr)
        return result

    def kubectl_json(self, *args: str) -> Any:
        return json.loads(self.kubectl(*args, "-o", "json").stdout)

    def promql(self, query: str) -> list[dict[str, Any]]:
        """An instant query's result, from this cluster's Prometheus: a vector, or a matrix
        for a range selector."""
        url = f"{self.prometheus_url}/api/v1/query?" + urllib.parse.urlencode({"query": query})
        with urllib.request.urlopen(url, timeout=10) as response:
            result: list[dict[str, Any]] = json.loads(response.read())["data"]["result"]
        return result

    def register_scrape_target(
        self, name: str, targets: list[str], job: str, labels: dict[str, str] | None = None
    ) -> Path:
        """Make Prometheus scrape ``targets`` (host:port, path /metrics) with label job=``job``."""
        path = self.prometheus_targets_dir / f"{name}.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps([{"targets": targets, "labels": {"job": job, **(labels or {})}}]))
        tmp.replace(path)
        return path

    def api_client(self) -> Any:
        """A kubernetes.client.ApiClient for the admin identity."""
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self.kubeconfig))


# test_faults.py stops the session's operator for the whole module and runs one of its own:
# last, so no other module waits for it to hand the operator back (each module still works in
# any order; see stop_operators() in operator_support.py).
RUN_LAST = ("test_faults.py",)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.path.name in RUN_LAST)  # stable: the rest keep their order


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    reuse = os.environ.get("GPUSIZER_E2E_CLUSTER_DIR")
    state_dir = (
        Path(reuse).resolve() if reuse else tmp_path_factory.mktemp("gpusizer-cluster") / "state"
    )
    up = run_script("cluster-up.sh", state_dir)
    if up.returncode != 0:
        pytest.fail(f"cluster-up.sh failed ({up.returncode}):\n{up.stdout}\n{up.stderr}")
    try:
        yield Cluster.from_state_dir(state_dir)
    finally:
        if not reuse:
            down = run_script("cluster-down.sh", state_dir)
            if down.returncode != 0:
                print(f"cluster-down.sh failed:\n{down.stdout}\n{down.stderr}")
