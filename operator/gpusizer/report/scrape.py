"""The metrics port: `metrics.exposition()` over HTTP, in the text format (0.0.4), which every
Prometheus accepts whatever else it asks for.

Not prometheus_client's server: its app renders the whole exposition through its own families,
in OpenMetrics when Prometheus asks for it, and compresses it at gzip's slowest level; at
10,000 workloads that was four seconds of CPU a scrape (bench/README.md, "Issue 29: the
operator's own /metrics"). This one sends the exposition a family at a time as it is written.
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client.exposition import (
    CONTENT_TYPE_PLAIN_0_0_4,
    ThreadingWSGIServer,
    gzip_accepted,
)

from gpusizer.report import metrics

# zlib's fastest level: an eighth of the CPU of the slowest for about a fifth more bytes on the
# wire (bench/README.md)
GZIP_LEVEL = 1

StartResponse = Callable[[str, list[tuple[str, str]]], Any]


def gzipped(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """The chunks as one gzip stream."""
    stream = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    for chunk in chunks:
        yield stream.compress(chunk)
    yield stream.flush()


def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
    """GET on any path, as prometheus_client's server answers."""
    if environ["REQUEST_METHOD"] != "GET":
        start_response("405 Method Not Allowed", [("Allow", "GET")])
        return [b"use GET\n"]
    headers = [("Content-Type", CONTENT_TYPE_PLAIN_0_0_4)]
    chunks: Iterable[bytes] = metrics.exposition()
    if gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING", "")):
        headers.append(("Content-Encoding", "gzip"))
        chunks = gzipped(chunks)
    start_response("200 OK", headers)
    return chunks


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """A line per scrape on stderr would say nothing."""


def serve(port: int, address: str = "0.0.0.0") -> ThreadingWSGIServer:
    """Serve the metrics port from a daemon thread, a thread per scrape."""
    server = make_server(address, port, app, ThreadingWSGIServer, handler_class=_Quiet)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server
