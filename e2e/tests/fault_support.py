"""Faults on loopback for the e2e tests: a misbehaving Prometheus, an API server that goes away,
and kopf's peering for operator processes that take ``--peering``.

The proxies sit between one operator process and the real servers; nothing else goes through
them, so the rest of the cluster (controllers, kwok, the emulator) never sees the fault.
"""

from __future__ import annotations

import contextlib
import http.server
import socket
import struct
import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import requests
import yaml

from e2e.tests.conftest import REPO, Cluster


class PrometheusProxy:
    """An HTTP proxy in front of Prometheus whose answers a test chooses.

    Modes: ``pass`` (forward), ``slow`` (forward after ``delay`` seconds, longer than the
    operator's query timeout), ``status`` (answer ``status_code`` without asking Prometheus),
    ``garbage`` (200 with a body that is not JSON). With ``only``, the mode applies to the
    queries whose PromQL contains it, and the others pass.
    """

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.mode = "pass"
        self.delay = 0.0
        self.status_code = 500
        self.only: str | None = None
        self.served: dict[str, int] = {}
        self._lock = threading.Lock()
        self._release = threading.Event()  # set on shutdown: slow answers end at once
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                proxy._handle(self)

            def do_POST(self) -> None:
                proxy._handle(self)

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def set(
        self, mode: str, *, delay: float = 5.0, status_code: int = 500, only: str | None = None
    ) -> None:
        self.mode, self.delay, self.status_code, self.only = mode, delay, status_code, only

    def count(self, mode: str) -> int:
        with self._lock:
            return self.served.get(mode, 0)

    def _handle(self, req: http.server.BaseHTTPRequestHandler) -> None:
        mode, only = self.mode, self.only
        length = int(req.headers.get("Content-Length") or 0)
        body = req.rfile.read(length) if length else None
        if only is not None and only not in _promql(req.path, body):
            mode = "pass"
        with self._lock:
            self.served[mode] = self.served.get(mode, 0) + 1
        if mode == "status":
            self._answer(req, self.status_code, b'{"status":"error","error":"proxy fault"}')
            return
        if mode == "garbage":
            self._answer(req, 200, b"<html>this is not the JSON you are looking for")
            return
        if mode == "slow" and self._release.wait(self.delay):
            return  # shutting down
        try:
            upstream = requests.request(
                req.command,
                self.upstream + req.path,
                data=body,
                headers={"Content-Type": req.headers.get("Content-Type", "")},
                timeout=30,
            )
        except requests.RequestException:
            self._answer(req, 502, b"upstream unreachable")
            return
        with contextlib.suppress(OSError):  # the client gave up (timed out) meanwhile
            self._answer(req, upstream.status_code, upstream.content)

    @staticmethod
    def _answer(req: http.server.BaseHTTPRequestHandler, code: int, body: bytes) -> None:
        req.send_response(code)
        req.send_header("Content-Type", "application/json")
        req.send_header("Content-Length", str(len(body)))
        req.end_headers()
        req.wfile.write(body)

    def close(self) -> None:
        self._release.set()
        self._server.shutdown()
        self._server.server_close()


def _promql(path: str, body: bytes | None) -> str:
    """The query of a Prometheus API request, sent in the URL or as a form."""
    form = parse_qs(urlsplit(path).query)
    if body:
        form.update(parse_qs(body.decode(errors="replace")))
    return " ".join(form.get("query", []))


def _reset(sock: socket.socket) -> None:
    """Close with RST, as a crashed server's kernel does for its open connections.

    The shutdown wakes the pump thread blocked in recv() on it: on Linux a close() from
    another thread does not, and the socket stays open, silent, until that recv() returns.
    A watch through it then hangs until kopf's inactivity timeout instead of being reset."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RD)
    with contextlib.suppress(OSError):
        sock.close()


class ApiServerProxy:
    """A TCP proxy in front of kube-apiserver (TLS passes through untouched).

    ``down()`` is what the operator sees when the API server process restarts: every open
    connection (watches, in-flight requests) is reset, and every new one is reset at once until
    ``up()``. Attempts made while down are counted, so a test can hold the outage until the
    operator has noticed it rather than for a fixed time.

    ``silence()`` is a partition that forgets the open connections without telling either end
    (a load balancer or NAT dropping its flows): whatever is sent on them is dropped, while new
    connections pass.
    """

    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 443)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.url = f"https://127.0.0.1:{self.port}"
        self._down = False
        self.refused = 0
        self.accepted = 0
        self._open: set[socket.socket] = set()
        self._silenced: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            with self._lock:
                if self._down:
                    self.refused += 1
                    _reset(client)
                    continue
                self.accepted += 1
            try:
                server = socket.create_connection(self.upstream, timeout=10)
            except OSError:
                _reset(client)
                continue
            server.settimeout(None)
            with self._lock:
                cut = self._down  # it went down while this one was connecting upstream
                if not cut:
                    self._open.update((client, server))
            if cut:
                _reset(client)
                _reset(server)
                continue
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while chunk := source.recv(65536):
                if source not in self._silenced:
                    sink.sendall(chunk)
        except OSError:
            pass
        finally:
            with self._lock:
                self._open.discard(source)
                self._open.discard(sink)
                self._silenced.discard(source)
                self._silenced.discard(sink)
            _reset(source)
            _reset(sink)

    def down(self) -> None:
        with self._lock:
            self._down = True
            self.refused = 0
            victims = list(self._open)
            self._open.clear()
        for sock in victims:
            _reset(sock)

    def silence(self) -> int:
        """Drop everything sent on the connections open now; returns how many there are."""
        with self._lock:
            self._silenced.update(self._open)
            return len(self._open) // 2

    def up(self) -> None:
        with self._lock:
            self._down = False

    def close(self) -> None:
        self.down()
        self._listener.close()


# where the peered replicas' Lease lives: the operator's namespace, as the chart puts it
LEASE_NAMESPACE = "gpusizer-system"


def lease_args(name: str) -> list[str]:
    """The `gpusizer run` options of a replica under peering `name`, as the chart gives them."""
    return ["--peering", name, "--lease", f"{LEASE_NAMESPACE}/{name}"]


def peering_objects(name: str) -> str:
    """A ClusterKopfPeering and the RBAC the chart grants for it and for the Lease when peering
    is enabled, bound to the operator's ServiceAccount, as one YAML List."""
    account = {"kind": "ServiceAccount", "name": "gpusizer", "namespace": LEASE_NAMESPACE}
    lease_role = {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": f"lease-{name}"}
    objects = [
        {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": name}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": f"gpusizer-peering-{name}"},
            "rules": [
                {
                    "apiGroups": ["kopf.dev"],
                    "resources": ["clusterkopfpeerings"],
                    "resourceNames": [name],
                    "verbs": ["get", "patch"],
                },
                {
                    "apiGroups": ["kopf.dev"],
                    "resources": ["clusterkopfpeerings"],
                    "verbs": ["list", "watch"],
                },
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": f"gpusizer-peering-{name}"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": f"gpusizer-peering-{name}",
            },
            "subjects": [account],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": f"lease-{name}", "namespace": LEASE_NAMESPACE},
            "rules": [
                {
                    "apiGroups": ["coordination.k8s.io"],
                    "resources": ["leases"],
                    "resourceNames": [name],
                    "verbs": ["get", "update"],
                },
                {
                    "apiGroups": ["coordination.k8s.io"],
                    "resources": ["leases"],
                    "verbs": ["create"],
                },
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": f"lease-{name}", "namespace": LEASE_NAMESPACE},
            "roleRef": lease_role,
            "subjects": [account],
        },
    ]
    return yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": objects})


@contextlib.contextmanager
def peering(cluster: Cluster, name: str) -> Iterator[None]:
    """kopf's peering CRDs (from the chart, left installed as the chart leaves them) and
    ``peering_objects(name)``, which are deleted again on the way out."""
    cluster.kubectl(
        "apply", "-f", str(REPO / "charts" / "gpusizer" / "crds" / "kopf.dev_peerings.yaml")
    )
    cluster.kubectl(
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/clusterkopfpeerings.kopf.dev",
    )
    cluster.kubectl("apply", "-f", "-", stdin=peering_objects(name))
    try:
        yield
    finally:
        cluster.kubectl(
            "delete", "--ignore-not-found", "-f", "-", stdin=peering_objects(name), check=False
        )
