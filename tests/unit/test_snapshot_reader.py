"""What each read of the cycle clock asks for: a full snapshot once per sync period, the pods
that moved in between, merged into it."""

from __future__ import annotations

from typing import Any

from gpusizer.api.v1alpha1 import Server
from gpusizer.signals.parse import PodSamples, Problem, Sample
from gpusizer.signals.source import (
    GPU_UTIL,
    MEMORY,
    MIG_UTIL,
    MOVE_MARGIN_SECONDS,
    PrometheusSettings,
    PrometheusSource,
    Snapshot,
    SnapshotReader,
    merged,
    queue_signal,
)
from gpusizer.vocabulary import Reason

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


class CountingSource:
    """Answers full reads and moved reads with numbered snapshots, recording which it gave."""

    def __init__(self) -> None:
        self.reads: list[str] = []
        self.bases: list[float] = []  # the time of the snapshot each moved read merged into
        self.since: list[float] = []  # how far back each moved read looked

    async def snapshot(self, servers: tuple[Server, ...]) -> Snapshot:
        self.reads.append("full")
        return Snapshot(time=float(len(self.reads)))

    async def moved(self, base: Snapshot, since_seconds: float) -> Snapshot:
        self.reads.append("moved")
        self.bases.append(base.time)
        self.since.append(since_seconds)
        return Snapshot(time=float(len(self.reads)), signals=base.signals, full=False)


async def test_a_full_read_first_and_once_per_period_the_moves_between() -> None:
    now = [0.0]
    source = CountingSource()
    reader = SnapshotReader(source, Server, 4.5, monotonic=lambda: now[0])  # type: ignore[arg-type]
    for gap in [1, 1, 1, 1, 1, 1, 3, 1, 1, 1, 1]:  # a read every second, one 3 s late
        await reader.read()
        now[0] += gap
    # at 0, 1, 2, 3, 4, 5, 6, 9, 10, 11, 12 s
    assert source.reads == [
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
    assert source.since == [1 + margin] * 5 + [3 + margin] + [1 + margin] * 2


async def test_each_move_is_merged_into_the_latest_read_not_the_full_one() -> None:
    # a pod that moved two reads ago and not since keeps its moved value
    source = CountingSource()
    reader = SnapshotReader(source, Server, 60, monotonic=lambda: 0.0)  # type: ignore[arg-type]
    reads = [await reader.read() for _ in range(3)]
    assert [r.full for r in reads] == [True, False, False]
    assert source.bases == [reads[0].time, reads[1].time]


async def test_a_moved_read_asks_only_for_signals_the_full_read_has_samples_of() -> None:
    source = PrometheusSource(PrometheusSettings(url="http://127.0.0.1:1"))
    sent: list[str] = []

    async def recording(promql: str, signal: str) -> tuple[Any, Problem | None]:
        sent.append(signal)
        return [], None

    source.query = recording  # type: ignore[method-assign]
    base = Snapshot(
        time=1.0,
        signals={
            GPU_UTIL: PodSamples(samples={("ns", "a"): Sample(50, 1)}),
            MEMORY: PodSamples(samples={("ns", "a"): Sample(9000, 1)}),  # sizes slices only
            queue_signal(Server.TGI): PodSamples(),  # no pod serves it
        },
        errors={MIG_UTIL: NAN, queue_signal(Server.VLLM): NAN},  # unread: no move to see
    )
    moved = await source.moved(base, 3.0)
    assert sent == [f"moved:{GPU_UTIL}"]
    assert moved.signals == base.signals and moved.errors == base.errors and not moved.full


async def test_a_failed_moved_read_keeps_the_full_read_and_reports_nothing_new() -> None:
    # whether Prometheus is failing is the next full read's to say, for every signal at once
    source = PrometheusSource(PrometheusSettings(url="http://127.0.0.1:1"))

    async def failing(promql: str, signal: str) -> tuple[Any, Problem | None]:
        return None, Problem(Reason.PROMETHEUS_UNREACHABLE, "connection refused")

    source.query = failing  # type: ignore[method-assign]
    util = PodSamples(samples={("ns", "a"): Sample(50, 1)})
    base = Snapshot(time=1.0, signals={GPU_UTIL: util})
    moved = await source.moved(base, 3.0)
    assert moved.signals == {GPU_UTIL: util} and moved.errors == {}
