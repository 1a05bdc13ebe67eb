"""The signals layer against a real Prometheus: stale, NaN, empty, partial, label spellings."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote_plus

import pytest
from gpusizer.api.v1alpha1 import Server, WorkloadSizingSpec
from gpusizer.settings import PrometheusSettings
from gpusizer.signals import prometheus, reader
from gpusizer.signals.join import workload_signals
from gpusizer.signals.parse import Problem
from gpusizer.signals.pods import PodInfo
from gpusizer.signals.prometheus import WINDOW_QUERY_THREADS, PrometheusSource
from gpusizer.signals.queries import (
    GPU_UTIL,
    KV_CACHE,
    MEMORY,
    MIG_UTIL,
    PodQuery,
    full_read_queries,
    moved_values_query,
    queue_signal,
    request_rate_signal,
)
from gpusizer.signals.reader import carrying, read_full, read_ledger, read_moved, read_slow
from gpusizer.vocabulary import Reason

from tests.integration.conftest import Exporter
from tests.support import free_port


def as_decoded(result: Any) -> Any:
    """A query's result as Prometheus' JSON decodes it."""
    return result


EMPTY = b'{"status":"success","data":{"resultType":"vector","result":[]}}'


def answering(
    body: bytes = EMPTY, status: int = 200, first: Callable[[str], None] = lambda path: None
) -> ThreadingHTTPServer:
    """A server that answers every query with `body`, once `first` has seen its path."""

    class Answer(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            first(self.path)
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


SPEC = WorkloadSizingSpec.model_validate(
    {
        "targetRef": {"name": "chat"},
        "replicas": {"min": 1, "max": 8, "targetGPUUtilization": 70, "targetQueuePerReplica": 4},
        "metrics": {"maxSampleAgeSeconds": 60},
    }
)

BASE = (
    'gpu="{gpu}",UUID="GPU-{pod}-{gpu}",pci_bus_id="00000000:0{gpu}:00.0",device="nvidia{gpu}",'
    'modelName="NVIDIA H100 80GB HBM3"'
)


def whole(pod: str, util: str, gpu: int = 0, host: str = "Hostname", ts: str = "") -> str:
    labels = BASE.format(gpu=gpu, pod=pod)
    tail = (
        f'{host}="gpu-a",DCGM_FI_DRIVER_VERSION="570.133.20",container="vllm",'
        f'namespace="llm",pod="{pod}"'
    )
    return f"DCGM_FI_DEV_GPU_UTIL{{{labels},{tail}}} {util}{(' ' + ts) if ts else ''}\n"


def kv_cache(pod: str, share: str) -> str:
    return f'vllm:kv_cache_usage_perc{{namespace="llm",pod="{pod}",model_name="m"}} {share}\n'


def queue(pod: str, value: str) -> str:
    return f'vllm:num_requests_waiting{{namespace="llm",pod="{pod}",model_name="m"}} {value}\n'


def pods(*names: str, mig: bool = False) -> list[PodInfo]:
    resource = "nvidia.com/mig-3g.40gb" if mig else "nvidia.com/gpu"
    return [
        PodInfo("llm", n, {}, "gpu-a", True, False, "Running", resource, "vllm", 0) for n in names
    ]


async def observe(url: str, names: list[PodInfo]):  # type: ignore[no-untyped-def]
    source = PrometheusSource(PrometheusSettings(url=url, timeout_seconds=5))
    snapshot = await read_full(source, [SPEC.metrics.server])
    return snapshot, workload_signals(SPEC, names, snapshot, time.time())


@pytest.mark.parametrize("host", ["Hostname", "hostname"])
async def test_known_values_both_hostname_spellings(
    prometheus: str, exporter: Exporter, host: str
) -> None:
    exporter.set(
        whole("a", "80", host=host)
        + whole("a", "60", gpu=1, host=host)
        + whole("b", "40", host=host)
        + queue("a", "3")
        + queue("b", "5")
    )
    _, got = await observe(prometheus, pods("a", "b"))
    assert got.problems == ()
    assert got.signals.gpu_utilization == pytest.approx((70 + 40) / 2)
    assert got.signals.queue_total == 8
    assert got.sample_age_seconds is not None and got.sample_age_seconds < 10


def memory_used(pod: str, mib: str, gpu: int = 0) -> str:
    labels = BASE.format(gpu=gpu, pod=pod)
    tail = 'Hostname="gpu-a",container="vllm",namespace="llm"'
    return f'DCGM_FI_DEV_FB_USED{{{labels},{tail},pod="{pod}"}} {mib}\n'


async def test_gpu_memory_is_read_apart_from_the_decisions_read(
    prometheus: str, exporter: Exporter
) -> None:
    """The full read the decisions wait for does not ask for GPU memory; its own lane does,
    and the full read carries it into each workload's signals (the highest of a pod's GPUs)."""
    exporter.set(
        whole("a", "80")
        + whole("a", "60", gpu=1)
        + memory_used("a", "24000")
        + memory_used("a", "30500", gpu=1)
        + queue("a", "3")
    )
    source = PrometheusSource(PrometheusSettings(url=prometheus, timeout_seconds=5))
    full = await read_full(source, [SPEC.metrics.server])
    assert MEMORY not in full.signals and MEMORY not in full.errors
    slow = await read_slow(source, [SPEC.metrics.server])
    got = workload_signals(SPEC, pods("a"), carrying(full, slow), time.time())
    assert got.problems == ()
    assert got.memory_peak_mib == 30500
    assert got.signals.gpu_utilization == pytest.approx(70)


async def test_exported_labels(prometheus: str, exporter: Exporter) -> None:
    labels = BASE.format(gpu=0, pod="x")
    exporter.set(
        f'DCGM_FI_DEV_GPU_UTIL{{{labels},Hostname="gpu-a",namespace="gpu-operator",'
        f'pod="dcgm-exporter-1",exported_namespace="llm",exported_pod="a"}} 33\n' + queue("a", "0")
    )
    _, got = await observe(prometheus, pods("a"))
    assert got.signals.gpu_utilization == 33


def idle_gpu(gpu: int) -> str:
    """An unallocated GPU: dcgm-exporter gives it no pod labels."""
    labels = BASE.format(gpu=gpu, pod="idle")
    return f'DCGM_FI_DEV_GPU_UTIL{{{labels},Hostname="gpu-a"}} 0\n'


async def test_idle_gpus_are_not_asked_for(prometheus: str, exporter: Exporter) -> None:
    """The DCGM queries ask only for held GPUs: Prometheus returns no group for the idle ones,
    which used to arrive as one series of empty pod labels, built from every idle GPU."""
    exporter.set(whole("a", "50") + idle_gpu(1) + idle_gpu(2) + queue("a", "0"))
    source = PrometheusSource(PrometheusSettings(url=prometheus, timeout_seconds=5))
    result = await source.query(full_read_queries([])[GPU_UTIL].promql, GPU_UTIL, as_decoded)
    assert not isinstance(result, Problem), result
    assert sorted(series["metric"].get("pod", "") for series in result) == ["a", "a"], result
    _, got = await observe(prometheus, pods("a"))
    assert got.signals.gpu_utilization == 50


async def test_a_batch_is_evaluated_at_one_instant(prometheus: str) -> None:
    """The ledger's 24 h and 7 d rows come from one batch: queried a few milliseconds apart,
    a counter's increase extrapolated to two different ends, and the week read less than the
    day."""
    source = PrometheusSource(PrometheusSettings(url=prometheus, timeout_seconds=5))
    found, errors = await source.series_batch({f"q{i}": "vector(time())" for i in range(8)})
    assert errors == {}
    instants = {values[0].value for values in found.values()}
    assert len(instants) == 1, instants


async def test_mig_instance_reads_gr_engine_active(prometheus: str, exporter: Exporter) -> None:
    labels = BASE.format(gpu=0, pod="m")
    exporter.set(
        f'DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{labels},GPU_I_PROFILE="3g.40gb",GPU_I_ID="2",'
        f'Hostname="gpu-b",namespace="llm",pod="m"}} 0.412\n' + queue("m", "1")
    )
    snapshot, got = await observe(prometheus, pods("m", mig=True))
    assert ("llm", "m") in snapshot.signals[MIG_UTIL].samples
    assert ("llm", "m") not in snapshot.signals[GPU_UTIL].samples
    assert got.signals.gpu_utilization == pytest.approx(41.2)


@pytest.mark.parametrize(
    ("exposition", "reason"),
    [
        (
            lambda: whole("a", "NaN") + whole("b", "50") + queue("a", "1") + queue("b", "1"),
            Reason.INVALID_VALUE,
        ),
        (lambda: whole("a", "50") + queue("a", "1") + queue("b", "1"), Reason.PARTIAL_SAMPLES),
        (lambda: queue("a", "1") + queue("b", "1"), Reason.NO_SAMPLES),
        (
            # a series of its own: Prometheus drops samples older than a series' newest
            lambda: (
                whole("a", "50", gpu=5, ts=str(int((time.time() - 120) * 1000)))
                + whole("b", "50")
                + queue("a", "1")
                + queue("b", "1")
            ),
            Reason.STALE_SAMPLES,
        ),
    ],
    ids=["nan", "partial", "empty", "stale"],
)
async def test_unknown_utilisation(
    prometheus: str, exporter: Exporter, exposition, reason: Reason
) -> None:  # type: ignore[no-untyped-def]
    exporter.set(exposition())
    _, got = await observe(prometheus, pods("a", "b"))
    assert got.signals.gpu_utilization is None
    assert [p.reason for p in got.problems if p.signal == "gpuUtilization"] == [reason], got


async def test_prometheus_down_is_unreachable_not_zero() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    _, got = await observe(url, pods("a"))
    assert got.signals.gpu_utilization is None and got.signals.queue_total is None
    assert {p.reason for p in got.problems} == {Reason.PROMETHEUS_UNREACHABLE}


async def test_a_query_that_times_out_is_said_so_and_not_sent_again() -> None:
    """Sent again, it loads a Prometheus that is already slow, and the answer to the second
    try stayed in memory with the first one's traceback until a full collection."""
    asked: list[str] = []
    answered = threading.Event()

    class Slow(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            answered.wait(10)  # longer than the operator waits: the test ends it

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        source = PrometheusSource(PrometheusSettings(url=url, timeout_seconds=1))
        value, problem = await source.scalar("vector(1)")
    finally:
        answered.set()
        server.shutdown()
    assert value is None and problem is not None
    assert problem.reason == Reason.PROMETHEUS_UNREACHABLE
    assert problem.message.startswith("timed out: ") and "Read timed out" in problem.message
    assert len(asked) == 1, asked


async def test_window_reads_leave_the_replica_reads_their_threads() -> None:
    """The ledger's twelve range queries, on their own source, hold at most its threads while
    Prometheus is slow to answer them, and a full read on the operator's source goes through
    meanwhile (startup wires the window reads so)."""
    release, busy = threading.Event(), threading.Event()
    in_flight: list[str] = []
    most = 0
    lock = threading.Lock()

    def first(path: str) -> None:
        nonlocal most
        query = unquote_plus(path)
        if "increase(" in query or "_over_time(" in query:  # a window read
            with lock:
                in_flight.append(path)
                most = max(most, len(in_flight))
                if len(in_flight) == WINDOW_QUERY_THREADS:
                    busy.set()
            release.wait(10)
            with lock:
                in_flight.remove(path)

    server = answering(first=first)
    settings = PrometheusSettings(
        url=f"http://127.0.0.1:{server.server_address[1]}", timeout_seconds=5
    )
    try:
        ledger = asyncio.create_task(
            read_ledger(PrometheusSource(settings, threads=WINDOW_QUERY_THREADS))
        )
        assert await asyncio.to_thread(busy.wait, 5), in_flight
        snapshot = await read_full(PrometheusSource(settings), [Server.VLLM])
        assert snapshot.errors == {} and len(in_flight) == WINDOW_QUERY_THREADS
    finally:
        release.set()
    try:
        rows, problems = await ledger
    finally:
        server.shutdown()
    assert rows == [] and problems == []
    assert most == WINDOW_QUERY_THREADS


async def test_bad_promql_is_a_query_error(prometheus: str) -> None:
    """Said in Prometheus' own words: its error type and message, not the raw body."""
    source = PrometheusSource(PrometheusSettings(url=prometheus))
    value, problem = await source.scalar("sum(rate(")
    assert value is None and problem is not None and problem.reason == Reason.QUERY_ERROR
    assert problem.message.startswith("HTTP 400: bad_data: "), problem.message


@pytest.mark.parametrize(
    ("status", "body", "said"),
    [
        (200, b'{"status":"success","data":{"resultType":"vector"}}', "without data.result"),
        (200, b'["not", "an", "answer"]', "without data.result"),
        (200, b"<html>a proxy's page</html>", "unreadable response"),
        (500, b"upstream gone", "HTTP 500: upstream gone"),
        (
            422,
            b'{"status":"error","errorType":"execution","error":"too many samples"}',
            "HTTP 422: execution: too many samples",
        ),
    ],
)
async def test_an_answer_that_is_not_a_result_is_a_query_error(
    status: int, body: bytes, said: str
) -> None:
    server = answering(body, status)
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        source = PrometheusSource(PrometheusSettings(url=url, timeout_seconds=5))
        samples, errors = await source.per_pod_batch(full_read_queries([]))
    finally:
        server.shutdown()
    assert samples == {} and set(errors) == set(full_read_queries([]))
    assert all(p.reason == Reason.QUERY_ERROR and said in p.message for p in errors.values())


def test_a_source_serves_one_event_loop_after_another() -> None:
    """`gpusizer recommend` reads the fleet and then the ledger, each in an event loop of its
    own, with one source: an asyncio lock is bound to the first loop it waited in."""
    server = answering()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    source = PrometheusSource(PrometheusSettings(url=url, timeout_seconds=5))

    async def read() -> list[Any]:
        return await asyncio.gather(  # enough at once that some wait for the lock
            *(source.query(f"vector({i})", "test", as_decoded) for i in range(8))
        )

    try:
        answers = [asyncio.run(read()) for _ in range(2)]
    finally:
        server.shutdown()
    assert answers == [[[]] * 8] * 2


async def test_answers_come_in_together_and_are_decoded_one_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The queries of a read are sent at once (Prometheus evaluates them side by side), and
    each answer is decoded and read before the next is decoded: a decoded answer is several
    times the samples read from it, and alive together they set the operator's memory
    high-water mark."""
    queries = {f"q{i}": f"vector({i})" for i in range(3)}
    sent = threading.Barrier(len(queries), timeout=5)  # every query in before any is answered

    server = answering(first=lambda path: sent.wait())
    decoded, most = 0, 0  # answers decoded and not yet read
    lock = threading.Lock()
    overlap = threading.Barrier(2, timeout=0.5)  # passed only if two decodes overlap
    decode = prometheus._result

    def decoding(response: Any) -> Any:
        nonlocal decoded, most
        with lock:
            decoded += 1
            most = max(most, decoded)
        try:
            overlap.wait()
        except threading.BrokenBarrierError:
            overlap.reset()
        return decode(response)

    def read(result: Any) -> Any:
        nonlocal decoded
        with lock:
            decoded -= 1
        return result

    monkeypatch.setattr(prometheus, "_result", decoding)
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        source = PrometheusSource(PrometheusSettings(url=url, timeout_seconds=10))
        answers = await asyncio.gather(*(source.query(q, n, read) for n, q in queries.items()))
    finally:
        server.shutdown()
    assert answers == [[]] * len(queries)  # no Problem: none waited for the others in vain
    assert most == 1


async def test_wake_query_scalar(prometheus: str, exporter: Exporter) -> None:
    exporter.set('gateway_pending_requests{namespace="llm",service="chat"} 7\n')
    source = PrometheusSource(PrometheusSettings(url=prometheus))
    value, problem = await source.scalar('sum(gateway_pending_requests{namespace="llm"})')
    assert (value, problem) == (7.0, None)


def stamped(line: str, at: float) -> str:
    """An exposition line with an explicit timestamp: Prometheus keeps one sample per
    timestamp, so each series' samples stay these however often it scrapes."""
    return f"{line.rstrip()} {int(at * 1000)}\n"


def mig(pod: str, busy: str) -> str:
    labels = BASE.format(gpu=0, pod=pod)
    return (
        f'DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{labels},GPU_I_PROFILE="3g.40gb",GPU_I_ID="1",'
        f'Hostname="gpu-b",namespace="llm",pod="{pod}"}} {busy}\n'
    )


async def test_a_moved_read_brings_only_the_pods_that_moved(
    prometheus: str, exporter: Exporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    before, after = time.time() - 4, time.time() - 2
    lines = {
        # pod: (exposition before, exposition after)
        "up": (whole("up", "50"), whole("up", "90")),
        "flat": (whole("flat", "40"), whole("flat", "41")),  # 2.4 %: not a move
        "two": (
            whole("two", "30") + whole("two", "30", gpu=1),
            whole("two", "30") + whole("two", "70", gpu=1),
        ),
        "mig-up": (mig("mig-up", "0.40"), mig("mig-up", "0.43")),  # 3 points of 43
        "mig-flat": (mig("mig-flat", "0.001"), mig("mig-flat", "0.0012")),  # 0.02 points
        "busy": (queue("busy", "1"), queue("busy", "9")),
        "idle": (queue("idle", "0"), queue("idle", "0")),
        "kv-up": (kv_cache("kv-up", "0.30"), kv_cache("kv-up", "0.60")),
        "kv-flat": (kv_cache("kv-flat", "0.300"), kv_cache("kv-flat", "0.305")),  # 1.7 %
        # named as a pattern, web.0 would name webx0 too
        "web.0": (whole("web.0", "20"), whole("web.0", "60")),
        "webx0": (whole("webx0", "20"), whole("webx0", "20")),
        # behind a ServiceMonitor without honorLabels: `pod` is the exporter's
        "behind": (exported("behind", "10"), exported("behind", "80")),
    }

    def body(which: int, at: float) -> str:
        return "".join(
            stamped(line, at) for pair in lines.values() for line in pair[which].splitlines()
        )

    exporter.set(body(0, before))
    source = PrometheusSource(PrometheusSettings(url=prometheus, timeout_seconds=5))
    base = await read_full(source, [Server.VLLM])
    assert base.signals[GPU_UTIL].samples[("llm", "up")].value == 50
    exporter.set(body(1, after))

    # the previous read came between the two samples
    since = time.time() - (before + after) / 2
    moved = await read_moved(source, base, since)

    assert not moved.full and moved.errors == {}
    util, mig_util = moved.signals[GPU_UTIL].samples, moved.signals[MIG_UTIL].samples
    waiting = moved.signals[queue_signal(Server.VLLM)].samples
    assert util[("llm", "up")].value == 90
    assert util[("llm", "two")].value == 50, "a pod moves when one of its GPUs does"
    assert util[("llm", "flat")].value == 40, "under 5 %: kept from the full read"
    assert mig_util[("llm", "mig-up")].value == pytest.approx(43)
    assert mig_util[("llm", "mig-flat")].value == pytest.approx(0.1)
    assert waiting[("llm", "busy")].value == 9 and waiting[("llm", "idle")].value == 0
    kv = moved.signals[KV_CACHE].samples
    assert kv[("llm", "kv-up")].value == 0.6, "a share of the KV cache moves too"
    assert kv[("llm", "kv-flat")].value == 0.3
    assert util[("llm", "web.0")].value == 60 and util[("llm", "webx0")].value == 20
    named = PodQuery(
        moved_values_query('DCGM_FI_DEV_GPU_UTIL{pod!=""}', "mean", {"web.0"}), 1, "mean"
    )
    found, _ = await source.per_pod_batch({GPU_UTIL: named})
    assert set(found[GPU_UTIL].samples) == {("llm", "web.0")}, "a name, not a pattern"
    assert util[("llm", "behind")].value == 80
    assert util[("llm", "up")].age == since, "at most since the previous read"
    assert util[("llm", "flat")].age == base.signals[GPU_UTIL].samples[("llm", "flat")].age
    assert MEMORY not in moved.signals or moved.signals[MEMORY] is base.signals[MEMORY]
    # a read after the previous one that saw the move reports it no more
    again = await read_moved(source, base, time.time() - after - 0.5)
    assert again.signals[GPU_UTIL].samples[("llm", "up")].value == 50
    # more moves than a query names: every pod's value is read, and only the moves kept
    monkeypatch.setattr(reader, "MAX_NAMED_PODS", 1)
    every = await read_moved(source, base, since)
    assert every.signals[GPU_UTIL].samples == util
    assert every.signals[KV_CACHE].samples == kv


def exported(pod: str, util: str) -> str:
    """A GPU as dcgm-exporter's own Service shows it: its `pod` label names the exporter."""
    labels = BASE.format(gpu=0, pod=pod)
    return (
        f'DCGM_FI_DEV_GPU_UTIL{{{labels},Hostname="gpu-a",namespace="gpu-operator",'
        f'pod="dcgm-exporter-1",exported_namespace="llm",exported_pod="{pod}"}} {util}\n'
    )


async def test_kv_cache_and_served_request_rate_from_vllm_series(
    prometheus: str, exporter: Exporter
) -> None:
    def vllm(counter: int, at: float) -> str:
        labels = 'namespace="llm",pod="kv",model_name="m",engine="0"'
        return stamped(f"vllm:kv_cache_usage_perc{{{labels}}} 0.6", at) + stamped(
            f'vllm:request_success_total{{{labels},finished_reason="stop"}} {counter}', at
        )

    now = time.time()
    # a pod of its own: an earlier test left a stamped series of pod a that never goes stale
    body = whole("kv", "50") + queue("kv", "0")
    exporter.set(body + vllm(100, now - 40))
    exporter.set(body + vllm(160, now - 10))  # 60 requests in 30 s: 2 per second
    source = PrometheusSource(PrometheusSettings(url=prometheus, timeout_seconds=5))
    snapshot = await read_full(source, [Server.VLLM])
    kv_spec = WorkloadSizingSpec.model_validate(
        {
            "targetRef": {"name": "chat"},
            "replicas": {"min": 1, "max": 8, "targetGPUUtilization": 70, "targetKVCacheUsage": 0.8},
        }
    )
    got = workload_signals(kv_spec, pods("kv"), snapshot, time.time())
    assert got.problems == ()
    assert got.signals.kv_cache_usage == pytest.approx(0.6)
    # rate() extrapolates the two samples towards the window's edges
    assert got.signals.request_rate is not None and 1.5 <= got.signals.request_rate <= 3.5


async def test_a_rate_has_no_sample_time_for_a_twin_to_tell(
    prometheus: str, exporter: Exporter
) -> None:
    """`timestamp()` of a rate is the instant Prometheus evaluated it at, however old its
    samples: the full read's request rate query asks no twin, which was a second range
    selection of every pod's counter (queries.WINDOWED_SIGNALS)."""
    labels = 'namespace="llm",pod="rate-age",model_name="m"'
    now = time.time()
    for count, ago in ((10, 50), (40, 35)):
        exporter.set(stamped(f"vllm:request_success_total{{{labels}}} {count}", now - ago))
    source = PrometheusSource(PrometheusSettings(url=prometheus, timeout_seconds=5))
    at = time.time()
    stamps = await source.query(
        'timestamp(rate(vllm:request_success_total{pod="rate-age"}[1m]))', "rate", as_decoded, at
    )
    assert not isinstance(stamps, Problem) and [float(s["value"][1]) for s in stamps] == [
        pytest.approx(at, abs=0.002)
    ], stamps
    sampled = await source.query(
        'timestamp(vllm:request_success_total{pod="rate-age"})', "rate", as_decoded, at
    )
    assert not isinstance(sampled, Problem) and [float(s["value"][1]) for s in sampled] == [
        pytest.approx(now - 35, abs=0.002)
    ]

    snapshot = await read_full(source, [Server.VLLM])
    rate = snapshot.signals[request_rate_signal(Server.VLLM)].samples[("llm", "rate-age")]
    assert rate.value == pytest.approx(1.0, rel=0.5) and rate.age == 0
