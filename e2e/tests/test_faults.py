"""Faults around the operator: each test asserts that nothing is lost and nothing wrong is done.

Any operator of the session (operator_support.py) is stopped for this module and started again
after it; one operator of its own (``faulty``) talks to Prometheus and to the API server through
loopback proxies that inject the faults, so exactly one operator acts at a time. Tests that need
other processes (two peered replicas, a SIGKILL) stop ``faulty`` and the autouse fixture starts
it again. Every wait polls with a deadline. conftest.py runs this module last, so the other
modules never wait for it to hand their operator back.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from e2e.tests.conftest import Cluster, wait_until
from e2e.tests.fault_support import (
    LEASE_NAMESPACE,
    ApiServerProxy,
    PrometheusProxy,
    lease_args,
    peering,
)
from e2e.tests.operator_support import Operator, Workloads, sizing_spec, stop_operators

RESHAPE = "gpusizer.io/reshape"


@dataclass
class Faults:
    cluster: Cluster
    prometheus: PrometheusProxy
    api: ApiServerProxy
    op: Operator
    workdir: Path

    def operator(self, name: str, *extra: str) -> Operator:
        """Another operator process under the same identity, not through the proxies."""
        return Operator(self.cluster, self.workdir, name=name, extra_args=list(extra))


@pytest.fixture(scope="module")
def faults(manifests: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Faults]:
    cluster = manifests
    workdir = tmp_path_factory.mktemp("faults")
    paused = stop_operators()  # only one operator acts at a time
    prometheus = PrometheusProxy(cluster.prometheus_url)
    api = ApiServerProxy(cluster.apiserver_url)
    # reading every second with a 2 s sync period: every other read asks only for the pods
    # that moved (held_through makes sure such a read meets each of Prometheus's faults)
    op = Operator(
        cluster,
        workdir,
        name="faulty",
        read_period=1,
        prometheus_url=prometheus.url,
        api_server=api.url,
    )
    try:
        op.start()
        yield Faults(cluster, prometheus, api, op, workdir)
    finally:
        op.stop()
        prometheus.close()
        api.close()
        for other in paused:
            other.start()


@pytest.fixture(autouse=True)
def healthy(faults: Faults) -> Iterator[None]:
    """Every test starts with both proxies passing through and ``faulty`` running."""
    faults.prometheus.set("pass")
    faults.api.up()
    if not faults.op.running():
        faults.op.start()
    yield
    faults.prometheus.set("pass")
    faults.api.up()


def generation(workloads: Workloads, name: str) -> int:
    dep = workloads.cluster.kubectl_json("get", "deployment", name, "-n", workloads.namespace)
    return int(dep["metadata"]["generation"])


def moved_read_failures(op: Operator) -> float:
    """Queries of reads asking only for the pods that moved that failed so far."""
    return op.metric("gpusizer_prometheus_query_errors_total", signal="moved:gpu_util") + sum(
        op.metric("gpusizer_prometheus_query_errors_total", signal=f"moved:queue:{server}")
        for server in ("vllm", "triton", "tgi", "sglang")
    )


def fault_meets_a_moved_read(faults: Faults, mode: str, options: dict[str, Any]) -> None:
    """Turns the fault on so that a read asking only for the pods that moved meets it. Only
    the read after a full read that answered asks anything (the pods it showed), and a slow
    Prometheus stretches every read past the sync period: if the next read is a full one, the
    fault is turned off until a full read answers again, and on again."""
    for _ in range(10):
        failed = moved_read_failures(faults.op)
        faults.prometheus.set(mode, **options)
        try:
            wait_until(
                lambda n=failed: moved_read_failures(faults.op) > n,
                15,
                what="a moved read meeting the fault",
            )
            return
        except TimeoutError:
            faults.prometheus.set("pass")
            wait_until(
                lambda: faults.op.metric("gpusizer_prometheus_available") == 1,
                60,
                what="Prometheus answering again",
            )
    raise AssertionError("no read asking for the moved pods met the fault in 10 tries")


def holding_decisions(op: Operator, name: str) -> float:
    return op.metric("gpusizer_decisions_total", name=name, reason="HoldingOnUnknownMetrics")


def steady_at_three(workloads: Workloads, name: str, **spec: Any) -> None:
    """A workload at 3 ready replicas, 70 % busy, decided with known metrics."""
    workloads.deployment(name, replicas=3)
    workloads.busy(name, 3)
    assert workloads.sizing(name, sizing_spec(name, **spec)).returncode == 0
    workloads.wait_condition(name, "MetricsAvailable", "True", timeout=120)


def scale_to_zero(namespace: str, name: str) -> dict[str, Any]:
    wake = f'sum(gateway_pending_requests{{namespace="{namespace}",service="{name}"}})'
    return {
        "replicas": {"min": 0},
        "scaleToZero": {"enabled": True, "idleSeconds": 4, "wakeQuery": wake},
    }


def test_prometheus_slow_holds_replicas(faults: Faults, workloads: Workloads) -> None:
    held_through(faults, workloads, "slow", {"delay": 5.0}, {"PrometheusUnreachable"}, "timed out")


def test_prometheus_500_holds_replicas(faults: Faults, workloads: Workloads) -> None:
    held_through(faults, workloads, "status", {"status_code": 500}, {"QueryError"}, "500")


def test_prometheus_503_holds_replicas(faults: Faults, workloads: Workloads) -> None:
    held_through(
        faults, workloads, "status", {"status_code": 503}, {"PrometheusUnreachable"}, "503"
    )


def test_prometheus_garbage_holds_replicas(faults: Faults, workloads: Workloads) -> None:
    held_through(faults, workloads, "garbage", {}, {"QueryError"}, "unreadable response")


def test_one_query_timing_out_rides_on_the_samples_before_then_says_so(
    faults: Faults, workloads: Workloads
) -> None:
    """Prometheus too busy for one query of each read (the GPU utilisation's) while the others
    answer is no outage: the workload goes on deciding on the utilisation read before, without
    holding or writing its condition, while those samples are fresh (maxSampleAgeSeconds 90:
    each timed-out query takes two 3 s timeouts, moved reads included), and says the failure
    once they are not."""
    name = "partial"
    steady_at_three(workloads, name, metrics={"maxSampleAgeSeconds": 90})
    op = faults.op
    before = workloads.condition(name, "MetricsAvailable")

    def failed() -> float:
        return op.metric("gpusizer_prometheus_query_errors_total", signal="gpu_util")

    holds, decided, failures = (
        holding_decisions(op, name),
        op.metric("gpusizer_decisions_total", name=name),
        failed(),
    )
    faults.prometheus.set("slow", delay=5.0, only="DCGM_FI_DEV_GPU_UTIL")
    wait_until(
        lambda: (
            failed() >= failures + 3
            and op.metric("gpusizer_decisions_total", name=name) >= decided + 3
        ),
        60,
        what="three full reads whose utilisation timed out, and three decisions",
    )
    assert holding_decisions(op, name) == holds, "decided on the utilisation read before"
    assert workloads.condition(name, "MetricsAvailable") == before, "nothing written"

    condition = workloads.wait_condition(
        name, "MetricsAvailable", "False", "PrometheusUnreachable", timeout=150
    )
    assert "timed out" in condition["message"], condition
    assert "maxSampleAgeSeconds 90" in condition["message"], condition
    assert workloads.replicas(name) == 3
    faults.prometheus.set("pass")
    workloads.wait_condition(name, "MetricsAvailable", "True", timeout=90)


def held_through(
    faults: Faults,
    workloads: Workloads,
    mode: str,
    options: dict[str, Any],
    reasons: set[str],
    says: str,
) -> None:
    """Prometheus answers badly: no scale-down, no scale to zero, a condition saying why (once
    the outage has lasted the operator's grace, 20 sync periods), and the real (idle) load
    acts once it answers again. A read that asks only for the pods that moved meets this very
    fault, not only the full reads."""
    name = "held"
    steady_at_three(workloads, name, **scale_to_zero(workloads.namespace, name))
    fault_meets_a_moved_read(faults, mode, options)
    condition = workloads.wait_condition(name, "MetricsAvailable", "False", timeout=120)
    assert condition["reason"] in reasons, condition
    assert says in condition["message"] and "Holding replicas" in condition["message"], condition
    held, before = workloads.replicas(name), generation(workloads, name)

    # With the fault on, the truth is "idle": idleSeconds (4 s) and the scale-down window (6 s)
    # pass several times over while the operator keeps deciding. It must hold every time. (A
    # slow Prometheus stretches a cycle to about 12 s: two 3 s timeouts per query, in a pool
    # of worker threads shared with the API calls.)
    workloads.load(name, 0)
    holds = holding_decisions(faults.op, name)
    dropped = time.monotonic()
    wait_until(
        lambda: holding_decisions(faults.op, name) >= holds + 4 and time.monotonic() - dropped > 20,
        150,
        what="four more decisions and 20 s during the fault",
    )
    assert faults.prometheus.count(mode) > 0
    assert workloads.replicas(name) == held >= 3
    assert generation(workloads, name) == before, "the operator wrote to the target"
    scaled_to_zero = workloads.condition(name, "ScaledToZero")
    assert scaled_to_zero is not None and scaled_to_zero["status"] == "False"
    assert faults.op.running()

    faults.prometheus.set("pass")
    workloads.wait_condition(name, "MetricsAvailable", "True", timeout=60)
    # the real, idle load now acts: down, then to zero
    workloads.wait_replicas(name, lambda n: n == 0, 120, "scaled to zero once metrics are back")


def test_api_server_restart_mid_cycle_loses_nothing(faults: Faults, workloads: Workloads) -> None:
    workloads.deployment("steady", replicas=2)
    workloads.deployment("grow", replicas=1)
    workloads.busy("steady", 2)
    wait_until(lambda: workloads.ready("grow") == 1, 90, what="grow ready")
    workloads.load("grow", 3)
    for name in ("steady", "grow"):
        assert workloads.sizing(name, sizing_spec(name)).returncode == 0
        workloads.wait_condition(name, "MetricsAvailable", "True", timeout=120)
    assert workloads.replicas("steady") == 2, "steady was scaled before the outage"
    steady_generation = generation(workloads, "steady")
    decided = faults.op.decisions()

    workloads.load("grow", 30)  # needs 5: the decision is due while the API server is gone
    workloads.deployment("late", replicas=1)
    workloads.load("late", 3)
    for flap in range(3):
        faults.api.down()
        wait_until(lambda: faults.api.refused >= 3, 60, what=f"outage {flap}: reconnects refused")
        if flap == 0:
            # the decision falls inside the outage: grow's turn finds the API server gone (its
            # list of autoscalers, or its write, fails) and says so; it is held until it has
            wait_until(
                lambda: faults.op.metric(
                    "gpusizer_condition", name="grow", type="Ready", status="False"
                ),
                60,
                what="grow decided while the API server was gone",
            )
        if flap == 1:  # created while the operator cannot see it: its watch must catch up
            assert workloads.sizing("late", sizing_spec("late")).returncode == 0
        faults.api.up()
        reconnected = faults.api.accepted + 1
        wait_until(
            lambda n=reconnected: faults.api.accepted >= n, 60, what="the operator reconnected"
        )
    assert faults.op.running(), faults.op.log_tail()

    # 30 rps on replicas serving 10 at the 70 % target: 5 (ceil(30 / 7)), and no more
    grown = workloads.wait_replicas("grow", lambda n: n >= 5, 180, "the pending scale-up")
    assert grown == 5
    workloads.wait_condition("late", "MetricsAvailable", "True", timeout=120)
    assert workloads.status("late").get("currentReplicas") == 1
    wait_until(lambda: faults.op.decisions() > decided + 10, 60, what="decisions resumed")
    assert workloads.replicas("steady") == 2
    assert generation(workloads, "steady") == steady_generation


def test_api_server_connections_going_silent_cost_no_conflict(
    faults: Faults, workloads: Workloads
) -> None:
    """A partition drops the open connections without a reset. The Deployment watch stays
    silent until kopf's inactivity timeout (70 s): its copy never shows the operator's own
    scale-up, and the next turn, finding it still behind, says so in the log and reads the
    target from the API server until the watch shows it, so no write meets a conflict (28
    without that, one when only a conflict sent it there). The request timeout is tested in
    tests/unit/test_kube.py: here the operator's requests happened not to use a silenced
    connection, and it passed without."""
    name = "partitioned"
    workloads.deployment(name, replicas=1)
    wait_until(lambda: workloads.ready(name) == 1, 90, what=f"{name} ready")
    workloads.load(name, 3)
    assert workloads.sizing(name, sizing_spec(name, replicas={"max": 8})).returncode == 0
    workloads.wait_condition(name, "MetricsAvailable", "True", timeout=120)
    assert workloads.replicas(name) == 1
    decided = faults.op.decisions()
    try:
        assert faults.api.silence() > 0, "no open connection to silence"
        workloads.load(name, 30)  # needs 5
        grown = workloads.wait_replicas(name, lambda n: n >= 5, 240, "the scale-up")
        assert grown == 5, "30 rps needs ceil(30 / 7) = 5 replicas of 10 rps at 70 %"
        wait_until(lambda: faults.op.decisions() > decided + 10, 60, what="decisions went on")
        conflicts = faults.op.metric("gpusizer_scale_writes_total", name=name, result="conflict")
        assert conflicts == 0, f"{conflicts:.0f} conflicting writes on the watch's old copy"
        # the path named: a turn after the scale-up found the silent watch still behind it
        lagging = f"{workloads.namespace}/{name}: the watch still shows Deployment {name} as"
        assert lagging in faults.op.log_text()
        assert faults.op.metric("gpusizer_scale_writes_total", name=name, result="error") == 0
    finally:
        faults.api.down()  # the partition ends: what is left of the old connections is reset
        faults.api.up()
    assert faults.op.running(), faults.op.log_tail()


def test_write_conflicts_are_retried_on_a_later_cycle(faults: Faults, workloads: Workloads) -> None:
    name = "contended"
    workloads.deployment(name, replicas=1)
    workloads.load(name, 0)
    assert workloads.sizing(name, sizing_spec(name, replicas={"max": 4})).returncode == 0
    workloads.wait_condition(name, "MetricsAvailable", "True", timeout=120)

    # Another writer changes the Deployment (its annotations, never its replicas) as fast as
    # it can: the operator's /scale write carries the resourceVersion it read, so it meets 409s.
    # Whenever a write gets through anyway, the test scales back to 1 so the operator has to
    # write again, until one write has met a conflict.
    apps = k8s.AppsV1Api(workloads.cluster.api_client())
    stop = threading.Event()

    def hammer(worker: int) -> None:
        i = 0
        while not stop.is_set():
            i += 1
            body = {"metadata": {"annotations": {f"hammer-{worker}": str(i)}}}
            try:
                apps.patch_namespaced_deployment(name, workloads.namespace, body)
            except Exception:
                continue

    threads = [threading.Thread(target=hammer, args=(w,), daemon=True) for w in range(3)]
    for t in threads:
        t.start()
    try:
        workloads.load(name, 30)  # wants 4

        def conflicted() -> bool:
            if faults.op.metric("gpusizer_scale_writes_total", name=name, result="conflict"):
                return True
            if workloads.replicas(name) != 1:
                workloads.cluster.kubectl(
                    "scale", "deployment", name, "-n", workloads.namespace, "--replicas=1"
                )
            return False

        wait_until(conflicted, 180, interval=0.5, what="a conflicting /scale write")
        ok_at_conflict = faults.op.metric("gpusizer_scale_writes_total", name=name, result="ok")
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=10)
    workloads.wait_replicas(name, lambda n: n == 4, 60, "the decision landed after the conflict")
    assert faults.op.metric("gpusizer_scale_writes_total", name=name, result="ok") > ok_at_conflict
    assert faults.op.metric("gpusizer_scale_writes_total", name=name, result="error") == 0
    assert "changed" in faults.op.log_text()  # the conflict is logged with what happened
    ready = workloads.condition(name, "Ready")
    assert ready is not None and ready["status"] == "True"


def test_two_peered_replicas_only_one_acts(faults: Faults, workloads: Workloads) -> None:
    name = "gpusizer-faults"
    workloads.deployment("peered", replicas=1)
    workloads.load("peered", 0)
    assert workloads.sizing("peered", sizing_spec("peered", replicas={"max": 4})).returncode == 0
    with peering(workloads.cluster, name):
        faults.op.stop()
        first = faults.operator("peer-a", *lease_args(name))
        second = faults.operator("peer-b", *lease_args(name))
        try:
            first.start()
            second.start()
            workloads.wait_condition("peered", "MetricsAvailable", "True", timeout=120)
            workloads.load("peered", 30)
            workloads.wait_replicas("peered", lambda n: n == 4, 120, "scaled up by one of them")
            # the status is also written by one replica only: compare decisions
            pair = (first, second)
            active = wait_until(
                lambda: next((o for o in pair if o.decisions() > 0), None), 30, what="an active one"
            )
            standby = second if active is first else first
            assert standby.metric("gpusizer_scale_writes_total", name="peered") == 0
            assert active.metric("gpusizer_scale_writes_total", name="peered", result="ok") > 0
            wait_until(
                lambda: "paused: " in standby.log_text(),
                30,
                what="the standby replica logging that it is paused",
            )
            assert "active: " in active.log_text() and "paused: " not in active.log_text()
            assert standby.decisions() == 0
            # the one that acts holds the Lease, and says so
            assert (active.metric("gpusizer_in_charge"), standby.metric("gpusizer_in_charge")) == (
                1,
                0,
            )
            holder = workloads.cluster.kubectl_json("get", "lease", name, "-n", LEASE_NAMESPACE)[
                "spec"
            ]["holderIdentity"]
            assert f"-{active.process.pid}-" in holder  # host-pid-random (lease.replica_identity)

            # the active one goes away: the standby takes over and acts
            active.stop()
            workloads.load("peered", 10)  # 10 / (10 x 0.7): 2 replicas
            workloads.wait_replicas("peered", lambda n: n == 2, 120, "scaled down by the successor")
            assert standby.decisions() > 0
            wait_until(lambda: "active: " in standby.log_text(), 30, what="the successor's log")
            assert standby.metric("gpusizer_in_charge") == 1
            # the leaver freed the Lease: the successor did not wait it out
            assert "in charge" in standby.log_text()
        finally:
            first.stop()
            second.stop()
            faults.op.start()  # the module's operator, for the tests after this one


def test_target_deleted_then_recreated(faults: Faults, workloads: Workloads) -> None:
    name = "phoenix"
    workloads.deployment(name, replicas=1)
    workloads.load(name, 3)
    assert workloads.sizing(name, sizing_spec(name, replicas={"max": 4})).returncode == 0
    workloads.wait_condition(name, "Ready", "True", "Acting", timeout=120)
    workloads.cluster.kubectl("delete", "deployment", name, "-n", workloads.namespace)
    condition = workloads.wait_condition(name, "Ready", "False", "TargetNotFound", timeout=60)
    assert name in condition["message"]
    wait_until(lambda: "TargetNotFound" in workloads.event_reasons(name), 30, what="event")
    errors = faults.op.metric("gpusizer_reconcile_errors_total", name=name)

    workloads.load(name, 30)
    workloads.deployment(name, replicas=1)  # a new object: new uid, same name
    workloads.wait_condition(name, "Ready", "True", timeout=60)
    workloads.wait_replicas(name, lambda n: n == 4, 120, "acting on the new Deployment")
    assert faults.op.metric("gpusizer_reconcile_errors_total", name=name) == errors


def test_deleted_sizing_needs_no_operator_and_workload_runs(
    faults: Faults, workloads: Workloads
) -> None:
    ns = workloads.namespace
    # "gone" sits at 2 replicas (70 %) above its minimum of 1, with no scale-down window: an
    # operator still acting on it after its deletion would scale it down at once
    no_window = {"scaleDown": {"stabilizationWindowSeconds": 0, "maxReplicasPerStep": 8}}
    for name, replicas, rps in (("left", 2, 14), ("gone", 2, 14), ("witness", 1, 3)):
        workloads.deployment(name, replicas=replicas)
        workloads.load(name, rps)
        spec = sizing_spec(name, replicas=no_window) if name == "gone" else sizing_spec(name)
        assert workloads.sizing(name, spec).returncode == 0
    for name in ("left", "gone", "witness"):
        workloads.wait_condition(name, "MetricsAvailable", "True", timeout=120)

    def six_cycles() -> None:
        seen = faults.op.metric("gpusizer_decisions_total", name="witness")
        wait_until(
            lambda: faults.op.metric("gpusizer_decisions_total", name="witness") >= seen + 6,
            60,
            what="six cycles of the operator",
        )

    def exists(name: str) -> bool:
        got = workloads.cluster.kubectl("get", "workloadsizing", name, "-n", ns, check=False)
        return got.returncode == 0

    # Handled, yet no finalizer: nothing waits for an operator to delete them.
    for name in ("left", "gone", "witness"):
        obj = workloads.cluster.kubectl_json("get", "workloadsizing", name, "-n", ns)
        assert obj.get("status", {}).get("conditions"), f"{name} not handled yet"
        assert not obj["metadata"].get("finalizers"), obj["metadata"]

    # Deleted while the operator runs: its turns stop, and the workload keeps its size. Its
    # series go with it, counters too, so a decision after the deletion would show as a new one.
    gone_replicas, gone_generation = workloads.replicas("gone"), generation(workloads, "gone")
    assert faults.op.metric("gpusizer_decisions_total", name="gone") > 0
    workloads.cluster.kubectl("delete", "workloadsizing", "gone", "-n", ns, "--timeout=30s")
    workloads.load("gone", 0)  # nobody may act on it any more
    six_cycles()
    assert faults.op.metric("gpusizer_decisions_total", name="gone") == 0
    assert workloads.replicas("gone") == gone_replicas == 2
    assert generation(workloads, "gone") == gone_generation

    # Deleted while no operator runs: gone at once, with nothing to wait for; the operator
    # that starts again never decides it, nor touches the workload.
    faults.op.stop()
    try:
        left_replicas, before = workloads.replicas("left"), generation(workloads, "left")
        workloads.cluster.kubectl("delete", "workloadsizing", "left", "-n", ns, "--timeout=30s")
        assert not exists("left")
        workloads.load("left", 0)  # what the sizing would have scaled down on: nobody acts now
    finally:
        faults.op.start()
    six_cycles()
    assert workloads.replicas("left") == left_replicas >= 2
    assert generation(workloads, "left") == before
    assert faults.op.metric("gpusizer_decisions_total", name="left") == 0
    wait_until(
        lambda: workloads.ready("left") == left_replicas, 60, what="the workload still serving"
    )


def reshape_state(workloads: Workloads, name: str) -> dict[str, Any] | None:
    raw = workloads.template(name)["metadata"].get("annotations", {}).get(RESHAPE)
    return json.loads(raw) if raw else None


def test_sigkill_mid_reshape_finishes_once(faults: Faults, workloads: Workloads) -> None:
    name = "reshaped"
    # a 12 GiB model on whole H100s at 5 % busy: right-sizing moves it to a MIG slice; the
    # new pods take 20 s to load, so the reshape is still in flight when the operator dies
    workloads.deployment(name, replicas=2, memory_mib=12288, startup_seconds=20)
    workloads.load(name, 1)
    spec = sizing_spec(
        name,
        replicas={"min": 1, "max": 4},
        rightSizing={
            "mode": "Auto",
            "historySeconds": 60,
            "allowedSlices": ["gpu-h100", "mig-1g.10gb", "mig-2g.20gb", "mig-3g.40gb"],
            "minSavingsPercent": 15,
        },
    )
    assert workloads.sizing(name, spec).returncode == 0

    def in_flight() -> dict[str, Any] | None:
        state = reshape_state(workloads, name)
        return state if state and state["state"] == "InProgress" else None

    started = wait_until(in_flight, 300, interval=0.2, what="a reshape in flight")
    faults.op.stop(signal.SIGKILL)
    template = workloads.template(name)["spec"]["template"]
    faults.op.start()

    moved = workloads.wait_condition(name, "RightSized", "True", "RightSized", timeout=180)
    assert started["to"]["slice"] in moved["message"], moved
    done = reshape_state(workloads, name)
    assert done is not None and done["state"] == "Done"
    assert done["started"] == started["started"], "the restarted operator reshaped again"
    assert workloads.template(name)["spec"]["template"] == template
    limits = template["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {started["to"]["resource"]: "1"}
    # the killed process may have died before posting its event, never a second one
    assert workloads.event_reasons(name).count("ReshapeStarted") <= 1
    wait_until(lambda: workloads.ready(name) >= 1, 60, what="a ready replica on the new slice")
