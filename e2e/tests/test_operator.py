"""The real operator, on the real API server, reading the real Prometheus fed by the emulator.

Timings are shortened through the spec (windows, idle time, sync period), never by sleeping:
every wait polls for a condition with a deadline.
"""

from __future__ import annotations

import time
from pathlib import Path

from gpusizer.timefmt import parse_time

from e2e.tests.conftest import Cluster, wait_until
from e2e.tests.operator_support import (
    Operator,
    Workloads,
    sizing_spec,
    start_prometheus,
    stop_operators,
    stop_prometheus,
)


def test_invalid_specs_are_refused_by_the_api_server(workloads: Workloads) -> None:
    cases = {
        "replicas.min must be <= replicas.max": sizing_spec("x", replicas={"min": 5, "max": 2}),
        "at least one scaling signal": sizing_spec(
            "x", replicas={"min": 1, "max": 2, "targetGPUUtilization": None}
        ),
        "replicas.min: 0 requires scaleToZero.enabled": sizing_spec(
            "x", replicas={"min": 0, "max": 2}
        ),
        "spec.replicas.targetGPUUtilization": sizing_spec(
            "x", replicas={"targetGPUUtilization": 250}
        ),
        "spec.mode": sizing_spec("x", mode="Sometimes"),
    }
    for expected, spec in cases.items():
        result = workloads.sizing("bad", spec)
        assert result.returncode != 0, f"accepted a spec that should fail with {expected!r}"
        assert expected in result.stderr, result.stderr


def test_missing_target_is_a_condition_and_an_event(
    operator: Operator, workloads: Workloads
) -> None:
    assert workloads.sizing("ghost", sizing_spec("no-such-deployment")).returncode == 0
    condition = workloads.wait_condition("ghost", "Ready", "False", "TargetNotFound")
    assert "no-such-deployment" in condition["message"]
    wait_until(lambda: "TargetNotFound" in workloads.event_reasons("ghost"), 30, what="event")
    assert operator.process is not None and operator.process.poll() is None
    # the operator's log says it too, under the object's name
    assert f"[{workloads.namespace}/ghost] TargetNotFound: " in operator.log_text()


def test_scale_up_under_load_then_down_after_the_window(
    operator: Operator, workloads: Workloads
) -> None:
    workloads.deployment("chat", replicas=1, capacity_rps=10)
    workloads.load("chat", 35)  # needs 35 / (10 x 0.7) = 5 replicas at the 70 % target
    window = 30
    spec = sizing_spec(
        "chat",
        replicas={
            "scaleDown": {
                "stabilizationWindowSeconds": window,
                "maxReplicasPerStep": 8,
                "periodSeconds": 2,
            }
        },
    )
    assert workloads.sizing("chat", spec).returncode == 0
    up = workloads.wait_replicas("chat", lambda n: n >= 5, 180, "scaled up to >= 5")
    assert up == 5, "35 rps needs 5 replicas of 10 rps at 70 %, and no more"
    wait_until(lambda: workloads.ready("chat") >= 5, 120, what="5 ready replicas")
    status = workloads.status("chat")
    assert status["desiredReplicas"] >= 5 and status["observation"]["gpuUtilization"] is not None
    assert "Scaled" in workloads.event_reasons("chat")
    assert f"[{workloads.namespace}/chat] Scaled: " in operator.log_text()

    dropped_at = time.time()
    workloads.load("chat", 3)
    workloads.wait_replicas("chat", lambda n: n < up, window + 120, "scaled down")
    waited = time.time() - dropped_at
    assert waited >= window, (
        f"scaled down {waited:.0f}s after the drop, inside the {window}s window"
    )
    workloads.wait_replicas("chat", lambda n: n == 1, 120, "down to 1")


def test_a_quiet_workload_is_decided_on_a_scale_by_hand(
    operator: Operator, workloads: Workloads
) -> None:
    """A workload at its min with no load has nothing to do that time alone could change: it
    goes quiet on a real cluster (no event of its pods or its Deployment keeps it from it),
    and waits up to four sync periods for each decision (fleet.py). A change made by hand is
    still decided on: scaled back to its min (its recommendations all say 1, so no window holds
    the second replica), then it is quiet again. That the Deployment's event, rather than the
    end of the wait, brings the turn is tested in tests/unit/test_handlers.py and
    test_fleet_turns.py."""
    workloads.deployment("calm", replicas=1)
    workloads.load("calm", 0)
    assert workloads.sizing("calm", sizing_spec("calm")).returncode == 0
    wait_until(
        lambda: operator.metric("gpusizer_quiet_workloads") >= 1, 120, what="a quiet workload"
    )
    workloads.cluster.kubectl(
        "scale", "deployment", "calm", "-n", workloads.namespace, "--replicas=2"
    )
    wait_until(
        lambda: (
            {"fromReplicas": 2, "toReplicas": 1}
            in [
                {k: e[k] for k in ("fromReplicas", "toReplicas")}
                for e in workloads.status("calm").get("scaleEvents") or []
            ]
        ),
        60,
        what="the replicas set by hand scaled back to the min",
    )
    assert workloads.replicas("calm") == 1
    wait_until(lambda: operator.metric("gpusizer_quiet_workloads") >= 1, 120, what="quiet again")


def test_the_kv_cache_is_read_while_a_workload_decides_on_it(
    operator: Operator, workloads: Workloads
) -> None:
    """The reads ask for vLLM's KV cache only while a workload's replicas.targetKVCacheUsage
    decides on it (signals/queries.py, OPTIONAL_SIGNALS). One that comes takes its first turn
    on a read that asked for the KV cache, never on one that began before it came and left the
    KV cache out: its first status is written after a KV cache read, and it does not say its
    metrics are unavailable. Once it is deleted the full reads leave the KV cache out."""
    ns = workloads.namespace

    def kv_cache_reads() -> float:
        series = "gpusizer_prometheus_query_duration_seconds_count"
        return operator.metric(series, signal="kv_cache")

    def full_reads() -> float:
        return operator.metric("gpusizer_snapshot_duration_seconds_count", read="full")

    def after_full_reads(count: int) -> None:
        start = full_reads()
        wait_until(lambda: full_reads() >= start + count, 60, what=f"{count} full reads")

    # a workload that keeps the reads going, on utilisation alone
    workloads.deployment("plain", replicas=1)
    workloads.busy("plain", 1)
    assert workloads.sizing("plain", sizing_spec("plain")).returncode == 0
    workloads.wait_condition("plain", "MetricsAvailable", "True")

    workloads.deployment("kv", replicas=1)
    workloads.busy("kv", 1)
    kv = f'vllm:kv_cache_usage_perc{{namespace="{ns}",pod=~"kv-.+"}}'
    wait_until(lambda: workloads.cluster.promql(kv), 60, what="Prometheus reading kv's KV cache")
    spec = sizing_spec("kv", replicas={"targetKVCacheUsage": 80})
    assert workloads.sizing("kv", spec).returncode == 0
    workloads.wait_condition("kv", "MetricsAvailable", "True")
    assert kv_cache_reads() > 0, "its first turn was on a read without the KV cache"
    assert "MetricsUnavailable" not in workloads.event_reasons("kv")

    workloads.cluster.kubectl("delete", "workloadsizing", "kv", "-n", ns)
    after_full_reads(3)  # the deletion's event came, and a full read began after it
    left_out = kv_cache_reads()
    after_full_reads(2)
    assert kv_cache_reads() == left_out, "a full read asked for the KV cache nobody reads"


def test_scale_to_zero_and_wake(operator: Operator, workloads: Workloads) -> None:
    ns = workloads.namespace
    workloads.deployment("idle", replicas=1)
    workloads.load("idle", 0)
    spec = sizing_spec(
        "idle",
        replicas={"min": 0},
        scaleToZero={
            "enabled": True,
            "idleSeconds": 8,
            "wakeQuery": f'sum(gateway_pending_requests{{namespace="{ns}",service="idle"}})',
        },
    )
    assert workloads.sizing("idle", spec).returncode == 0
    workloads.wait_replicas("idle", lambda n: n == 0, 120, "scaled to zero")
    workloads.wait_condition("idle", "ScaledToZero", "True")

    workloads.load("idle", 25)  # the gateway holds these: no replica is ready
    woke = workloads.wait_replicas("idle", lambda n: n >= 1, 120, "woke")
    assert woke >= 1
    wait_until(lambda: "Woke" in workloads.event_reasons("idle"), 30, what="Woke event")
    wait_until(lambda: workloads.ready("idle") >= 1, 60, what="a ready replica after waking")


def test_recommend_mode_changes_nothing(operator: Operator, workloads: Workloads) -> None:
    workloads.deployment("rec", replicas=1)
    workloads.load("rec", 40)
    assert workloads.sizing("rec", sizing_spec("rec", mode="Recommend")).returncode == 0
    wait_until(
        lambda: (workloads.status("rec").get("desiredReplicas") or 0) > 1,
        120,
        what="a recommendation above 1",
    )
    condition = workloads.wait_condition("rec", "Ready", "True", "RecommendOnly")
    assert "would set" in condition["message"]
    assert workloads.replicas("rec") == 1


def test_pause_annotation_stops_changes(operator: Operator, workloads: Workloads) -> None:
    workloads.deployment("paused", replicas=1)
    workloads.load("paused", 40)
    spec = sizing_spec("paused")
    assert (
        workloads.sizing("paused", spec, annotations={"gpusizer.io/paused": "true"}).returncode == 0
    )
    workloads.wait_condition("paused", "Ready", "True", "Paused")
    wait_until(
        lambda: (workloads.status("paused").get("desiredReplicas") or 0) > 1, 120, what="desire > 1"
    )
    assert workloads.replicas("paused") == 1


def test_another_autoscaler_is_left_alone(operator: Operator, workloads: Workloads) -> None:
    workloads.deployment("hpa", replicas=2)
    workloads.apply(
        {
            "apiVersion": "autoscaling/v2",
            "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "theirs", "namespace": workloads.namespace},
            "spec": {
                "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "hpa"},
                "minReplicas": 2,
                "maxReplicas": 4,
                "metrics": [
                    {
                        "type": "Resource",
                        "resource": {
                            "name": "cpu",
                            "target": {"type": "Utilization", "averageUtilization": 50},
                        },
                    }
                ],
            },
        }
    )
    workloads.load("hpa", 0)  # gpusizer alone would scale it down to 1 within its window
    assert workloads.sizing("hpa", sizing_spec("hpa")).returncode == 0
    condition = workloads.wait_condition("hpa", "Ready", "False", "ConflictingAutoscaler")
    assert "HorizontalPodAutoscaler theirs" in condition["message"]
    wait_until(lambda: "ConflictingAutoscaler" in workloads.event_reasons("hpa"), 30, what="event")
    # ten more turns of this namespace's only workload (a sync period each): past a first
    # decision's hold and the 6 s down window, when gpusizer alone would have scaled down
    turns = operator.decisions()
    wait_until(lambda: operator.decisions() >= turns + 10, 60, what="ten more turns")
    assert workloads.replicas("hpa") == 2


def test_metrics_outage_never_scales_down(
    operator: Operator, workloads: Workloads, cluster: Cluster
) -> None:
    name = "outage"
    workloads.deployment(name, replicas=3)
    workloads.load(name, 21)  # 3 replicas at 70 %: steady
    assert workloads.sizing(name, sizing_spec(name)).returncode == 0
    workloads.wait_condition(name, "MetricsAvailable", "True", timeout=120)
    wait_until(lambda: workloads.ready(name) == 3, 60, what="3 ready")

    workloads.load(name, 0)  # would scale down to 1 if anyone believed an empty result
    command = stop_prometheus(cluster)
    try:
        condition = workloads.wait_condition(
            name, "MetricsAvailable", "False", "PrometheusUnreachable", timeout=60
        )
        assert "Holding replicas" in condition["message"]
        holds = operator.metric(
            "gpusizer_decisions_total", name=name, reason="HoldingOnUnknownMetrics"
        )
        wait_until(
            lambda: (
                operator.metric(
                    "gpusizer_decisions_total", name=name, reason="HoldingOnUnknownMetrics"
                )
                >= holds + 5
            ),
            60,
            what="five more decisions while Prometheus is down",
        )
        assert workloads.replicas(name) == 3
        # the outage is Prometheus's: said once for the fleet, not as an Event per workload
        # (docs/operations.md, "Prometheus goes away")
        assert operator.metric("gpusizer_prometheus_available") == 0
        assert "MetricsUnavailable" not in workloads.event_reasons(name)
    finally:
        start_prometheus(cluster, command)
    workloads.wait_condition(name, "MetricsAvailable", "True", timeout=120)
    workloads.wait_replicas(name, lambda n: n == 1, 120, "scaled down once metrics are back")


def test_restart_inside_the_scale_down_window_does_not_scale_down_early(
    operator: Operator, workloads: Workloads
) -> None:
    name = "restart"
    window = 40
    workloads.deployment(name, replicas=4)
    workloads.load(name, 0)
    spec = sizing_spec(
        name,
        replicas={
            "scaleDown": {
                "stabilizationWindowSeconds": window,
                "maxReplicasPerStep": 8,
                "periodSeconds": 2,
            }
        },
    )
    wait_until(lambda: workloads.ready(name) == 4, 90, what="4 ready")
    workloads.load(name, 28)  # 4 x 7 rps: 70 %, steady at 4 (no start-up backlog to chase)
    assert workloads.sizing(name, spec).returncode == 0
    workloads.wait_condition(name, "MetricsAvailable", "True", timeout=120)
    wait_until(
        lambda: (workloads.status(name).get("observation") or {}).get("gpuUtilization"),
        60,
        what="a utilisation reading",
    )
    scaled_before = workloads.event_reasons(name).count("Scaled")
    workloads.load(name, 3)

    def first_low_recommendation() -> float | None:
        for rec in workloads.status(name).get("recommendations", []):
            if rec["replicas"] < 4:
                return parse_time(rec["time"])
        return None

    window_started: float = wait_until(first_low_recommendation, 90, what="a low recommendation")
    operator.restart()
    workloads.wait_replicas(name, lambda n: n < 4, window + 90, "scaled down after the window")
    scaled_after = time.time() - window_started
    # the status keeps the latest of a run of equal recommendations, and we poll every cycle
    # (2 s), so the window's start is read up to one cycle late
    assert scaled_after >= window - 3, (
        f"scaled down {scaled_after:.0f}s into a {window}s window: the restart lost the history"
    )
    scaled = workloads.event_reasons(name).count("Scaled") - scaled_before
    assert scaled == 1, f"expected exactly one scale-down after the drop, got {scaled}"


def test_too_small_mig_slice_is_reported_out_of_memory(
    operator: Operator, workloads: Workloads
) -> None:
    workloads.deployment(
        "oom", replicas=1, resource="nvidia.com/mig-1g.10gb", memory_mib=20000, startup_seconds=1
    )
    workloads.load("oom", 1)
    assert workloads.sizing("oom", sizing_spec("oom")).returncode == 0
    condition = workloads.wait_condition("oom", "RightSized", "False", "OutOfMemory", timeout=120)
    assert "nvidia.com/mig-1g.10gb" in condition["message"]
    wait_until(lambda: "OutOfMemory" in workloads.event_reasons("oom"), 30, what="OOM event")


def test_a_load_change_is_acted_on_at_the_next_read_not_the_next_sync_period(
    manifests: Cluster, workloads: Workloads, tmp_path: Path
) -> None:
    """An operator that reads every second and reads everything only every 10 minutes: the
    one full read at its start sees the workload steady, and the scale-up after the load
    triples comes from a read that asked Prometheus for the pods that moved."""
    workloads.deployment("quick", replicas=1)
    workloads.busy("quick", 1)
    assert workloads.sizing("quick", sizing_spec("quick")).returncode == 0
    paused = stop_operators()  # only one operator acts at a time
    reader = Operator(manifests, tmp_path, name="reader", sync_period=600, read_period=1)
    try:
        reader.start()
        wait_until(lambda: reader.decisions() >= 1, 60, what="the reader's first decision")
        workloads.wait_condition("quick", "MetricsAvailable", "True", timeout=60)
        full_reads = reader.metric("gpusizer_snapshot_duration_seconds_count", read="full")
        assert workloads.replicas("quick") == 1, "steady at 70 %"

        workloads.load("quick", 21)  # 3 replicas' worth at the 70 % target
        workloads.wait_replicas("quick", lambda n: n >= 2, 60, "scaled up on a moved read")

        assert reader.metric("gpusizer_snapshot_duration_seconds_count", read="full") == (
            full_reads
        ), "no full read came between the change and the write"
        assert reader.metric("gpusizer_snapshot_duration_seconds_count", read="moved") > 0
        assert reader.metric("gpusizer_prometheus_query_errors_total") == 0
    finally:
        reader.stop()
        for op in paused:
            op.start()
