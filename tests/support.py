"""Helpers shared by the tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

import requests

T = TypeVar("T")


def in_a_fresh_interpreter(
    code: str, unset: Iterable[str] = ()
) -> subprocess.CompletedProcess[str]:
    """`code` run by a new Python that imports this gpusizer, without the variables `unset`:
    for what acts on a whole process (its allocator, its collector)."""
    package_root = Path(__file__).resolve().parents[1] / "operator"
    env = {k: v for k, v in os.environ.items() if k not in set(unset)}
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**env, "PYTHONPATH": str(package_root)},
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(probe: Callable[[], T | None], timeout: float, what: str, interval: float = 0.2) -> T:
    """Poll until `probe` returns something truthy; fail naming `what` and the last value."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last: {last!r}")


def start_prometheus(
    binary: str, workdir: Path, *flags: str
) -> tuple[subprocess.Popen[bytes], int]:
    """Prometheus on a free port, with workdir/prometheus.yml, its data in workdir/data and
    its log in workdir/prometheus.log; the port it listens on."""
    port = free_port()
    with (workdir / "prometheus.log").open("w") as log:
        proc = subprocess.Popen(
            [
                binary,
                f"--config.file={workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                *flags,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    return proc, port


def wait_for_prometheus(proc: subprocess.Popen[bytes], url: str, timeout: float) -> None:
    """Until the Prometheus `proc` serving `url` says it is ready; fails at once if it exited
    (its log, workdir/prometheus.log, says why) rather than wait out `timeout`."""

    def ready() -> bool:
        try:
            return requests.get(f"{url}/-/ready", timeout=1).status_code == 200
        except requests.RequestException:
            if proc.poll() is not None:
                raise AssertionError("prometheus exited; see its log") from None
            return False

    wait_for(ready, timeout, "prometheus /-/ready")
