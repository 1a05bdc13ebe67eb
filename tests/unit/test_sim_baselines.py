"""The replayed HPA and KEDA, rule by rule, each against the upstream code it copies:
kubernetes/kubernetes pkg/controller/podautoscaler (horizontal.go, replica_calculator.go) and
kedacore/keda (ScaledObject: pollingInterval, cooldownPeriod, activation, AverageValue)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from gpusizer.sim.controllers import (
    HpaConfig,
    HpaController,
    KedaConfig,
    KedaController,
    configured,
    pods_metric_replicas,
)

from tests.unit.test_sim import view

UTIL_ONLY = HpaConfig(target_utilization=70.0, target_queue=None)


# --- replica_calculator.go calcPlainMetricReplicas ----------------------------------------------


@pytest.mark.parametrize(
    ("mean", "observed", "missing", "unready", "expected"),
    [
        (140.0, 4, 0, 0, 8),  # ceil(usageRatio x readyPodCount)
        (75.0, 4, 0, 0, 4),  # |1 - ratio| <= tolerance: current
        (35.0, 4, 0, 0, 2),
        # scale-down: missing pods count as the target: (2 x 35 + 2 x 70) / 4 = 52.5 -> 3
        (35.0, 2, 2, 0, 3),
        # scale-up: missing pods count as 0: 2 x 140 / 4 = 70, within tolerance: current
        (140.0, 2, 2, 0, 4),
        # scale-up with unready (Pending) pods: they count as 0: 2 x 210 / 4 = 105 -> 6
        (210.0, 2, 0, 2, 6),
        # ...and a rise they flip to a fall keeps the current count: 2 x 100 / 4 = 50
        (100.0, 2, 0, 2, 4),
        # scale-down with unready pods: they are ignored, not rebalanced: ceil(0.5 x 2)
        (35.0, 2, 0, 2, 1),
    ],
)
def test_pods_metric_missing_and_unready_pods(
    mean: float, observed: int, missing: int, unready: int, expected: int
) -> None:
    got = pods_metric_replicas(
        4, mean, 70.0, observed=observed, missing=missing, unready=unready, tolerance=0.1
    )
    assert got == expected


def test_hpa_reads_missing_pods_from_the_view() -> None:
    # 4 ready, 2 of them became ready after the sample: HPA counts them as missing
    hpa = HpaController(UTIL_ONLY)
    assert hpa.decide(view(unobserved=2, gpu_utilization=140.0)) == 4
    assert HpaController(UTIL_ONLY).decide(view(gpu_utilization=140.0)) == 8


# --- horizontal.go --------------------------------------------------------------------------------


def test_initial_recommendation_holds_a_warm_fleet_for_the_down_window() -> None:
    """recordInitialRecommendation: the replicas the target had when the HPA first saw it are a
    recommendation, so the first quiet sample does not cut a warm fleet."""
    hpa = HpaController(UTIL_ONLY)
    low = [hpa.decide(view(now=t, gpu_utilization=10.0)) for t in (0.0, 150.0, 299.0, 300.0)]
    assert low == [4, 4, 4, 1]


def test_down_window_keeps_the_highest_recommendation() -> None:
    hpa = HpaController(UTIL_ONLY)
    assert hpa.decide(view(now=0.0, gpu_utilization=70.0)) == 4
    low = [hpa.decide(view(now=t, gpu_utilization=35.0)) for t in (15.0, 285.0, 300.0)]
    assert low == [4, 4, 2]
    shorter = HpaController(HpaConfig(70.0, None, scale_down_window_seconds=120.0))
    shorter.decide(view(now=0.0))
    assert [shorter.decide(view(now=t, gpu_utilization=35.0)) for t in (15.0, 120.0)] == [4, 2]


def test_scale_up_rate_limit_counts_the_period_events() -> None:
    """Default scaleUp policies Pods 4 and Percent 100 per 15 s, selectPolicy Max, counted
    from the replicas at the start of the period."""
    hpa = HpaController(UTIL_ONLY)
    assert hpa.decide(view(now=0.0, current=1, ready=1, gpu_utilization=700.0)) == 5
    assert HpaController(UTIL_ONLY).decide(view(current=8, ready=8, gpu_utilization=700.0)) == 16
    # 1 -> 5 used the period's allowance (start 1: max(1 + 4, 2)); nothing more until it ends
    assert hpa.decide(view(now=5.0, current=5, ready=1, starting=4, gpu_utilization=700.0)) == 5


def test_two_metrics_the_larger_wins_and_an_invalid_one_blocks_a_fall() -> None:
    """computeReplicasForMetrics: the largest proposal; with a metric that failed, no fall."""
    both = HpaConfig(target_utilization=70.0, target_queue=4.0, scale_down_window_seconds=0.0)
    assert HpaController(both).decide(view(gpu_utilization=70.0, queue_total=28.0)) == 7
    assert HpaController(both).decide(view(gpu_utilization=35.0, queue_total=0.0)) == 2
    assert HpaController(both).decide(view(gpu_utilization=35.0, queue_total=None)) == 4
    assert HpaController(both).decide(view(gpu_utilization=None, queue_total=28.0)) == 7


def test_hpa_leaves_a_target_at_zero_alone() -> None:
    """reconcileAutoscaler: spec.replicas 0 with minReplicas > 0 disables scaling."""
    assert HpaController(UTIL_ONLY).decide(view(current=0, ready=0, gpu_utilization=None)) == 0


# --- KEDA -----------------------------------------------------------------------------------------


def test_keda_external_metrics_average_value() -> None:
    """GetExternalPerPodMetricReplicas: ceil(value / threshold) outside the tolerance, no
    missing-pod correction; several triggers: the largest."""
    keda = KedaController(KedaConfig(scale_down_window_seconds=0.0))
    # queue 30 / 5 = 6; KV 4 x 0.7 / 0.7 = 4
    assert keda.decide(view(queue_total=30.0, kv_cache_usage=0.7)) == 6
    keda = KedaController(KedaConfig(scale_down_window_seconds=0.0))
    # KV 4 x 0.95 / 0.7 = 5.4 -> 6, even while pods start (no Pending correction)
    assert keda.decide(view(starting=2, current=6, kv_cache_usage=0.95, now=1.0)) == 6


def test_keda_with_min_one_never_goes_to_zero() -> None:
    keda = KedaController(KedaConfig(scale_down_window_seconds=0.0))
    quiet = {"queue_total": 0.0, "kv_cache_usage": 0.0, "request_rate": 0.0}
    assert [keda.decide(view(now=t, **quiet)) for t in (0.0, 400.0, 4000.0)] == [1, 1, 1]


def test_keda_queue_only_wakes_on_refused_requests_and_sleeps_after_the_cooldown() -> None:
    keda = KedaController(
        KedaConfig(
            queue_threshold=4.0,
            kv_cache_threshold=None,
            min_replicas=0,
            polling_interval_seconds=30.0,
            cooldown_period_seconds=300.0,
        )
    )
    assert keda.decide(view(now=0.0, current=0, ready=0, queue_total=None)) == 0
    assert keda.decide(view(now=30.0, current=0, ready=0, queue_total=None, refused=3.0)) == 1
    assert keda.decide(view(now=45.0, current=2, ready=2, queue_total=20.0)) == 5
    assert keda.decide(view(now=60.0, current=2, ready=2, queue_total=0.0)) == 2  # held: window
    assert keda.decide(view(now=320.0, current=2, ready=2, queue_total=0.0)) == 2
    assert keda.decide(view(now=390.0, current=2, ready=2, queue_total=0.0)) == 0


def test_keda_keepalive_trigger_stays_active_while_requests_arrive() -> None:
    """production-stack's scale-to-zero trigger: rate(incoming[1m]) > bool 0, threshold 1."""
    config = KedaConfig(queue_threshold=4.0, kv_cache_threshold=None, min_replicas=0)
    keda = KedaController(replace(config, keepalive=True))
    busy = {"current": 1, "ready": 1, "queue_total": 0.0, "request_rate": 0.5}
    assert [keda.decide(view(now=t, **busy)) for t in (0.0, 400.0, 800.0)] == [1, 1, 1]
    idle = {**busy, "request_rate": 0.0}
    assert keda.decide(view(now=1000.0, **idle)) == 1
    assert keda.decide(view(now=1170.0, **idle)) == 0  # 360 s cooldown after the last activity


# --- settings from the command line ---------------------------------------------------------------


def test_settings_parse_by_field_name() -> None:
    hpa = configured(HpaConfig(), "target-queue=none, scale-down-window-seconds=120")
    assert (hpa.target_queue, hpa.scale_down_window_seconds) == (None, 120.0)
    keda = configured(KedaConfig(), "keepalive=true,min-replicas=0,kv-cache-threshold=0.5")
    assert (keda.keepalive, keda.min_replicas, keda.kv_cache_threshold) == (True, 0, 0.5)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("window=3", "'window': expected NAME=VALUE with NAME one of target-utilization"),
        ("min-replicas=two", "min-replicas='two' is not a valid value"),
        ("min-replicas=none", "min-replicas='none' is not a valid value"),
        ("tolerance", "'tolerance': expected NAME=VALUE"),
    ],
)
def test_bad_settings_are_named(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        configured(HpaConfig(), text)
