"""The per-workload series, as a scrape of the operator's metrics port shows them."""

from __future__ import annotations

import gzip
from collections.abc import Callable, Iterator

import pytest
import requests
from gpusizer.api.v1alpha1 import Condition
from gpusizer.report import metrics, scrape
from prometheus_client import CollectorRegistry, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

Series = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scraped(name: str, namespace: str = "ns") -> Series:
    """Every sample of workload `name`, by sample name and its other labels, parsed back from
    the text exposition a scrape gets."""
    text = b"".join(metrics.exposition()).decode()
    return {
        (
            s.name,
            tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("namespace", "name"))),
        ): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.labels.get("name") == name and s.labels.get("namespace") == namespace
    }


def ready(status: str, reason: str) -> Condition:
    return Condition(
        type="Ready", status=status, reason=reason, last_transition_time="2027-01-01T00:00:00Z"
    )


def test_one_series_per_condition_follows_its_status_and_reason() -> None:
    metrics.WORKLOADS.set_conditions("ns", "cond-a", [ready("True", "Acting")])
    metrics.WORKLOADS.set_conditions("ns", "cond-a", [ready("True", "Acting")])  # unchanged
    condition = (
        "gpusizer_condition",
        (("reason", "Acting"), ("status", "True"), ("type", "Ready")),
    )
    assert scraped("cond-a") == {condition: 1.0}
    metrics.WORKLOADS.set_conditions("ns", "cond-a", [ready("False", "TargetNotFound")])
    assert scraped("cond-a") == {
        (
            "gpusizer_condition",
            (("reason", "TargetNotFound"), ("status", "False"), ("type", "Ready")),
        ): 1.0
    }


def test_decisions_count_by_reason_and_the_gauges_show_the_last() -> None:
    metrics.WORKLOADS.decided("ns", "dec-a", "ScaleUp", desired=3, current=1, known=True)
    metrics.WORKLOADS.decided("ns", "dec-a", "ScaleUp", desired=4, current=3, known=True)
    metrics.WORKLOADS.decided("ns", "dec-a", "HoldingOnUnknownMetrics", 4, 4, known=False)
    metrics.WORKLOADS.scale_written("ns", "dec-a", "ok")
    metrics.WORKLOADS.scale_written("ns", "dec-a", "conflict")
    metrics.WORKLOADS.scale_written("ns", "dec-a", "ok")
    assert scraped("dec-a") == {
        ("gpusizer_decisions_total", (("reason", "ScaleUp"),)): 2.0,
        ("gpusizer_decisions_total", (("reason", "HoldingOnUnknownMetrics"),)): 1.0,
        ("gpusizer_desired_replicas", ()): 4.0,
        ("gpusizer_current_replicas", ()): 4.0,
        ("gpusizer_metrics_available", ()): 0.0,
        ("gpusizer_scale_writes_total", (("result", "ok"),)): 2.0,
        ("gpusizer_scale_writes_total", (("result", "conflict"),)): 1.0,
    }


def test_no_replica_gauges_before_the_first_decision() -> None:
    metrics.WORKLOADS.reconcile_failed("ns", "err-a")
    metrics.WORKLOADS.reconcile_failed("ns", "err-a")
    assert scraped("err-a") == {("gpusizer_reconcile_errors_total", ()): 2.0}


def test_a_deleted_workload_leaves_no_series_not_even_its_counters() -> None:
    metrics.WORKLOADS.decided("ns", "gone-a", "ScaleUp", desired=2, current=1, known=True)
    metrics.WORKLOADS.scale_written("ns", "gone-a", "ok")
    metrics.WORKLOADS.reconcile_failed("ns", "gone-a")
    metrics.WORKLOADS.set_conditions("ns", "gone-a", [ready("True", "Acting")])
    metrics.WORKLOADS.decided("ns", "kept-a", "ScaleUp", desired=2, current=1, known=True)
    assert len(scraped("gone-a")) == 7
    metrics.WORKLOADS.forget("ns", "gone-a")
    assert scraped("gone-a") == {}
    assert ("gpusizer_decisions_total", (("reason", "ScaleUp"),)) in scraped("kept-a")


def test_an_update_replaces_the_dicts_a_scrape_may_be_reading() -> None:
    """A scrape reads the series without the lock: an update that changed a dict in place
    while a scrape iterated it would end that scrape ("dictionary changed size")."""
    collector = metrics.WorkloadCollector()
    updates: tuple[Callable[[], None], ...] = (
        lambda: collector.decided("ns", "w", "ScaleUp", desired=2, current=1, known=True),
        lambda: collector.scale_written("ns", "w", "ok"),
        lambda: collector.set_conditions("ns", "w", [ready("True", "Acting")]),
        lambda: collector.gauges("ns", "w", {"gpusizer_held_gpus": 1.5}),
        lambda: collector.account("ns", "w", {"gpusizer_held_gpu_seconds": 3.0}),
        lambda: collector.ledger("ns", "w", {("gpusizer_ledger_cost", "24h", "used"): 1.0}),
    )
    for update in updates:
        update()
    series = collector._series[("ns", "w")]
    fields = [n for n in metrics.WorkloadSeries.__slots__ if isinstance(getattr(series, n), dict)]
    published = {name: getattr(series, name) for name in fields}
    assert all(published.values()), "every dict of the series is set by an update above"
    as_they_were = {name: dict(value) for name, value in published.items()}
    for update in updates:
        update()
    collector.gauges("ns", "w", {"gpusizer_held_gpus": None})
    assert {name: dict(value) for name, value in published.items()} == as_they_were
    assert all(getattr(series, name) is not published[name] for name in fields)


def test_what_a_result_costs_what_the_pods_held_and_the_ledger() -> None:
    metrics.WORKLOADS.gauges(
        "ns", "eff-a", {"gpusizer_cost_per_1k_requests": 0.4, "gpusizer_held_gpus": 1.5}
    )
    metrics.WORKLOADS.account("ns", "eff-a", {"gpusizer_held_gpu_seconds": 3.0})
    metrics.WORKLOADS.account("ns", "eff-a", {"gpusizer_held_gpu_seconds": 2.0})
    metrics.WORKLOADS.account("ns", "eff-a", {"gpusizer_held_gpu_seconds": -1.0})  # never down
    metrics.WORKLOADS.ledger("ns", "eff-a", {("gpusizer_ledger_cost", "24h", "used"): 1.0})
    assert scraped("eff-a") == {
        ("gpusizer_cost_per_1k_requests", ()): 0.4,
        ("gpusizer_held_gpus", ()): 1.5,
        ("gpusizer_held_gpu_seconds_total", ()): 5.0,
        ("gpusizer_ledger_cost", (("basis", "used"), ("window", "24h"))): 1.0,
    }
    # an unknown figure is no series, not a zero; a new ledger replaces the old one
    metrics.WORKLOADS.gauges("ns", "eff-a", {"gpusizer_cost_per_1k_requests": None})
    metrics.WORKLOADS.ledger("ns", "eff-a", {})
    assert scraped("eff-a") == {
        ("gpusizer_held_gpus", ()): 1.5,
        ("gpusizer_held_gpu_seconds_total", ()): 5.0,
    }
    metrics.WORKLOADS.forget("ns", "eff-a")
    assert scraped("eff-a") == {}


class Reference(Collector):
    """The per-workload families built as prometheus_client's own: what its `generate_latest`
    writes of them is what the operator's writer must write."""

    def __init__(self, collector: metrics.WorkloadCollector) -> None:
        self.series = collector._series

    def collect(self) -> Iterator[Metric]:
        for family in metrics.WORKLOAD_FAMILIES:
            kind = CounterMetricFamily if family.kind == "counter" else GaugeMetricFamily
            built = kind(family.name, family.help, labels=["namespace", "name", *family.labels])
            for key, series in self.series.items():
                for extra, value in family.samples(series):
                    built.add_metric([*key, *extra], value)
            yield built


@pytest.mark.parametrize(
    ("chunk_lines", "split"), [(metrics.CHUNK_LINES, False), (1, True), (2, True)]
)
def test_the_exposition_is_byte_for_byte_what_generate_latest_writes(
    chunk_lines: int, split: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Label order (by name, so `basis` before `name`), counters' `_total`, values as Go prints
    them (exponents past a million, integers as floats), escaped label values; in chunks of
    any size, a family's lines split among them."""
    monkeypatch.setattr(metrics, "CHUNK_LINES", chunk_lines)
    collector = metrics.WorkloadCollector()
    collector.decided("team-a", "chat", "ScaleUp", desired=3, current=1, known=True)
    collector.decided("team-a", "chat", "Hold", desired=3, current=3, known=True)
    collector.scale_written("team-a", "chat", "ok")
    collector.reconcile_failed("team-a", "chat")
    collector.set_conditions("team-a", "chat", [ready("False", 'a "quoted"\\odd\nreason')])
    collector.gauges(
        "team-a", "chat", {"gpusizer_power_watts": 1234567.5, "gpusizer_held_gpus": 0.1}
    )
    collector.account("team-a", "chat", {"gpusizer_held_gpu_seconds": 1e-7})
    collector.ledger(
        "team-a",
        "chat",
        {("gpusizer_ledger_cost", "24h", "used"): 2.0, ("gpusizer_ledger_kwh", "7d", "static"): 3},
    )
    collector.decided("team-b", "embed", "Hold", desired=1, current=1, known=False)
    collector.gauges("team-b", "embed", {"gpusizer_cost_per_1k_requests": float("inf")})
    collector.decided('team-"c"', "a\\b", "Hold", desired=2, current=2, known=True)
    disable_created_metrics()  # type: ignore[no-untyped-call]  # as the operator runs
    reference = CollectorRegistry()
    reference.register(Reference(collector))
    chunks = list(collector.exposition())
    assert b"".join(chunks) == generate_latest(reference)
    assert (len(chunks) > len(metrics.WORKLOAD_FAMILIES)) == split, len(chunks)


def test_a_scrape_gets_the_exposition_gzipped_when_asked_and_only_by_get() -> None:
    metrics.WORKLOADS.decided("ns", "app-a", "ScaleUp", desired=2, current=1, known=True)
    answers: list[tuple[str, dict[str, str]]] = []

    def request(method: str, encoding: str = "") -> bytes:
        environ = {"REQUEST_METHOD": method, "PATH_INFO": "/metrics"}
        if encoding:
            environ["HTTP_ACCEPT_ENCODING"] = encoding
        body = scrape.app(environ, lambda status, headers: answers.append((status, dict(headers))))
        return b"".join(body)

    line = b'gpusizer_desired_replicas{name="app-a",namespace="ns"} 2.0\n'
    assert line in request("GET")
    assert answers[-1] == ("200 OK", {"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})
    assert line in gzip.decompress(request("GET", "deflate, gzip;q=0.9"))
    assert answers[-1][1]["Content-Encoding"] == "gzip"
    family_by_family = [b"# HELP a x\n", b"", b"a 1.0\n" * 1000]
    assert gzip.decompress(b"".join(scrape.gzipped(family_by_family))) == b"".join(family_by_family)
    request("POST")
    assert answers[-1][0] == "405 Method Not Allowed"


def test_the_metrics_port_answers_a_scrape_over_http() -> None:
    metrics.WORKLOADS.decided("ns", "app-b", "ScaleUp", desired=2, current=1, known=True)
    server = scrape.serve(0, "127.0.0.1")
    try:
        answer = requests.get(f"http://127.0.0.1:{server.server_port}/metrics", timeout=10)
    finally:
        server.shutdown()
    assert answer.headers["Content-Encoding"] == "gzip"  # requests asks for it
    assert 'gpusizer_current_replicas{name="app-b",namespace="ns"} 1.0' in answer.text
