"""A real Prometheus server scraping a small exporter whose output the test controls."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.support import free_port, start_prometheus, wait_for, wait_for_prometheus


class Exporter:
    """Serves whatever exposition text the test sets, like any /metrics endpoint."""

    def __init__(self) -> None:
        self.body = ""
        self.scrapes = 0
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                exporter.scrapes += 1
                data = exporter.body.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def set(self, body: str) -> None:
        """Serve `body` and return once Prometheus has scraped it at least twice."""
        self.body = body
        seen = self.scrapes
        wait_for(lambda: self.scrapes >= seen + 2, 20, "two scrapes of the new exposition")


@pytest.fixture(scope="session")
def exporter() -> Iterator[Exporter]:
    exp = Exporter()
    yield exp
    exp.server.shutdown()


@pytest.fixture(scope="session")
def prometheus(exporter: Exporter, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("prometheus is not installed: run `make prometheus`")
    workdir: Path = tmp_path_factory.mktemp("prometheus")
    config = workdir / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: test\n"
        "    honor_labels: true\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{exporter.port}']}}]\n"
    )
    proc, port = start_prometheus(binary, workdir)
    url = f"http://127.0.0.1:{port}"
    wait_for_prometheus(proc, url, 60)
    yield url
    proc.terminate()
    proc.wait(timeout=20)
