"""kopf's own API requests: its login, and the bounded number of them in flight at once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import kopf
import pytest
import yaml
from aiohttp import web
from gpusizer.kube import KOPF_REQUESTS_AT_ONCE, kopf_login, one_connection_per_request_slot
from kubernetes import client as k8s
from kubernetes.config import kube_config

from tests.support import free_port


class FakeApiServer:
    """An HTTP server noting the client connections requests came on; `?watch=true` streams
    until the server closes."""

    def __init__(self) -> None:
        self.connections: set[object] = set()
        self.authorizations: set[str] = set()
        self.closing = asyncio.Event()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.authorizations.add(request.headers.get("Authorization", ""))
        if request.query.get("watch") == "true":
            stream = web.StreamResponse()
            await stream.prepare(request)
            await self.closing.wait()
            return stream
        self.connections.add(request.transport)
        return web.json_response({"kind": "Status", "body": "x" * 1_000_000})


@pytest.fixture
async def api_server() -> AsyncIterator[tuple[FakeApiServer, str]]:
    server = FakeApiServer()
    app = web.Application()
    app.router.add_route("*", "/{path:.*}", server.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield server, f"http://127.0.0.1:{port}"
    finally:
        server.closing.set()
        await runner.cleanup()


async def burst(session: aiohttp.ClientSession, url: str, requests: int) -> list[int]:
    """`requests` PATCHes at once, whose callers read their bodies only once every one of them
    has been answered: a connection is free for the next request only once its body is read,
    so without the gate, or with it but without reading to the end, each takes a connection
    of its own."""
    answered = 0
    everyone_answered = asyncio.Event()

    async def one(n: int) -> int:
        nonlocal answered
        async with session.patch(f"{url}/apis/gpusizer.io/v1alpha1/x/{n}", json={}) as response:
            answered += 1
            if answered == requests:
                everyone_answered.set()
            await everyone_answered.wait()
            body = await response.json()
            return len(body["body"])

    return await asyncio.gather(*(one(n) for n in range(requests)))


async def test_requests_share_as_many_connections_as_there_are_slots(
    api_server: tuple[FakeApiServer, str],
) -> None:
    # thousands of finalizer patches at once opened a TLS connection each, 256 KiB apiece
    server, url = api_server
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), middlewares=(one_connection_per_request_slot(3),)
    ) as session:
        # a watch is answered while its stream stays open: gated, it would wait for the end
        watch = await asyncio.wait_for(session.get(f"{url}/api/v1/pods?watch=true"), timeout=10)
        bodies = await asyncio.wait_for(burst(session, url, 24), timeout=30)
        watch.close()
    assert bodies == [1_000_000] * 24  # every response whole, though read ahead of its caller
    assert len(server.connections) <= 3  # the open watch took no slot and none of these


async def test_kopf_logs_in_with_the_clients_configuration_on_the_bounded_session(
    api_server: tuple[FakeApiServer, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server, url = api_server
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": url}}],
                "users": [{"name": "u", "user": {"token": "secret-token"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    previous = k8s.Configuration.get_default_copy()
    try:
        settings = kopf.OperatorSettings()
        info = await kopf_login(
            logger=kopf.LocalObjectLogger(body=kopf.Body({}), settings=settings), settings=settings
        )
    finally:
        k8s.Configuration.set_default(previous)
    assert isinstance(info, kopf.AiohttpSession)
    assert info.server == url
    async with info.aiohttp_session as session:
        await asyncio.wait_for(burst(session, url, 3 * KOPF_REQUESTS_AT_ONCE), timeout=30)
    assert server.authorizations == {"Bearer secret-token"}
    assert len(server.connections) <= KOPF_REQUESTS_AT_ONCE
