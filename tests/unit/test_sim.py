"""The replay simulator: traces, the fleet model, the baselines, the optimum and the command."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest
from gpusizer.sim import command
from gpusizer.sim.controllers import GpusizerController, StaticController
from gpusizer.sim.fleet import FleetParams, FleetView, simulate, tick_arrivals
from gpusizer.sim.optimal import _sliding_max, optimal_schedule
from gpusizer.sim.replay import load_spec, replay, with_activator
from gpusizer.sim.trace import Trace, load_trace


def constant(rate: float, seconds: int, bin_seconds: float = 1.0) -> Trace:
    bins = int(seconds / bin_seconds)
    return Trace("constant", bin_seconds, np.full(bins, rate * bin_seconds))


class Recorder:
    """Asks for a fixed count and keeps what it saw."""

    def __init__(self, replicas: int, *, holds: bool = False, period: float = 1.0) -> None:
        self.replicas = replicas
        self.holds_requests = holds
        self.period_seconds = period
        self.views: list[FleetView] = []

    def decide(self, view: FleetView) -> int:
        self.views.append(view)
        return self.replicas


def view(**fields: float | int | None) -> FleetView:
    base: dict[str, float | int | None] = {
        "now": 0.0,
        "current": 4,
        "ready": 4,
        "starting": 0,
        "unobserved": 0,
        "gpu_utilization": 70.0,
        "queue_total": 0.0,
        "wake_demand": 0.0,
        "refused": 0.0,
        "kv_cache_usage": 0.7,
        "request_rate": 1.0,
    }
    base.update(fields)
    return FleetView(**base)  # type: ignore[arg-type]


# --- traces -------------------------------------------------------------------------------------


def test_csv_any_bin_width_spread_inside_the_bin(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("timestamp_s,requests,input_tokens\n0,10,5\n10,0,0\n20,30,1\n")
    trace = load_trace(path)
    assert (trace.bin_seconds, trace.total, trace.duration) == (10.0, 40.0, 30.0)
    assert trace.cumulative(np.array([5.0, 25.0])).tolist() == [5.0, 25.0]
    assert tick_arrivals(trace, 5.0).tolist() == [5.0, 5.0, 0.0, 0.0, 15.0, 15.0]


def test_prometheus_range_query_export(tmp_path: Path) -> None:
    payload = {
        "status": "success",
        "data": {
            "resultType": "matrix",
            "result": [{"metric": {}, "values": [[1000, "2"], [1030, "NaN"], [1060, "0.5"]]}],
        },
    }
    path = tmp_path / "rate.json"
    path.write_text(json.dumps(payload))
    trace = load_trace(path)
    assert trace.bin_seconds == 30.0
    assert trace.counts.tolist() == [60.0, 0.0, 15.0]  # rate x step; NaN is a scrape gap


def test_prometheus_export_needs_one_series(tmp_path: Path) -> None:
    path = tmp_path / "two.json"
    series = {"metric": {}, "values": [[0, "1"], [1, "1"]]}
    path.write_text(json.dumps({"data": {"resultType": "matrix", "result": [series, series]}}))
    with pytest.raises(ValueError, match="exactly one series"):
        load_trace(path)


def test_rebinning_keeps_every_request_and_peak_is_the_busiest_minute() -> None:
    counts = np.zeros(600)
    counts[100:160] = 3.0  # one busy minute at 3 req/s
    counts[300] = 100.0  # a one-second burst: 100/60 req/s over its minute
    trace = Trace("t", 1.0, counts)
    assert trace.rebinned(7.0).total == pytest.approx(trace.total)
    assert trace.peak_rate() == pytest.approx(3.0)
    assert Trace("t", 600.0, np.array([600.0, 1200.0])).peak_rate() == pytest.approx(2.0)


# --- the fleet ----------------------------------------------------------------------------------


def test_enough_capacity_serves_everything_within_the_slo() -> None:
    params = FleetParams(capacity_rps=1.0)
    run = simulate(tick_arrivals(constant(3.5, 100), 1.0), params, StaticController(4), 4)
    assert run.within_slo == pytest.approx(350.0)
    assert (run.dropped, run.gpu_seconds, run.scale_events) == (0.0, 400.0, 0)


def test_fifo_waits_are_exact_under_overload() -> None:
    # 2 req/s into 1 req/s: the request arriving at t starts at 2t, so only t <= 5 s is in SLO
    params = FleetParams(capacity_rps=1.0, slo_wait_seconds=5.0, drop_after_seconds=1000.0)
    run = simulate(tick_arrivals(constant(2.0, 100), 1.0), params, StaticController(1), 1)
    assert run.within_slo == pytest.approx(10.0, abs=0.5)
    assert run.dropped == 0.0


def test_requests_waiting_past_the_timeout_are_dropped() -> None:
    params = FleetParams(capacity_rps=1.0, drop_after_seconds=20.0)
    run = simulate(tick_arrivals(constant(2.0, 100), 1.0), params, StaticController(1), 1)
    # service 1/s for 100 s; what arrived more than 20 s before it could start is dropped
    # 1 req/s served; at the end the last 20 s (40 requests) still wait, the rest was dropped
    assert run.dropped == pytest.approx(200 - 100 - 40, abs=2)


def test_without_a_gateway_requests_at_zero_are_refused() -> None:
    params = FleetParams(capacity_rps=1.0)
    run = simulate(tick_arrivals(constant(1.0, 60), 1.0), params, Recorder(0), 0)
    assert (run.dropped, run.within_slo) == (60.0, 0.0)


def test_a_gateway_holds_requests_and_shows_them_as_wake_demand() -> None:
    params = FleetParams(capacity_rps=10.0, startup_seconds=10.0, metric_delay_seconds=0.0)
    recorder = Recorder(1, holds=True)
    run = simulate(tick_arrivals(constant(1.0, 60), 1.0), params, recorder, 0)
    assert run.dropped == 0.0
    assert max(v.wake_demand for v in recorder.views) == pytest.approx(10.0)
    assert all(v.queue_total is None for v in recorder.views[1:11])  # no server to report
    assert run.within_slo == pytest.approx(55.0, abs=1.0)  # the first 10 s waited > 5 s


def test_the_activator_holds_up_to_its_bound_and_refuses_the_rest() -> None:
    """20 req/s for 10 s at zero, a 10 s start-up, room for 50: 150 of the 200 refused."""
    params = FleetParams(
        capacity_rps=100.0, startup_seconds=10.0, drop_after_seconds=60.0, max_held=50.0
    )
    run = simulate(tick_arrivals(constant(20.0, 10), 1.0), params, Recorder(1, holds=True), 0)
    assert run.dropped == pytest.approx(150.0, abs=1.0)


def test_the_activator_answers_504_past_its_hold_timeout() -> None:
    """1 req/s for 30 s at zero, a 20 s start-up, held 8 s at most: what waited longer went."""
    params = FleetParams(
        capacity_rps=100.0, startup_seconds=20.0, drop_after_seconds=60.0, hold_timeout_seconds=8.0
    )
    run = simulate(tick_arrivals(constant(1.0, 30), 1.0), params, Recorder(1, holds=True), 0)
    assert run.dropped == pytest.approx(12.0, abs=1.0)  # those that came in the first 12 s


def test_the_default_spec_holds_with_the_activator_and_its_bounds() -> None:
    spec = load_spec(None)
    params = with_activator(FleetParams(capacity_rps=1.0), spec)
    assert spec.scale_to_zero.activator.enabled
    assert (params.max_held, params.hold_timeout_seconds) == (2000.0, 600.0)


def test_start_up_delay_is_paid_from_the_request() -> None:
    params = FleetParams(capacity_rps=1.0, startup_seconds=30.0)
    run = simulate(tick_arrivals(constant(0.0, 60), 1.0), params, Recorder(2), 0)
    assert run.gpu_seconds == 120.0
    assert run.ready[:30].tolist() == [0] * 30 and run.ready[30:].tolist() == [2] * 30


def test_scaling_down_removes_starting_replicas_first() -> None:
    class UpThenDown(Recorder):
        def decide(self, view: FleetView) -> int:
            return 4 if view.now < 5 else 2

    params = FleetParams(capacity_rps=1.0, startup_seconds=30.0)
    run = simulate(tick_arrivals(constant(0.0, 20), 1.0), params, UpThenDown(0), 2)
    assert run.replicas[:5].tolist() == [4] * 5 and run.ready.tolist() == [2] * 20


def test_metrics_are_seen_after_the_delay() -> None:
    counts = np.concatenate((np.zeros(60), np.full(60, 2.0)))
    params = FleetParams(capacity_rps=1.0, metric_delay_seconds=15.0, metric_window_seconds=15.0)
    recorder = Recorder(4, period=15.0)
    simulate(tick_arrivals(Trace("step", 1.0, counts), 1.0), params, recorder, 4)
    seen = {v.now: v.gpu_utilization for v in recorder.views}
    assert seen[60.0] == pytest.approx(0.0)
    assert seen[75.0] == pytest.approx(0.0)  # the step at 60 s is not visible yet
    assert seen[90.0] == pytest.approx(50.0)


# --- controllers --------------------------------------------------------------------------------


def test_gpusizer_controller_runs_the_policy_and_persists_scale_events() -> None:
    controller = GpusizerController(load_spec(None))
    desired = controller.decide(view(gpu_utilization=170.0, now=30.0))
    assert desired == 8  # ceil(4 x 170 / 85)
    assert [(e.from_replicas, e.to_replicas) for e in controller.history.scale_events] == [(4, 8)]
    controller.decide(view(current=8, ready=4, starting=4, gpu_utilization=100.0, now=40.0))
    assert len(controller.history.scale_events) == 1  # no change made, none recorded


# --- the optimum --------------------------------------------------------------------------------


def test_sliding_max_looks_ahead() -> None:
    values = np.array([0, 3, 0, 0, 0, 1, 0], dtype=np.int64)
    assert _sliding_max(values, 2).tolist() == [3, 3, 0, 1, 1, 1, 0]
    assert _sliding_max(values, 0).tolist() == values.tolist()


def test_optimum_starts_replicas_ahead_and_bridges_short_gaps() -> None:
    counts = np.concatenate((np.zeros(100), np.full(50, 3.0), np.zeros(20), np.full(50, 3.0)))
    params = FleetParams(capacity_rps=1.0, startup_seconds=30.0, slo_wait_seconds=0.0)
    schedule = optimal_schedule(tick_arrivals(Trace("t", 1.0, counts), 1.0), params)
    assert schedule[70:220].min() == 3  # asked for 30 s early, kept through the 20 s gap
    assert schedule[:40].max() == 0  # nothing held long before the load


def test_optimum_is_the_cheapest_that_serves_the_trace() -> None:
    rng = np.random.default_rng(7)
    counts = rng.poisson(np.repeat(rng.uniform(1, 6, 30), 60)).astype(np.float64)
    trace = Trace("random", 1.0, counts)
    params = FleetParams(capacity_rps=1.0)
    results = replay(trace, params, load_spec(None), ["gpusizer", "hpa", "static", "optimal"])
    best = results["optimal"]
    assert best.slo_attainment > 0.99
    for name in ("gpusizer", "hpa", "static"):
        assert results[name].gpu_hours >= best.gpu_hours


# --- the command --------------------------------------------------------------------------------


def run_command(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    return command.run(parser.parse_args(list(argv)))


@pytest.fixture
def trace_file(tmp_path: Path) -> Path:
    rng = np.random.default_rng(3)
    counts = rng.poisson(np.repeat([2.0, 6.0, 0.0, 3.0], 300))
    path = tmp_path / "load.csv"
    rows = "".join(f"{i},{c}\n" for i, c in enumerate(counts))
    path.write_text("timestamp_s,requests\n" + rows)
    return path


def test_json_output_has_the_documented_shape(
    trace_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plot = tmp_path / "replay.png"
    code = run_command(
        "--trace", str(trace_file), "--format", "json", "--quiet", "--plot", str(plot)
    )
    assert code == 0
    output = json.loads(capsys.readouterr().out)
    assert set(output) == {"trace", "parameters", "policies"}
    assert output["trace"] == "load"
    assert set(output["policies"]) == {
        "gpusizer", "hpa", "keda", "keda-queue", "static", "optimal"
    }  # fmt: skip
    for scores in output["policies"].values():
        assert set(scores) == {
            "gpu_hours",
            "cost",
            "slo_attainment",
            "dropped",
            "scale_events",
            "vs_optimal",
        }
        assert 0.0 <= scores["slo_attainment"] <= 1.0
        assert scores["cost"] == pytest.approx(3.0 * scores["gpu_hours"], abs=0.01)
    assert output["policies"]["optimal"]["vs_optimal"] == 1.0
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_policy_subset_and_spec_file(
    trace_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "wls.yaml"
    spec.write_text(
        "apiVersion: gpusizer.io/v1alpha1\nkind: WorkloadSizing\nmetadata: {name: x}\n"
        "spec:\n  targetRef: {name: x}\n  replicas: {min: 1, max: 4, targetGPUUtilization: 50}\n"
    )
    code = run_command(
        "--trace", str(trace_file), "--policy", "gpusizer,static", "--spec", str(spec),
        "--capacity-rps", "2", "--format", "json", "--quiet",
    )  # fmt: skip
    assert code == 0
    output = json.loads(capsys.readouterr().out)
    assert set(output["policies"]) == {"gpusizer", "static"}
    assert output["parameters"]["capacity_rps"] == 2.0
    assert output["parameters"]["spec"] == str(spec)


@pytest.mark.parametrize(
    "argv",
    [
        ("--policy", "gpusizer,knative"),
        ("--slo-wait-seconds", "90"),
        ("--hpa", "window=300"),
        ("--keda-queue", "keepalive=maybe"),
    ],
)
def test_bad_arguments_are_refused(
    trace_file: Path, argv: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_command("--trace", str(trace_file), "--quiet", *argv) == 2
    assert capsys.readouterr().err


def test_table_output(trace_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_command("--trace", str(trace_file), "--policy", "hpa,optimal", "--quiet") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[:3] == ["policy", "GPU-hours", "cost"]
    assert [line.split()[0] for line in lines[3:]] == ["hpa", "optimal"]


def test_baseline_settings_reach_the_replay(
    trace_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--trace", str(trace_file), "--policy", "hpa", "--format", "json", "--quiet"]
    assert run_command(*argv) == 0
    default = json.loads(capsys.readouterr().out)
    assert run_command(*argv, "--hpa", "target-utilization=30,scale-down-window-seconds=0") == 0
    tuned = json.loads(capsys.readouterr().out)
    assert tuned["parameters"]["baselines"]["hpa"]["target_utilization"] == 30.0
    assert tuned["policies"]["hpa"]["gpu_hours"] != default["policies"]["hpa"]["gpu_hours"]


def test_kernel_active_utilisation_saturates_with_a_request_in_flight() -> None:
    """DCGM's GPU_UTIL is the share of time a kernel runs: at 10 % of capacity, 1.6 sequences
    in flight on average keep a kernel running about 80 % of the time; the KV cache does not."""
    trace = constant(0.1, 120)
    seen = {}
    for kernel in (False, True):
        params = FleetParams(capacity_rps=1.0, kernel_active_utilization=kernel)
        recorder = Recorder(1, period=15.0)
        simulate(tick_arrivals(trace, 1.0), params, recorder, 1)
        seen[kernel] = recorder.views[-1]
    assert seen[False].gpu_utilization == pytest.approx(10.0)
    assert seen[True].gpu_utilization == pytest.approx(100 * (1 - np.exp(-1.6)))
    assert seen[True].kv_cache_usage == pytest.approx(0.1)
