"""HTTP: `/metrics` for Prometheus, `/healthz`, and the JSON control API under `/v1/workloads`."""

from __future__ import annotations

import json
import logging
import math
import re
import threading
from collections.abc import Iterable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from e2e.gpusim.exposition import CachedExposition, ExporterOptions, PartExpositions
from e2e.gpusim.sim import Simulator

log = logging.getLogger(__name__)

_WORKLOAD = re.compile(
    r"^/v1/workloads/([a-z0-9][a-z0-9.-]*)/([a-z0-9][a-z0-9.-]*)(/load|/replay)?$"
)


_NAMESPACE = re.compile(r"^/v1/workloads/([a-z0-9][a-z0-9.-]*)$")
_RESTART = re.compile(r"^/v1/pods/([a-z0-9][a-z0-9.-]*)/([a-z0-9][a-z0-9.-]*)/restart$")
_NODE_SCRAPE = re.compile(r"^/v1/nodes/([a-z0-9][a-z0-9.-]*)/scrape$")


NODE_METRICS = "/metrics/nodes/"
GATEWAY_METRICS = "/metrics/gateway"


class ScrapeTargets:
    """Writes Prometheus file_sd targets the way service discovery finds a dcgm-exporter
    DaemonSet: one target per GPU node (its own scrape phase, a small body), and one for the
    gateway. Rewritten, atomically, when the GPU nodes change."""

    def __init__(self, path: Path, address: str, job: str = "gpusim") -> None:
        self._path = path
        self._address = address
        self._job = job
        self._nodes: list[str] | None = None

    def update(self, nodes: Iterable[str]) -> None:
        current = sorted(nodes)
        if current == self._nodes:
            return
        parts = [(node, NODE_METRICS + node) for node in current] + [("gateway", GATEWAY_METRICS)]
        groups = [
            {
                "targets": [self._address],
                "labels": {"job": self._job, "instance": instance, "__metrics_path__": path},
            }
            for instance, path in parts
        ]
        partial = self._path.with_name(self._path.name + ".tmp")
        partial.write_text(json.dumps(groups, indent=1))
        partial.replace(self._path)
        self._nodes = current
        log.info("scrape targets: %d GPU node(s) and the gateway in %s", len(current), self._path)


class BadRequest(Exception):
    """A client error; the message names the offending field."""


def _number(body: dict[str, Any], field: str, default: float | None = None) -> float:
    value = body.get(field, default)
    if value is None:
        raise BadRequest(f"{field}: required")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise BadRequest(f"{field}: must be a finite number")
    return float(value)


class GpusimServer(ThreadingHTTPServer):
    daemon_threads = True
    # Prometheus opens a connection per scrape (HTTP/1.0), one per GPU node every interval, in
    # bursts; socketserver's backlog of 5 overflowed at 10,000 workloads and the kernel reset
    # the connections it could not queue, a control API call among them (bench/README.md).
    request_queue_size = 1024

    def __init__(self, address: tuple[str, int], sim: Simulator, options: ExporterOptions) -> None:
        super().__init__(address, _Handler)
        self.sim = sim
        self.exposition = CachedExposition(sim.view, options)
        self.parts = PartExpositions(sim.view, options)
        self.scrape_down: set[str] = set()  # GPU nodes whose exporter answers 503

    def serve_in_thread(self) -> threading.Thread:
        thread = threading.Thread(
            target=self.serve_forever, args=(0.1,), name="gpusim-http", daemon=True
        )
        thread.start()
        return thread


class _Handler(BaseHTTPRequestHandler):
    server: GpusimServer

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _metrics(self, body: bytes) -> None:
        self._send(200, body, "text/plain; version=0.0.4; charset=utf-8")

    def _json(self, status: int, document: Any) -> None:
        self._send(status, json.dumps(document).encode(), "application/json")

    def _error(self, status: int, message: str) -> None:
        self._json(status, {"error": message})

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        try:
            document = json.loads(self.rfile.read(length) or b"null")
        except json.JSONDecodeError as err:
            raise BadRequest(f"body: not JSON: {err}") from err
        if not isinstance(document, dict):
            raise BadRequest("body: must be a JSON object")
        return document

    def do_GET(self) -> None:
        if self.path == "/metrics":
            self._metrics(self.server.exposition.body())
        elif self.path.startswith(NODE_METRICS):
            node = self.path[len(NODE_METRICS) :]
            body = self.server.parts.node(node)
            if node in self.server.scrape_down:
                self._error(HTTPStatus.SERVICE_UNAVAILABLE, f"the exporter of {node} is down")
            elif body is None:
                self._error(HTTPStatus.NOT_FOUND, f"no GPU node {node!r}")
            else:
                self._metrics(body)
        elif self.path == GATEWAY_METRICS:
            self._metrics(self.server.parts.gateway())
        elif self.path in ("/healthz", "/health"):
            self._send(200, b"ok\n", "text/plain")
        else:
            namespace = _NAMESPACE.match(self.path)
            if namespace is not None:
                self._json(200, self.server.sim.describe_namespace(namespace.group(1)))
                return
            match = _WORKLOAD.match(self.path)
            if match is None or match.group(3):
                self._error(HTTPStatus.NOT_FOUND, f"no such path {self.path}")
                return
            self._json(200, self.server.sim.describe((match.group(1), match.group(2))))

    def do_DELETE(self) -> None:
        match = _NAMESPACE.match(self.path)
        if match is None:
            self._error(HTTPStatus.NOT_FOUND, f"no such path DELETE {self.path}")
            return
        self._json(200, {"forgotten": self.server.sim.forget_namespace(match.group(1))})

    def do_PUT(self) -> None:
        scrape = _NODE_SCRAPE.match(self.path)
        if scrape is not None:
            self._scrape(scrape.group(1))
        else:
            self._write("/load")

    def _scrape(self, node: str) -> None:
        """A node's exporter down (its scrape answers 503) or up again."""
        try:
            up = self._body().get("up")
            if not isinstance(up, bool):
                raise BadRequest("up: required, true or false")
        except BadRequest as err:
            self._error(HTTPStatus.BAD_REQUEST, str(err))
            return
        if up:
            self.server.scrape_down.discard(node)
        else:
            self.server.scrape_down.add(node)
        self._json(200, {"node": node, "up": up})

    def do_POST(self) -> None:
        restart = _RESTART.match(self.path)
        if restart is None:
            self._write("/replay")
        elif self.server.sim.restart(restart.group(1), restart.group(2)):
            self._json(200, {"restarted": f"{restart.group(1)}/{restart.group(2)}"})
        else:
            self._error(
                HTTPStatus.NOT_FOUND, f"no emulated pod {restart.group(1)}/{restart.group(2)}"
            )

    def _write(self, action: str) -> None:
        match = _WORKLOAD.match(self.path)
        if match is None or match.group(3) != action:
            self._error(HTTPStatus.NOT_FOUND, f"no such path {self.command} {self.path}")
            return
        key = (match.group(1), match.group(2))
        try:
            body = self._body()
            if action == "/load":
                rps = _number(body, "requestsPerSecond")
                if rps < 0:
                    raise BadRequest("requestsPerSecond: must be >= 0")
                self.server.sim.set_load(key, rps)
                self._json(200, self.server.sim.describe(key))
                return
            trace = body.get("trace")
            if not isinstance(trace, str) or not trace:
                raise BadRequest("trace: required, a path to a trace file on the emulator's host")
            speedup = _number(body, "speedup", 1.0)
            scale = _number(body, "scale", 1.0)
            offset = _number(body, "offsetSeconds", 0.0)
            loop = body.get("loop", False)
            if speedup <= 0:
                raise BadRequest("speedup: must be > 0")
            if scale < 0:
                raise BadRequest("scale: must be >= 0")
            if offset < 0:
                raise BadRequest("offsetSeconds: must be >= 0")
            if not isinstance(loop, bool):
                raise BadRequest("loop: must be true or false")
            try:
                seconds = self.server.sim.replay(key, Path(trace), speedup, scale, offset, loop)
            except (OSError, ValueError) as err:
                raise BadRequest(f"trace: {err}") from err
            self._json(200, {**self.server.sim.describe(key), "replaySeconds": seconds})
        except BadRequest as err:
            self._error(HTTPStatus.BAD_REQUEST, str(err))
