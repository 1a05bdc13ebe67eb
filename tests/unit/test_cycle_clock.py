"""The cycle clock: one fetch per period while workloads listen, each cycle handed on at once."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import pytest
from gpusizer.api.v1alpha1 import Server
from gpusizer.clock import Cycle, CycleClock, FailingSince, fetch_cycle
from gpusizer.signals.autoscalers import TargetKey
from gpusizer.signals.health import PrometheusHealth
from gpusizer.signals.parse import PodSamples, Problem, Sample
from gpusizer.signals.queries import GPU_UTIL, PodQuery
from gpusizer.signals.reader import SnapshotReader
from gpusizer.signals.snapshot import Snapshot

from tests.fakes import FakeMetrics, steps_taken


class Fetches:
    """A fetch that counts, each cycle's snapshot stamped with its number, and records how
    many workloads listened when it ran."""

    def __init__(self) -> None:
        self.count = 0
        self.done = asyncio.Event()
        self.clock: CycleClock | None = None
        self.listeners_seen: list[int] = []

    async def __call__(self) -> Cycle:
        self.count += 1
        if self.clock is not None:
            self.listeners_seen.append(self.clock.listeners)
        self.done.set()
        return Cycle(snapshot=Snapshot(time=float(self.count)), autoscalers={})


def cycle_with(utilization: dict[str, float], number: int = 0) -> Cycle:
    """A cycle whose snapshot has these pods' GPU utilisation (pods of namespace "ns")."""
    samples = {("ns", pod): Sample(value, 0.0) for pod, value in utilization.items()}
    return Cycle(
        snapshot=Snapshot(time=float(number), signals={GPU_UTIL: PodSamples(samples)}),
        autoscalers={},
    )


async def test_nothing_is_fetched_until_a_workload_listens_then_at_once() -> None:
    fetches = Fetches()
    clock = fetches.clock = CycleClock(fetches, period_seconds=3600)
    task = asyncio.create_task(clock.run())
    try:
        await steps_taken()
        await steps_taken()
        assert fetches.count == 0
        clock.listeners = 1
        # the first listener does not wait out the hour-long period
        await asyncio.wait_for(fetches.done.wait(), timeout=10)
    finally:
        task.cancel()
    assert fetches.listeners_seen == [1]


async def test_a_replica_not_in_charge_reads_nothing_until_it_comes_into_charge() -> None:
    fetches = Fetches()
    clock = CycleClock(fetches, period_seconds=3600)
    in_charge = False
    clock.in_charge = lambda: in_charge
    clock.listeners = 1
    task = asyncio.create_task(clock.run())
    try:
        for _ in range(5):
            await steps_taken()
        assert fetches.count == 0
        in_charge = True
        clock.wake()  # it took over: no waiting out the hour-long period
        await asyncio.wait_for(fetches.done.wait(), timeout=10)
    finally:
        task.cancel()


async def test_each_cycle_is_handed_on_with_how_many_workloads_decide_on_it() -> None:
    clock = CycleClock(Fetches(), period_seconds=3600)
    handed: list[Cycle] = []
    clock.on_cycle = handed.append
    clock.listeners = 2
    clock.publish(cycle_with({}, 1))
    clock.publish(cycle_with({}, 2))
    assert [(c.snapshot.time, c.workloads) for c in handed] == [(1.0, 2), (2.0, 2)]
    assert clock.number == 2 and clock.latest is handed[-1]


async def test_a_cycle_is_fresh_for_one_period() -> None:
    now = [1000.0]
    clock = CycleClock(Fetches(), period_seconds=5, monotonic=lambda: now[0])
    assert not clock.fresh(), "none yet"
    clock.publish(cycle_with({}, 1))
    now[0] += 5
    assert clock.fresh()
    now[0] += 0.1
    assert not clock.fresh()


async def test_a_fetch_that_raises_keeps_the_beat(caplog: pytest.LogCaptureFixture) -> None:
    calls = 0
    second = asyncio.Event()

    async def flaky() -> Cycle:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("boom")
        second.set()
        return cycle_with({}, calls)

    clock = CycleClock(flaky, period_seconds=0.01)
    clock.listeners = 1
    task = asyncio.create_task(clock.run())
    try:
        await asyncio.wait_for(second.wait(), timeout=10)
    finally:
        task.cancel()
    assert clock.latest is not None and clock.latest.snapshot.time == 2.0
    assert "fetching the cycle's metrics failed" in caplog.text


async def test_a_cycle_names_the_pods_whose_readings_moved_since_the_last() -> None:
    clock = CycleClock(Fetches(), period_seconds=3600)
    clock.publish(cycle_with({"steady": 50.0, "jumped": 20.0}))
    assert clock.latest is not None and clock.latest.moved == {("ns", "steady"), ("ns", "jumped")}
    clock.publish(cycle_with({"steady": 51.0, "jumped": 60.0}))
    assert clock.latest.moved == {("ns", "jumped")}


class AnsweringOnceListed(FakeMetrics):
    """A Prometheus that answers only once the HPAs and ScaledObjects are being listed."""

    def __init__(self) -> None:
        super().__init__(answers={GPU_UTIL: PodSamples({("ns", "chat-0"): Sample(40.0, 1.0)})})
        self.listing = asyncio.Event()

    async def per_pod_batch(
        self, wanted: Mapping[str, PodQuery]
    ) -> tuple[dict[str, PodSamples], dict[str, Problem]]:
        await self.listing.wait()
        return await super().per_pod_batch(wanted)


@pytest.mark.parametrize("listing_fails", [False, True])
async def test_the_other_autoscalers_are_listed_while_the_snapshot_is_read(
    listing_fails: bool,
) -> None:
    """The list's API calls come during the read, not after it, between the read and the
    turns of the workloads whose pods moved; a list that fails is said on the cycle."""
    prometheus = AnsweringOnceListed()

    async def list_autoscalers() -> Mapping[TargetKey, str]:
        prometheus.listing.set()
        if listing_fails:
            raise ConnectionError("the API server went away")
        return {("ns", "Deployment", "chat"): "HorizontalPodAutoscaler chat"}

    cycle = await asyncio.wait_for(
        fetch_cycle(
            SnapshotReader(prometheus, [Server.VLLM], 0),
            PrometheusHealth(),
            list_autoscalers,
            FailingSince(),
        ),
        timeout=10,
    )
    assert cycle.snapshot.signals[GPU_UTIL].samples[("ns", "chat-0")].value == 40.0
    if listing_fails:
        assert cycle.autoscalers == {}
        assert cycle.error == "listing HPAs and ScaledObjects failed: the API server went away"
        assert cycle.error_since is not None
    else:
        assert cycle.autoscalers == {("ns", "Deployment", "chat"): "HorizontalPodAutoscaler chat"}
        assert cycle.error is None and cycle.error_since is None
