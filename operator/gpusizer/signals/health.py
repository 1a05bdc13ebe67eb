"""Whether Prometheus answers at all: one state for the whole fleet, judged at every full read.

A full read in which every query failed is an outage of Prometheus itself, not of any one
workload's signals. It is said once for the fleet (a log line when it begins and one when it
ends, and the gauge `gpusizer_prometheus_available`); the workloads hold their replicas at
once and their statuses follow slowly (`report.turn.OutageDamping`), so that a Prometheus that
flaps costs neither one Event nor one status write per workload per flap (docs/operations.md).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from gpusizer.charge import OutageSpans
from gpusizer.report import metrics
from gpusizer.signals.parse import Problem
from gpusizer.signals.queries import REPLICA_SIGNALS
from gpusizer.signals.snapshot import Snapshot
from gpusizer.timefmt import iso
from gpusizer.vocabulary import Reason

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Outage:
    """Prometheus not answering: the first failure of the first full read that failed whole."""

    problem: Problem
    since: float  # wall clock of that read
    until: float | None = None  # of the first full read answered again; None while it lasts


KEPT_OUTAGES = 8
"""How many outages a replica remembers, and hands over in the Lease. A status shows the loss an
outage wrote until a replica in charge follows that outage's end, and while no replica is (the
Lease changing hands), several short outages may come and go: with two kept, seed 34's 124
MetricsRecovered Events came from the third last (bench/README.md, "Soak")."""


@dataclass(frozen=True)
class PrometheusState:
    """What a cycle carries about Prometheus: the outage going on, else the last one, and the
    ones before it (whose end some workloads' statuses may not have followed yet: report.turn)."""

    outage: Outage | None = None
    earlier: tuple[Outage, ...] = ()  # the last first, at most KEPT_OUTAGES - 1

    @property
    def down(self) -> Outage | None:
        """The outage going on, if any."""
        return self.outage if self.outage is not None and self.outage.until is None else None

    def outages(self) -> tuple[Outage, ...]:
        """Every outage kept, the last first."""
        return self.earlier if self.outage is None else (self.outage, *self.earlier)

    def spans(self) -> OutageSpans:
        """What the operator's Lease carries of this state (`charge`)."""
        return tuple((o.since, o.until) for o in self.outages())


def failed_whole(snapshot: Snapshot) -> Problem | None:
    """The first failure of a full read in which every query it sent failed; None if any
    answered. What it carried from an earlier read answered nothing now: counted, GPU memory
    kept between its reads hid every outage that began inside its period."""
    if not snapshot.full:
        return None
    if any(name not in snapshot.carried for name in snapshot.signals):
        return None
    failures = [p for name, p in snapshot.errors.items() if name not in snapshot.carried]
    return failures[0] if failures else None


def scraped_before(snapshot: Snapshot, moment: float) -> tuple[int, int]:
    """How many of a read's scraped samples were taken before `moment`, of how many. The
    replica signals only: a rate() is stamped when Prometheus evaluates it, so a restarted
    Prometheus answers the request rate at once, "new", over the samples it had before."""
    before = total = 0
    for signal, samples in snapshot.signals.items():
        if signal not in REPLICA_SIGNALS:
            continue
        read_at = samples.read_time(snapshot.time)
        for sample in samples.samples.values():
            total += 1
            before += read_at - sample.age <= moment
    return before, total


def _joined(first: Outage, later: Outage) -> Outage:
    """Two outages that overlap, `first` begun no later, as one."""
    until = None if first.until is None or later.until is None else max(first.until, later.until)
    return Outage(first.problem, first.since, until)


SETTLE_SECONDS = 60.0
"""How long after a Prometheus that was out first shows new samples the outage may go on
while some of its targets have not been scraped again: longer than a scrape interval, so that
a restarted Prometheus has scraped every target that is up."""


class PrometheusHealth:
    """Follows the full reads; says so once when Prometheus stops answering and once when it
    answers again."""

    def __init__(self) -> None:
        self.state = PrometheusState()
        self._scraping_since: float | None = None  # an outage's first read with new samples
        metrics.PROMETHEUS_AVAILABLE.set(1)

    def observe(self, snapshot: Snapshot) -> PrometheusState:
        """An outage ends at the first full read whose samples were all scraped since it
        began, or SETTLE_SECONDS after the first read with any: a Prometheus that was
        restarted answers at once with its samples of before, every workload's too old, and
        scrapes its targets again one by one. Ending it at its first new sample made every
        workload whose target came later say StaleSamples, an Event each."""
        if not snapshot.full:
            return self.state
        problem, down = failed_whole(snapshot), self.state.down
        if problem is None and down is not None and self._scraping(snapshot, down.since):
            return self.state
        self._scraping_since = None
        if problem is not None and down is None:
            kept = self.state.outages()[: KEPT_OUTAGES - 1]
            self.state = PrometheusState(Outage(problem, snapshot.time), kept)
            metrics.PROMETHEUS_AVAILABLE.set(0)
            metrics.PROMETHEUS_OUTAGES.inc()
            log.warning(
                "Prometheus is unavailable, every query of the read failed (%s: %s): every "
                "workload holds its replicas until it answers",
                problem.reason.value,
                problem.message,
            )
        elif problem is None and down is not None:
            self.state = PrometheusState(
                Outage(down.problem, down.since, snapshot.time), self.state.earlier
            )
            metrics.PROMETHEUS_AVAILABLE.set(1)
            log.warning(
                "Prometheus answers again after %.0fs unavailable", snapshot.time - down.since
            )
        return self.state

    def inherit(self, spans: OutageSpans, holder: str) -> None:
        """A replica taking over knows the outages its predecessor saw (from the Lease) as well
        as its own: a replica started since would otherwise greet a restarted Prometheus's
        samples from before as new and stale, and every workload say StaleSamples (the soak,
        bench/README.md), or take the losses an outage left on the statuses, not yet followed
        by its end, for the workloads' own. Where an outage of each overlaps, they are one, from
        the earlier start; an outage inherited as going on ends at a full read as any."""
        theirs = [
            Outage(
                Problem(
                    Reason.PROMETHEUS_UNREACHABLE,
                    f"Prometheus unavailable since {iso(since)}, as replica {holder} saw it",
                ),
                since,
                until,
            )
            for since, until in spans
        ]
        known = self.state.outages()
        merged: list[Outage] = []
        for outage in sorted([*known, *theirs], key=lambda o: o.since):
            if merged and (merged[-1].until is None or outage.since <= merged[-1].until):
                merged[-1] = _joined(merged[-1], outage)
            else:
                merged.append(outage)
        was_down = self.state.down
        kept = merged[::-1][:KEPT_OUTAGES]
        self.state = PrometheusState(kept[0], tuple(kept[1:])) if kept else PrometheusState()
        down = self.state.down
        if down is not None and was_down is None:
            self._scraping_since = None
            metrics.PROMETHEUS_AVAILABLE.set(0)
            log.warning(
                "Prometheus has been unavailable since %s, as replica %s saw it: every workload "
                "holds its replicas until it answers",
                iso(down.since),
                holder,
            )

    def _scraping(self, snapshot: Snapshot, since: float) -> bool:
        """Whether Prometheus, answering again, is still catching up with its targets."""
        before, total = scraped_before(snapshot, since)
        if before == 0:
            return False
        if before == total:
            return True  # nothing scraped since it began
        if self._scraping_since is None:
            self._scraping_since = snapshot.time
        return snapshot.time - self._scraping_since < SETTLE_SECONDS
