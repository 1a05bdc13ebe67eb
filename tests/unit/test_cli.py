"""The command line itself."""

from __future__ import annotations

import pytest
from gpusizer.cli import build_parser, main
from gpusizer.settings import OperatorSettings, PrometheusSettings, read_period_seconds

from tests.support import in_a_fresh_interpreter


def test_building_the_command_line_loads_no_simulator_library() -> None:
    """`gpusizer run` builds the whole parser, `simulate`'s options included: numpy and
    matplotlib loaded there were 26 MiB of every operator's memory."""
    probe = (
        "import sys; from gpusizer.cli import build_parser; build_parser(); "
        "print(' '.join(m for m in ('numpy', 'matplotlib', 'pandas') if m in sys.modules))"
    )
    assert in_a_fresh_interpreter(probe).stdout.strip() == ""


def test_a_decoded_full_read_is_not_promoted_toward_a_full_collection() -> None:
    """A full read's JSON at 5,000 pods, decoded and dropped, as a query thread does: with
    the default thresholds its objects reach the older generations (bench/README.md)."""
    probe = """
import gc, json
from gpusizer.cli import tune_garbage_collector

body = json.dumps([{"metric": {"namespace": "ns", "pod": f"p{i}"}, "value": [1, "50"]}
                   for i in range(5000)])

def older_collections():
    json.loads(body)
    return sum(s["collections"] for s in gc.get_stats()[1:])

gc.collect()
before = older_collections()
default = older_collections() - before
tune_garbage_collector()
gc.collect()
before = older_collections()
tuned = older_collections() - before
print(default, tuned, gc.get_freeze_count() > 0)
"""
    default, tuned, frozen = in_a_fresh_interpreter(probe).stdout.strip().split()
    assert int(default) > 0 and int(tuned) == 0 and frozen == "True"


@pytest.mark.parametrize(
    ("read", "sync", "expected"),
    [(None, 15.0, 2.0), (None, 2.0, 2.0), (None, 1.0, 1.0), (2.5, 5.0, 2.5), (5.0, 5.0, 5.0)],
)
def test_the_read_period_defaults_to_two_seconds_or_the_sync_period(
    read: float | None, sync: float, expected: float
) -> None:
    assert read_period_seconds(read, sync) == expected


@pytest.mark.parametrize(("read", "sync"), [(6.0, 5.0), (0.0, 5.0), (-1.0, 5.0), (None, 0.0)])
def test_a_read_period_out_of_range_names_both_flags(read: float | None, sync: float) -> None:
    with pytest.raises(ValueError, match=r"--read-period .* at most --sync-period"):
        read_period_seconds(read, sync)


def test_the_read_period_comes_from_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUSIZER_READ_PERIOD", "2.5")
    args = build_parser().parse_args(["run"])
    assert args.read_period == 2.5


@pytest.mark.parametrize(
    ("argv", "complaint"),
    [
        (["activator", "--max-body-bytes", "0"], "--max-body-bytes must be >= 1"),
        (["activator", "--header-timeout", "0"], "--header-timeout > 0"),
        (
            ["run", "--prometheus-url", "http://p", "--activator-service", "no-slash"],
            "NAMESPACE/NAME",
        ),
    ],
)
def test_bad_activator_settings_are_refused_naming_the_flag(
    argv: list[str], complaint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    assert complaint in capsys.readouterr().err


def test_the_activator_takes_its_name_from_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The chart sets GPUSIZER_REPLICA from the pod's name (the downward API)."""
    monkeypatch.setenv("GPUSIZER_REPLICA", "gpusizer-activator-7d9f-x2x4q")
    monkeypatch.setenv("GPUSIZER_NAMESPACES", "llm,batch")
    args = build_parser().parse_args(["activator"])
    assert (args.replica, args.namespace, args.port) == (
        "gpusizer-activator-7d9f-x2x4q",
        ["llm", "batch"],
        8080,
    )


@pytest.mark.parametrize(
    ("argv", "pod_namespace", "complaint"),
    [
        (["--peering", "gpusizer"], None, "--lease must be NAMESPACE/NAME outside a pod"),
        (["--peering", "gpusizer", "--lease", "no-slash"], "ops", "got 'no-slash'"),
    ],
)
def test_a_peering_without_a_lease_it_can_name_is_refused(
    argv: list[str],
    pod_namespace: str | None,
    complaint: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr("gpusizer.lease.pod_namespace", lambda: pod_namespace)
    monkeypatch.setattr("gpusizer.main.run_operator", lambda *_: pytest.fail("it ran"))
    assert main(["run", "--prometheus-url", "http://p", *argv]) == 2
    assert complaint in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "lease", "peering_namespace"),
    [
        (["--peering", "gpusizer"], ("ops", "gpusizer"), None),
        (["--peering", "p", "--lease", "x/y", "--namespace", "llm"], ("x", "y"), "llm"),
        ([], None, None),
    ],
)
def test_the_lease_defaults_to_the_pods_namespace_and_the_peerings_name(
    argv: list[str],
    lease: tuple[str, str] | None,
    peering_namespace: str | None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ran: list[OperatorSettings] = []
    monkeypatch.setattr("gpusizer.lease.pod_namespace", lambda: "ops")
    monkeypatch.setattr("gpusizer.main.run_operator", lambda settings, *_: ran.append(settings))
    monkeypatch.setattr("gpusizer.cli.configure_logging", lambda *_: None)
    monkeypatch.setattr("gpusizer.cli.tune_garbage_collector", lambda: None)
    assert main(["run", "--prometheus-url", "http://p", *argv]) == 0
    assert (ran[0].lease, ran[0].peering_namespace) == (lease, peering_namespace)


@pytest.mark.parametrize(("rightsizing", "ledger"), [(60.0, 600.0), (3600.0, 3600.0)])
def test_the_ledger_is_read_back_far_less_often_than_right_sizing_reads(
    rightsizing: float, ledger: float
) -> None:
    """Its windows are a day and a week: at every right-sizing period, Prometheus would take
    the increase of every workload's counters over a week of samples once a minute."""
    settings = OperatorSettings(
        prometheus=PrometheusSettings(url="http://p"), rightsizing_period_seconds=rightsizing
    )
    assert settings.ledger_period_seconds == ledger
