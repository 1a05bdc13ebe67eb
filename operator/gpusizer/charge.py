"""Which of several operator replicas is in charge: the one holding the operator's
coordination.k8s.io Lease, judged as client-go's leader election judges it. Pure: the times
come in (a monotonic clock's for every judgement, the wall clock's only to stamp the record).

kopf's peering pauses the standby's watches, but it is not a lease: a replica whose peering
renewal came late (etcd paused) never learns that its peer took over, and both acted for 51 s in
the soak (bench/README.md, "Soak"). A replica acts only while its own renewal of the Lease is
fresh, and takes the Lease over only once the record it last saw has stayed unchanged for the
Lease's whole duration, by its own clock (no trust in another machine's clock).

The invariant: RENEW_DEADLINE_SECONDS + kube.API_TIMEOUT_SECONDS < LEASE_SECONDS, so a turn
begun in charge has usually written before a peer may take over; one that writes later still
cannot undo the peer's decision, as every scale write carries the resourceVersion it read
(`actuate.targets`) and conflicts with any write since.
"""

from __future__ import annotations

import datetime
import enum
from dataclasses import dataclass, replace

LEASE_SECONDS = 30
RENEW_DEADLINE_SECONDS = 15.0  # a replica that has not renewed for this long stops acting
RETRY_SECONDS = 2.0  # how often the Lease is read, and renewed by its holder

# Outages of Prometheus as (since, until), wall clock, until None while one lasts; the last first
OutageSpans = tuple[tuple[float, float | None], ...]


class Step(enum.Enum):
    ACQUIRE = "acquire"  # write ourselves as holder of a free or expired Lease
    RENEW = "renew"  # we hold it: write a fresh renewTime
    RELEASE = "release"  # we hold it but no longer want it: free it for the peer at once
    WAIT = "wait"


@dataclass(frozen=True)
class LeaseRecord:
    """The fields of a Lease that leader election reads, and the outages of Prometheus its holder
    knows, so that a replica taking over does not greet a Prometheus still catching up as new,
    nor take the losses an outage left on the statuses for the workloads' own."""

    holder: str  # "" when free
    renewed: str  # renewTime as written; compared only for change
    duration_seconds: int = LEASE_SECONDS
    transitions: int = 0
    version: str = ""  # resourceVersion; "" for a Lease not created yet
    prometheus_outages: OutageSpans = ()


def micro_time(wall: float) -> str:
    """A Kubernetes MicroTime: always six fractional digits, as the API server parses it."""
    moment = datetime.datetime.fromtimestamp(wall, datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Charge:
    """This replica's view of the Lease: whether it is in charge, and what to write next."""

    def __init__(self, identity: str) -> None:
        self.identity = identity
        self._renewed_at: float | None = None  # monotonic, of our last successful write
        self._seen: tuple[str, str] | None = None  # (holder, renewed) last read
        self._seen_since = 0.0  # monotonic, when that record was first read

    def held(self, now: float) -> bool:
        """In charge: our last write as holder succeeded within RENEW_DEADLINE_SECONDS."""
        return self._renewed_at is not None and now - self._renewed_at < RENEW_DEADLINE_SECONDS

    def step(self, record: LeaseRecord | None, wants: bool, now: float) -> Step:
        """What to do about `record` (None: no Lease yet), read at `now`; `wants` is whether
        this replica may lead (kopf's peering runs its workloads)."""
        if record is None:
            return Step.ACQUIRE if wants else Step.WAIT
        seen = (record.holder, record.renewed)
        if seen != self._seen:
            self._seen, self._seen_since = seen, now
        if record.holder == self.identity:
            return Step.RENEW if wants else Step.RELEASE
        self._renewed_at = None  # another holds it: whatever we wrote is over
        if not wants:
            return Step.WAIT
        if not record.holder or now - self._seen_since >= record.duration_seconds:
            return Step.ACQUIRE
        return Step.WAIT

    def claim(self, record: LeaseRecord | None, wall: float, outages: OutageSpans) -> LeaseRecord:
        """The record to write for ACQUIRE or RENEW, on `record`'s resourceVersion, so that of
        two replicas writing at once one meets a conflict."""
        stamp = micro_time(wall)
        if record is None:
            return LeaseRecord(self.identity, stamp, prometheus_outages=outages)
        ours = record.holder == self.identity
        return replace(
            record,
            holder=self.identity,
            renewed=stamp,
            duration_seconds=LEASE_SECONDS,
            transitions=record.transitions if ours else record.transitions + 1,
            prometheus_outages=outages,
        )

    def released(self, record: LeaseRecord) -> LeaseRecord:
        """The record that frees the Lease: no holder, so the peer need not wait it out; the
        outages it saw go to the peer too."""
        self._renewed_at = None
        return replace(record, holder="")

    def wrote(self, started: float) -> bool:
        """Our ACQUIRE or RENEW, sent at `started`, succeeded; True when this puts us in
        charge (we were not). Counted from when it was sent: the peer's clock for our record
        starts no earlier than that."""
        was = self.held(started)
        self._renewed_at = started
        return not was
