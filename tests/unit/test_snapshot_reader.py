"""What each read of the cycle clock asks for: a full snapshot once per sync period, the pods
that moved in between, merged into it."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import pytest
from gpusizer.api.v1alpha1 import MAX_SAMPLE_AGE_SECONDS, Server
from gpusizer.signals.health import failed_whole
from gpusizer.signals.parse import PodSamples, Problem, Sample, merged
from gpusizer.signals.queries import (
    ACTIVE,
    GPU_UTIL,
    KV_CACHE,
    MAX_NAMED_PODS,
    MEMORY,
    MIG_UTIL,
    MOVE_MARGIN_SECONDS,
    POWER,
    PodQuery,
    queue_signal,
)
from gpusizer.signals.reader import (
    DRAW_WINDOW_FLOOR_SECONDS,
    HistoryCache,
    SnapshotReader,
    read_full,
    read_moved,
    read_slow,
)
from gpusizer.signals.snapshot import Snapshot
from gpusizer.vocabulary import Reason

from tests.fakes import TIMED_OUT, FakeMetrics, steps_taken

NAN = Problem(Reason.INVALID_VALUE, "value nan is not finite")


def test_merged_replaces_only_the_pods_it_read() -> None:
    base = PodSamples(
        samples={("ns", "a"): Sample(50, 3), ("ns", "b"): Sample(40, 3)},
        problems={("ns", "c"): NAN},
        read_at=100.0,
    )
    update = PodSamples(
        samples={("ns", "a"): Sample(90, 1), ("ns", "c"): Sample(20, 1)},
        problems={("ns", "b"): NAN},
        read_at=104.0,
    )
    got = merged(base, update)
    assert got.samples == {("ns", "a"): Sample(90, 1), ("ns", "c"): Sample(20, 1)}
    assert got.problems == {("ns", "b"): NAN}
    # pods that turned ready since the full read may be missing from it: its time stays
    assert got.read_at == 100.0
    assert base.samples[("ns", "a")] == Sample(50, 3), "the full read is not changed"


def kinds(metrics: FakeMetrics) -> list[str]:
    """Each read's kind, from the signals it asked for: a full read asks for every signal,
    a moved read first for which pods moved."""
    reads: list[str] = []
    for signal, _ in metrics.asked:
        if signal == GPU_UTIL:
            reads.append("full")
        elif signal == f"moved:{GPU_UTIL}":
            reads.append("moved")
    return reads


def with_a_pod() -> FakeMetrics:
    """A Prometheus whose full read has a pod's utilisation, so moved reads ask for it."""
    return FakeMetrics(answers={GPU_UTIL: PodSamples(samples={("ns", "a"): Sample(50, 1)})})


async def test_a_full_read_first_and_once_per_period_the_moves_between() -> None:
    now = [0.0]
    metrics = with_a_pod()
    reader = SnapshotReader(metrics, Server, 4.5, monotonic=lambda: now[0])
    for gap in [1, 1, 1, 1, 1, 1, 3, 1, 1, 1, 1]:  # a read every second, one 3 s late
        await reader.read()
        now[0] += gap
    # at 0, 1, 2, 3, 4, 5, 6, 9, 10, 11, 12 s
    assert kinds(metrics) == [
        "full",
        *["moved"] * 4,
        "full",
        "moved",
        "moved",
        "full",
        "moved",
        "moved",
    ]
    # each looks back to before the read before it, however late it comes
    margin = MOVE_MARGIN_SECONDS
    looked_back = [
        int(match.group(1)) / 1000
        for signal, promql in metrics.asked
        if signal == f"moved:{GPU_UTIL}" and (match := re.search(r"offset (\d+)ms", promql))
    ]
    assert looked_back == [1 + margin] * 5 + [3 + margin] + [1 + margin] * 2


def with_kv_cache() -> FakeMetrics:
    """A Prometheus whose full read has a pod's utilisation and KV cache."""
    metrics = with_a_pod()
    metrics.answers[KV_CACHE] = PodSamples(samples={("ns", "a"): Sample(0.5, 1)})
    return metrics


def asked_for_kv_cache(metrics: FakeMetrics) -> list[str]:
    return [signal for signal, _ in metrics.asked if KV_CACHE in signal]


async def test_a_read_leaves_out_the_kv_cache_while_no_workload_decides_on_it() -> None:
    now = [0.0]
    metrics = with_kv_cache()
    reader = SnapshotReader(metrics, Server, 4.5, monotonic=lambda: now[0])
    reader.optional = frozenset
    for _ in range(6):  # full, moved x 4, full
        snapshot = await reader.read()
        assert not snapshot.asked_for({KV_CACHE})
        now[0] += 1
    assert kinds(metrics) == ["full", *["moved"] * 4, "full"]
    assert asked_for_kv_cache(metrics) == []


async def test_a_workload_that_decides_on_the_kv_cache_makes_the_next_read_full() -> None:
    now = [0.0]
    metrics = with_kv_cache()
    reader = SnapshotReader(metrics, Server, 60, monotonic=lambda: now[0])
    wanted: list[frozenset[str]] = [frozenset()]
    reader.optional = lambda: wanted[0]
    await reader.read()
    now[0] += 1
    await reader.read()
    wanted[0] = frozenset({KV_CACHE})  # one joined: the next read asks, a minute early
    now[0] += 1
    snapshot = await reader.read()
    now[0] += 1
    await reader.read()
    assert kinds(metrics) == ["full", "moved", "full", "moved"]
    assert snapshot.asked_for({KV_CACHE})
    assert snapshot.signals[KV_CACHE].samples[("ns", "a")].value == 0.5
    assert asked_for_kv_cache(metrics) == [KV_CACHE, f"moved:{KV_CACHE}"]
    wanted[0] = frozenset()  # it left: the moves go on until the next full read leaves it out
    now[0] += 60
    snapshot = await reader.read()
    assert kinds(metrics)[-1] == "full" and not snapshot.asked_for({KV_CACHE})


async def test_a_failed_kv_cache_query_was_asked_for() -> None:
    metrics = with_a_pod()
    metrics.answers[KV_CACHE] = TIMED_OUT
    snapshot = await read_full(metrics, Server, optional={KV_CACHE})
    assert KV_CACHE in snapshot.errors and snapshot.asked_for({KV_CACHE})


async def test_each_move_is_merged_into_the_latest_read_not_the_full_one() -> None:
    # a pod that moved two reads ago and not since keeps its moved value
    metrics = with_a_pod()
    reader = SnapshotReader(metrics, Server, 60, monotonic=lambda: 0.0)
    first = await reader.read()
    metrics.answers[f"moved:{GPU_UTIL}"] = PodSamples(samples={("ns", "a"): Sample(0.8, 0)})
    metrics.answers[f"moved-values:{GPU_UTIL}"] = PodSamples(samples={("ns", "a"): Sample(90, 0)})
    second = await reader.read()
    metrics.answers[f"moved:{GPU_UTIL}"] = PodSamples()
    third = await reader.read()
    assert [r.full for r in (first, second, third)] == [True, False, False]
    assert third.signals[GPU_UTIL].samples[("ns", "a")].value == 90
    assert first.signals[GPU_UTIL].samples[("ns", "a")].value == 50


async def test_a_moved_read_asks_only_for_signals_the_full_read_has_samples_of() -> None:
    metrics = FakeMetrics()
    base = Snapshot(
        time=1.0,
        signals={
            GPU_UTIL: PodSamples(samples={("ns", "a"): Sample(50, 1)}),
            MEMORY: PodSamples(samples={("ns", "a"): Sample(9000, 1)}),  # sizes slices only
            queue_signal(Server.TGI): PodSamples(),  # no pod serves it
        },
        errors={MIG_UTIL: NAN, queue_signal(Server.VLLM): NAN},  # unread: no move to see
    )
    moved = await read_moved(metrics, base, 3.0)
    assert [signal for signal, _ in metrics.asked] == [f"moved:{GPU_UTIL}"]
    assert moved.signals == base.signals and moved.errors == base.errors and not moved.full


async def test_a_moved_read_fetches_the_values_of_the_pods_that_moved_and_no_others() -> None:
    util = PodSamples(
        samples={("ns", "a"): Sample(50, 1), ("ns", "b"): Sample(20, 1), ("ns", "c"): Sample(5, 1)}
    )
    base = Snapshot(time=1.0, signals={GPU_UTIL: util})
    metrics = FakeMetrics(
        answers={
            f"moved:{GPU_UTIL}": PodSamples(
                samples={("ns", "a"): Sample(0.8, 0)}, problems={("ns", "c"): NAN}
            ),
            f"moved-values:{GPU_UTIL}": PodSamples(
                samples={
                    ("ns", "a"): Sample(90, 0),
                    ("ns", "b"): Sample(21, 0),  # under 5 %: not among the moves
                    ("other", "a"): Sample(70, 0),  # the same name in another namespace
                },
                problems={("ns", "c"): NAN},
            ),
        }
    )
    moved = await read_moved(metrics, base, 3.0)
    asked = dict(metrics.asked)
    assert list(asked) == [f"moved:{GPU_UTIL}", f"moved-values:{GPU_UTIL}"]
    assert 'pod=~"a|c"' in asked[f"moved-values:{GPU_UTIL}"], "only the pods that moved are named"
    assert moved.signals[GPU_UTIL].samples == {
        ("ns", "a"): Sample(90, 3.0),
        ("ns", "b"): Sample(20, 1),
    }
    assert moved.signals[GPU_UTIL].problems == {("ns", "c"): NAN}
    assert util.samples[("ns", "a")].value == 50, "the full read is not changed"


async def test_past_the_names_a_query_can_carry_a_moved_read_reads_every_pods_value() -> None:
    pods = [("ns", f"p{i}") for i in range(MAX_NAMED_PODS + 1)]
    base = Snapshot(time=1.0, signals={GPU_UTIL: PodSamples({k: Sample(10, 1) for k in pods})})
    metrics = FakeMetrics(
        answers={
            f"moved:{GPU_UTIL}": PodSamples({k: Sample(1.0, 0) for k in pods}),
            f"moved-values:{GPU_UTIL}": PodSamples({k: Sample(20, 0) for k in pods}),
        }
    )
    moved = await read_moved(metrics, base, 3.0)
    promql = dict(metrics.asked)[f"moved-values:{GPU_UTIL}"]
    assert "=~" not in promql and "DCGM_FI_DEV_GPU_UTIL" in promql
    assert all(sample.value == 20 for sample in moved.signals[GPU_UTIL].samples.values())


async def test_a_moved_read_whose_values_went_unanswered_keeps_the_full_read() -> None:
    util = PodSamples(samples={("ns", "a"): Sample(50, 1)})
    metrics = FakeMetrics(
        answers={
            f"moved:{GPU_UTIL}": PodSamples(samples={("ns", "a"): Sample(0.8, 0)}),
            f"moved-values:{GPU_UTIL}": Problem(Reason.PROMETHEUS_UNREACHABLE, "timed out"),
        }
    )
    moved = await read_moved(metrics, Snapshot(time=1.0, signals={GPU_UTIL: util}), 3.0)
    assert moved.signals == {GPU_UTIL: util} and moved.errors == {}


async def test_a_failed_moved_read_keeps_the_full_read_and_reports_nothing_new() -> None:
    # whether Prometheus is failing is the next full read's to say, for every signal at once
    metrics = FakeMetrics(down=Problem(Reason.PROMETHEUS_UNREACHABLE, "connection refused"))
    util = PodSamples(samples={("ns", "a"): Sample(50, 1)})
    base = Snapshot(time=1.0, signals={GPU_UTIL: util})
    moved = await read_moved(metrics, base, 3.0)
    assert metrics.asked, "the moved read was sent"
    assert moved.signals == {GPU_UTIL: util} and moved.errors == {}


async def test_memory_is_read_once_per_slow_period_and_kept_between() -> None:
    # GPU memory sizes slices, not replicas: a third of every full read, for a status field
    now = [0.0]
    memory = PodSamples(samples={("ns", "a"): Sample(9000, 1)})
    metrics = FakeMetrics(answers={GPU_UTIL: PodSamples(), MEMORY: memory})
    reader = SnapshotReader(metrics, Server, 5, slow_every_seconds=60, monotonic=lambda: now[0])
    reads = []
    for _ in range(14):  # a full read every 5 s for 65 s
        reads.append(await reader.read())
        now[0] += 5
    asked = [signal for signal, _ in metrics.asked]
    assert asked.count(GPU_UTIL) == 14
    assert asked.count(MEMORY) == 2  # at 0 s and 60 s
    assert all(r.signals[MEMORY] is memory for r in reads)


async def test_a_memory_read_that_failed_stays_failed_until_the_next() -> None:
    now = [0.0]
    metrics = FakeMetrics(answers={MEMORY: NAN})
    reader = SnapshotReader(metrics, Server, 5, slow_every_seconds=60, monotonic=lambda: now[0])
    await reader.read()
    metrics.answers[MEMORY] = PodSamples(samples={("ns", "a"): Sample(9000, 1)})
    now[0] += 5
    kept = await reader.read()
    assert kept.errors[MEMORY] == NAN and MEMORY not in kept.signals


async def test_an_outage_inside_the_memory_period_is_an_outage() -> None:
    """GPU memory carried from the read before is not an answer: a full read whose every query
    failed is an outage even while the memory it keeps between its reads is known."""
    now = [0.0]
    memory = PodSamples(samples={("ns", "a"): Sample(9000, 1)})
    metrics = FakeMetrics(answers={GPU_UTIL: PodSamples(), MEMORY: memory})
    reader = SnapshotReader(metrics, Server, 5, slow_every_seconds=60, monotonic=lambda: now[0])
    assert failed_whole(await reader.read()) is None
    metrics.down = Problem(Reason.QUERY_ERROR, "HTTP Status Code 500")
    now[0] += 5
    failing = await reader.read()
    assert failing.signals[MEMORY] is memory  # still carried
    assert failed_whole(failing) == metrics.down


async def test_a_replica_signal_unanswered_keeps_the_last_samples_marked_why() -> None:
    """A query that times out while the rest of the read answered stands on the read before:
    each workload decides on those samples while they are fresh (signals.join)."""
    now = [0.0]
    util = PodSamples(samples={("ns", "a"): Sample(50, 1)}, read_at=1000.0)
    queue = PodSamples(samples={("ns", "a"): Sample(3, 1)}, read_at=1000.0)
    metrics = FakeMetrics(answers={GPU_UTIL: util, queue_signal(Server.VLLM): queue})
    reader = SnapshotReader(metrics, Server, 5, monotonic=lambda: now[0])
    await reader.read()
    metrics.answers[GPU_UTIL] = TIMED_OUT
    now[0] += 5
    held = await reader.read()
    assert GPU_UTIL not in held.errors and failed_whole(held) is None
    kept = held.signals[GPU_UTIL]
    assert kept.samples == util.samples and kept.read_at == 1000.0 and kept.held == TIMED_OUT
    now[0] += 5
    again = await reader.read()  # held again, from the same read
    assert again.signals[GPU_UTIL].read_at == 1000.0 and again.signals[GPU_UTIL].held
    metrics.answers[GPU_UTIL] = util
    now[0] += 5
    answered = await reader.read()
    assert answered.signals[GPU_UTIL] is util


@pytest.mark.parametrize(
    "failure, everything_fails",
    [
        (Problem(Reason.QUERY_ERROR, "HTTP Status Code 400: bad_data"), False),  # refused
        (TIMED_OUT, True),  # an outage: signals.health says it, once for the fleet
    ],
)
async def test_a_refused_query_or_an_outage_holds_nothing(
    failure: Problem, everything_fails: bool
) -> None:
    now = [0.0]
    util = PodSamples(samples={("ns", "a"): Sample(50, 1)}, read_at=1000.0)
    metrics = FakeMetrics(answers={GPU_UTIL: util})
    reader = SnapshotReader(metrics, Server, 5, monotonic=lambda: now[0])
    await reader.read()
    if everything_fails:
        metrics.down = failure
    else:
        metrics.answers[GPU_UTIL] = failure
    now[0] += 5
    failing = await reader.read()
    assert failing.errors[GPU_UTIL] == failure and GPU_UTIL not in failing.signals
    assert (failed_whole(failing) is not None) is everything_fails


async def test_memory_unanswered_is_held_for_one_read_of_it() -> None:
    """A memory read that timed out keeps the last answer, marked why, until the next read of
    it: one timeout must not take every workload's reading away and back. Nothing ages it, so
    a second failure in a row says it."""
    memory = PodSamples(samples={("ns", "a"): Sample(9000, 1)}, read_at=1000.0)
    metrics = FakeMetrics(answers={MEMORY: memory})
    first = await read_slow(metrics, Server)
    metrics.answers[MEMORY] = TIMED_OUT
    second = await read_slow(metrics, Server, last=first)
    held = second.signals[MEMORY]
    assert MEMORY not in second.errors
    assert held.samples == memory.samples and held.read_at == 1000.0 and held.held == TIMED_OUT
    third = await read_slow(metrics, Server, last=second)
    assert third.errors[MEMORY] == TIMED_OUT and MEMORY not in third.signals


async def test_memory_refused_is_not_held() -> None:
    memory = PodSamples(samples={("ns", "a"): Sample(9000, 1)}, read_at=1000.0)
    metrics = FakeMetrics(answers={MEMORY: memory})
    first = await read_slow(metrics, Server)
    refused = Problem(Reason.QUERY_ERROR, "HTTP Status Code 400: bad_data")
    metrics.answers[MEMORY] = refused
    second = await read_slow(metrics, Server, last=first)
    assert second.errors[MEMORY] == refused and MEMORY not in second.signals


@dataclass
class MemoryThatWaits(FakeMetrics):
    """A Prometheus whose answer to the GPU memory query waits for `answer` to be set."""

    answer: asyncio.Event = field(default_factory=asyncio.Event)

    async def per_pod_batch(
        self, wanted: Mapping[str, PodQuery]
    ) -> tuple[dict[str, PodSamples], dict[str, Problem]]:
        if MEMORY in wanted:
            await self.answer.wait()
        return await super().per_pod_batch(wanted)


async def test_a_full_read_does_not_wait_for_a_memory_read_in_flight() -> None:
    """At 10,000 workloads the memory query timed out at 10 s most minutes, and the full read
    that sent it waited as long: it is read on its own lane, and a full read carries the
    latest answer while the next is awaited."""
    now = [0.0]
    before = PodSamples(samples={("ns", "a"): Sample(9000, 1)})
    after = PodSamples(samples={("ns", "a"): Sample(12000, 1)})
    metrics = MemoryThatWaits(answers={GPU_UTIL: PodSamples(), MEMORY: before})
    metrics.answer.set()
    reader = SnapshotReader(metrics, Server, 5, slow_every_seconds=60, monotonic=lambda: now[0])
    assert (await reader.read()).signals[MEMORY] is before  # the first is waited for
    metrics.answer.clear()
    metrics.answers[MEMORY] = after
    now[0] = 60.0
    async with asyncio.timeout(5):  # fails, rather than hangs, if the full read waits
        due = await reader.read()
    assert due.signals[MEMORY] is before and MEMORY in due.carried
    assert [signal for signal, _ in metrics.asked].count(GPU_UTIL) == 2
    metrics.answer.set()
    async with asyncio.timeout(5):
        landed = due
        while landed.signals[MEMORY] is before:  # a full read every 5 s carries it once landed
            await steps_taken()
            now[0] += 5
            landed = await reader.read()
    assert landed.signals[MEMORY] is after
    assert [signal for signal, _ in metrics.asked].count(MEMORY) == 2


async def test_a_pod_an_answer_leaves_out_keeps_its_last_sample_aged_since() -> None:
    """Prometheus drops a scrape target's series at once when a scrape of it fails: its pods
    go on with their last samples, aged, and the join says StaleSamples past each workload's
    maxSampleAgeSeconds."""
    a, b, c = ("ns", "a"), ("ns", "b"), ("ns", "c")
    metrics = FakeMetrics(
        answers={
            GPU_UTIL: PodSamples(
                samples={a: Sample(50, 1), b: Sample(60, 2), c: Sample(70, 1)}, read_at=1000.0
            )
        }
    )
    first = await read_full(metrics, Server)
    metrics.answers[GPU_UTIL] = PodSamples(
        samples={a: Sample(55, 1)},
        problems={c: Problem(Reason.INVALID_VALUE, "NaN")},
        read_at=1005.0,
    )
    second = await read_full(metrics, Server, last=first)
    util = second.signals[GPU_UTIL]
    assert util.samples == {a: Sample(55, 1), b: Sample(60, 7)} and c in util.problems
    assert util.read_at == 1005.0 and util.held is None and util.carried == {b}
    metrics.answers[GPU_UTIL] = PodSamples(samples={a: Sample(50, 1)}, read_at=1010.0)
    third = await read_full(metrics, Server, last=second)
    assert third.signals[GPU_UTIL].samples[b] == Sample(60, 12), "aged from read to read"
    metrics.answers[GPU_UTIL] = PodSamples(
        samples={a: Sample(50, 1)}, read_at=1010.0 + MAX_SAMPLE_AGE_SECONDS
    )
    late = await read_full(metrics, Server, last=third)
    assert b not in late.signals[GPU_UTIL].samples, "older than any workload may use"


async def test_a_pod_left_out_of_an_answer_does_not_change_the_answer_read_before() -> None:
    a, b = ("ns", "a"), ("ns", "b")
    before = PodSamples(samples={a: Sample(50, 1), b: Sample(60, 1)}, read_at=1000.0)
    metrics = FakeMetrics(answers={GPU_UTIL: before})
    first = await read_full(metrics, Server)
    now = PodSamples(samples={a: Sample(55, 1)}, read_at=1005.0)
    metrics.answers[GPU_UTIL] = now
    await read_full(metrics, Server, last=first)
    assert first.signals[GPU_UTIL].samples == {a: Sample(50, 1), b: Sample(60, 1)}
    assert now.samples == {a: Sample(55, 1)}


def test_a_carried_pod_a_moved_read_answers_for_is_carried_no_longer() -> None:
    a, b = ("ns", "a"), ("ns", "b")
    base = PodSamples(samples={a: Sample(50, 1), b: Sample(60, 7)}, carried=frozenset({a, b}))
    update = PodSamples(samples={a: Sample(90, 2)})
    assert merged(base, update).carried == {b}


@pytest.mark.parametrize(("period", "window"), [(10, DRAW_WINDOW_FLOOR_SECONDS), (120, 120)])
async def test_the_draw_is_read_alone_once_a_period_over_it_or_a_minute(
    period: float, window: int
) -> None:
    metrics, clock = FakeMetrics(), [0.0]
    cache = HistoryCache(metrics, period, clock=lambda: clock[0], wall=lambda: 1000 + clock[0])
    assert (await cache.draw()).window_seconds == window
    assert sorted(name for name, _ in metrics.asked) == [ACTIVE, POWER, POWER]
    assert all(f"[{window}s]" in promql for _, promql in metrics.asked)
    clock[0] = period - 1
    await cache.draw()
    assert len(metrics.asked) == 3, "read again within its period"
    clock[0] = period + 1
    await cache.draw()  # the reading before, while its refresh runs
    await steps_taken()
    assert (await cache.draw()).time == 1000 + period + 1
    assert len(metrics.asked) == 6


async def test_a_window_is_read_again_once_it_moved_by_its_share_or_after_a_period() -> None:
    metrics, clock = FakeMetrics(), [0.0]
    cache = HistoryCache(metrics, 60, clock=lambda: clock[0], wall=lambda: 1000 + clock[0])

    def reads(window: int) -> int:
        return sum(name == "peak_memory" and f"[{window}s]" in q for name, q in metrics.asked)

    async def read_at(moment: float, window: int) -> float:
        clock[0] = moment
        await cache.get(window)  # a stale reading starts its refresh
        await steps_taken()
        return (await cache.get(window)).time

    assert await read_at(0, 3600) == 1000 and await read_at(0, 600) == 1000
    # past the right-sizing period: the ten minutes' is read again, the hour's has moved by
    # under 5 % of itself
    assert await read_at(61, 600) == 1061 and await read_at(61, 3600) == 1000
    assert await read_at(179, 3600) == 1000
    assert await read_at(181, 3600) == 1181
    assert (reads(600), reads(3600)) == (2, 2)
