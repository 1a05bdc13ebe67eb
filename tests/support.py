"""Helpers shared by the integration and end-to-end tests."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


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
