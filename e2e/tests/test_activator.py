"""The activator on the local cluster: a workload at zero behind its Service, woken by the
requests themselves and serving every one of them; the bounds; a rolling restart and a
SIGKILL of one of the two activator replicas.

Requests reach the Service as kube-proxy routes them (e2e/loadgen.py): through the
EndpointSlice the operator writes while no replica is ready (the activator's replicas), then
through the pods' own. The activator's processes run at their pods' IPs, the GPU emulator's
inference servers at theirs: every address is inside 127.0.0.0/8. Timing figures (the wake
latency over 20 cold starts, the latency the activator adds) are measured by
bench/activator.py, not asserted here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from e2e.loadgen import Answer, ServiceEndpoints, send, summary
from e2e.tests.activator_support import ACTIVATOR, ActivatorPods, ReplicaWatch
from e2e.tests.conftest import Cluster, kubectl_binary, wait_until
from e2e.tests.operator_support import OPERATOR_NAMESPACE, Operator, Workloads, sizing_spec

CONTROLLER = "endpointslice-controller.k8s.io"


@pytest.fixture(scope="module")
def activator(
    manifests: Cluster, operator: Operator, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ActivatorPods]:
    pods = ActivatorPods(manifests, tmp_path_factory.mktemp("activator"))
    pods.install()
    try:
        pods.wait_ready(2)
        yield pods
    finally:
        pods.uninstall()


def at_zero(
    workloads: Workloads,
    *,
    startup: float = 2,
    max_pending: int = 1000,
    hold: int = 600,
) -> ServiceEndpoints:
    """`chat` at zero replicas behind its Service, the activator enabled: returns the
    Service's endpoints once they are the activator's."""
    workloads.deployment(
        "chat",
        replicas=0,
        startup_seconds=startup,
        annotations={"gpusim.gpusizer.io/token-seconds": "0.005"},
    )
    workloads.apply(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "chat", "namespace": workloads.namespace},
            "spec": {
                "selector": {"app": "chat"},
                "ports": [{"name": "http", "port": 80, "targetPort": 8000}],
            },
        }
    )
    spec = sizing_spec(
        "chat",
        replicas={"min": 0, "max": 2},
        scaleToZero={
            "enabled": True,
            "idleSeconds": 3600,
            "activator": {
                "enabled": True,
                "maxPendingRequests": max_pending,
                "holdTimeoutSeconds": hold,
            },
        },
    )
    assert workloads.sizing("chat", spec).returncode == 0
    endpoints = ServiceEndpoints(
        workloads.cluster.api_client(), workloads.namespace, "chat", "http"
    )
    wait_until(
        lambda: endpoints.managers() == {"gpusizer.io"} and len(endpoints.ready()) == 2,
        60,
        what="the Service pointed at the two activator replicas",
    )
    assert (workloads.status("chat").get("activator") or {}).get("routing") == "Activator"
    return endpoints


def burst(
    endpoints: ServiceEndpoints | list[str],
    count: int,
    *,
    streamed: int = 0,
    retries: int = 0,
    prefix: str = "r",
) -> list[Answer]:
    """`count` requests at once (the first `streamed` of them streamed, every other one a
    chat completion), as many clients would send them."""

    async def run() -> list[Answer]:
        connector = aiohttp.TCPConnector(limit=0, force_close=True)
        async with aiohttp.ClientSession(connector=connector) as session:
            return list(
                await asyncio.gather(
                    *(
                        send(
                            session,
                            endpoints,
                            f"{prefix}{i}",
                            stream=i < streamed,
                            chat=i % 2 == 1,
                            retries=retries,
                        )
                        for i in range(count)
                    )
                )
            )

    return asyncio.run(run())


def activator_requests(activator: ActivatorPods, namespace: str) -> float:
    return sum(
        activator.metric(c, "gpusizer_activator_requests_total", namespace=namespace)
        for c in activator.ready_pods()
    )


def test_the_api_server_refuses_a_bad_activator_and_needs_no_wake_query_with_one(
    workloads: Workloads,
) -> None:
    def with_stz(stz: dict[str, Any]) -> dict[str, Any]:
        return sizing_spec("x", replicas={"min": 0, "max": 2}, scaleToZero=stz)

    cases = {
        "scaleToZero.wakeQuery or scaleToZero.activator.enabled is required": {"enabled": True},
        "spec.scaleToZero.activator.port": {"enabled": True, "activator": {"port": 70000}},
        "spec.scaleToZero.activator.maxPendingRequests": {
            "enabled": True,
            "activator": {"enabled": True, "maxPendingRequests": 0},
        },
        "spec.scaleToZero.activator.service": {
            "enabled": True,
            "activator": {"enabled": True, "service": "Not_A_Service"},
        },
    }
    for expected, stz in cases.items():
        result = workloads.sizing("bad", with_stz(stz))
        assert result.returncode != 0, f"accepted a spec that should fail with {expected!r}"
        assert expected in result.stderr, result.stderr
    ok = workloads.sizing("good", with_stz({"enabled": True, "activator": {"enabled": True}}))
    assert ok.returncode == 0, ok.stderr
    stored = workloads.cluster.kubectl_json("get", "wls", "good", "-n", workloads.namespace)
    activator = stored["spec"]["scaleToZero"]["activator"]
    assert (activator["maxPendingRequests"], activator["holdTimeoutSeconds"]) == (1000, 600)


def test_a_workload_at_zero_answers_200_concurrent_requests_half_streamed(
    activator: ActivatorPods, workloads: Workloads, cluster: Cluster
) -> None:
    namespace = workloads.namespace
    endpoints = at_zero(workloads)
    replicas = ReplicaWatch(cluster, namespace, "chat")
    try:
        answers = burst(endpoints, 200, streamed=100)
    finally:
        replicas.stop()
    assert summary(answers) == {"requests": 200, "ok": 200, "failed": {}}
    served = workloads.emulated("chat")
    assert served["httpRequests"] == 200 and served["httpDuplicates"] == [], served
    first = min(a.started for a in answers)
    woken = replicas.woken_after(first)
    assert woken is not None, "the requests themselves woke the workload"
    status = workloads.status("chat")["activator"]
    print(
        f"wake: first request -> /scale seen by a watch {woken - first:.3f} s; "
        f"the operator's own figure {status.get('lastWakeSeconds')} s"
    )
    assert status["lastWakeSeconds"] is not None
    # out of the path once a replica is ready: the operator's slice goes, and what is sent
    # now reaches the pods without passing the activator
    wait_until(
        lambda: endpoints.managers() == {CONTROLLER}, 60, what="the activator's slice removed"
    )
    wait_until(
        lambda: workloads.status("chat")["activator"]["routing"] == "Direct",
        30,
        what="routing Direct",
    )
    before = activator_requests(activator, namespace)
    assert before == 200
    more = burst(endpoints, 50, streamed=25, prefix="ready")
    assert summary(more)["ok"] == 50
    assert activator_requests(activator, namespace) == before, "none passed the activator"
    endpoints.stop()


def test_past_max_pending_requests_503_at_once_past_hold_timeout_504(
    activator: ActivatorPods, workloads: Workloads
) -> None:
    endpoints = at_zero(workloads, startup=600, max_pending=50, hold=5)
    port = workloads.status("chat")["activator"]["port"]
    one = activator.ready_pods()[0]
    target = [f"{one.ip}:{port}"]  # one replica: the bound is each replica's

    async def run() -> tuple[list[Answer], Answer]:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            held = [
                asyncio.ensure_future(send(session, target, f"h{i}", stream=i % 2 == 0))
                for i in range(50)
            ]
            await activator.until_held([one], workloads.namespace, 50)
            refused = await send(session, target, "over", stream=False)
            return list(await asyncio.gather(*held)), refused

    held, refused = asyncio.run(run())
    assert refused.status == 503 and refused.retry_after == "10", refused.error
    assert "maxPendingRequests 50" in refused.error
    assert refused.ended is not None and refused.ended < min(a.ended or 0 for a in held)
    assert {(a.status, a.retry_after) for a in held} == {(504, "30")}
    assert all("holdTimeoutSeconds (5 s)" in a.error for a in held)
    assert all((a.ended or 0) - a.started >= 4.9 for a in held)
    endpoints.stop()


def test_a_rolling_restart_of_the_activator_with_requests_held_loses_none(
    activator: ActivatorPods, workloads: Workloads, cluster: Cluster
) -> None:
    endpoints = at_zero(workloads, startup=20)
    old = {c.pod for c in activator.ready_pods()}
    old_ips = {c.ip for c in activator.ready_pods()}

    async def run() -> list[Answer]:
        connector = aiohttp.TCPConnector(limit=0, force_close=True)
        async with aiohttp.ClientSession(connector=connector) as session:
            first = [
                asyncio.ensure_future(
                    send(session, endpoints, f"a{i}", stream=i % 2 == 0, retries=2)
                )
                for i in range(40)
            ]
            await asyncio.sleep(1)  # a wave of clients, a second apart
            restart = await asyncio.create_subprocess_exec(
                *cluster_kubectl(cluster),
                "rollout",
                "restart",
                f"deployment/{ACTIVATOR}",
                "-n",
                OPERATOR_NAMESPACE,
            )
            assert await restart.wait() == 0
            later: list[asyncio.Future[Answer]] = []
            # clients keep coming, a wave a second, until both old replicas drain, and after
            wave, after = 0, 3
            while after:
                later += [
                    asyncio.ensure_future(
                        send(session, endpoints, f"b{wave}-{i}", stream=i % 2 == 0, retries=2)
                    )
                    for i in range(5)
                ]
                wave += 1
                if draining(activator, old) or wave > 40:
                    after -= 1
                await asyncio.sleep(1)
            return list(await asyncio.gather(*first, *later))

    answers = asyncio.run(run())
    assert draining(activator, old), "both old replicas drained while clients came"
    wait_until(
        lambda: {c.pod for c in activator.wait_ready(2)}.isdisjoint(old),
        90,
        what="two new activator replicas",
    )
    count = len(answers)
    failed = [f"{a.rid} via {a.endpoints}: {a.error}" for a in answers if not a.ok]
    assert summary(answers) == {"requests": count, "ok": count, "failed": {}}, failed[:5]
    drained = [a for a in answers if a.endpoints[-1].split(":")[0] in old_ips]
    assert drained, "some were held by a replica that drained, and forwarded from it"
    assert len(drained) < count, "the later ones went to the new replicas"
    retried = [a for a in answers if a.attempts > 1]
    print(
        f"rolling restart: {count} requests; {len(drained)} served by the old replicas, held "
        f"while they drained; {len(retried)} retried after a 503 from a draining replica"
    )
    endpoints.stop()


def draining(activator: ActivatorPods, pods: set[str]) -> bool:
    """Every one of `pods` was told to stop (SIGTERM sent, or exited since)."""
    stopping = {c.pod for c in activator.gone}
    stopping |= {c.pod for c in list(activator.containers.values()) if c.deleted_at is not None}
    return pods <= stopping


def cluster_kubectl(cluster: Cluster) -> list[str]:
    return [kubectl_binary(), "--kubeconfig", str(cluster.kubeconfig)]


def test_sigkill_of_one_activator_replica_loses_only_what_it_held(
    activator: ActivatorPods, workloads: Workloads
) -> None:
    endpoints = at_zero(workloads, startup=10)
    replicas = activator.wait_ready(2)
    victim, survivor = replicas[0], replicas[1]
    port = workloads.status("chat")["activator"]["port"]

    async def run() -> list[Answer]:
        connector = aiohttp.TCPConnector(limit=0, force_close=True)
        async with aiohttp.ClientSession(connector=connector) as session:
            tasks = [
                asyncio.ensure_future(
                    send(session, [f"{c.ip}:{port}"], f"{c.pod}-{i}", stream=i % 2 == 0)
                )
                for c in (victim, survivor)
                for i in range(20)
            ]
            await activator.until_held([victim, survivor], workloads.namespace, 20)
            activator.kill(victim)
            return list(await asyncio.gather(*tasks))

    answers = asyncio.run(run())
    theirs = [a for a in answers if a.rid.startswith(victim.pod)]
    ours = [a for a in answers if a.rid.startswith(survivor.pod)]
    assert summary(ours) == {"requests": 20, "ok": 20, "failed": {}}
    seen = summary(theirs)
    print(f"SIGKILL: the killed replica's 20 clients saw {seen['failed']}")
    assert seen["ok"] == 0 and all(a.status is None for a in theirs), "no HTTP answer at all"
    # the kubelet starts the process again; the workload stays served through the survivor
    activator.wait_ready(2)
    endpoints.stop()
