"""The annotations gpusizer reads and writes on WorkloadSizings and their targets, and the
records it keeps in them.

A reshape in flight and the slice before it live on the target, so a restarted operator picks
up a rollout where the last one left it and never starts a second one: the record is parsed
and rendered only here, and older operators' records still parse.

Each activator replica says on the WorkloadSizing how many requests it holds for it: the
operator's watch sees that within milliseconds, whichever operator replica leads and however
often it restarted, with no network path of its own. Pure.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpusizer.api.v1alpha1 import GROUP
from gpusizer.timefmt import parse_time

PAUSE_ANNOTATION = f"{GROUP}/paused"
RESHAPE_ANNOTATION = f"{GROUP}/reshape"
PREVIOUS_SLICE_ANNOTATION = f"{GROUP}/previous-slice"
# On the operator's Lease (`charge`): the outages of Prometheus its holder knows, as JSON
PROMETHEUS_OUTAGES_ANNOTATION = f"{GROUP}/prometheus-outages"


class Record(BaseModel):
    """A record kept as JSON in an annotation."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore", frozen=True)

    @classmethod
    def parse(cls, raw: str) -> Self:
        """Raises ValueError (pydantic's ValidationError is one) for a record it cannot read."""
        return cls.model_validate_json(raw)

    def annotation(self) -> str:
        return json.dumps(self.model_dump(by_alias=True, mode="json"), sort_keys=True)


class Placement(Record):
    """Where a workload runs: a slice of a product, and how many replicas."""

    slice: str
    product: str
    resource: str
    product_label: str = Field(alias="productLabel")
    replicas: int = Field(ge=0)


class ReshapeState(StrEnum):
    IN_PROGRESS = "InProgress"
    DONE = "Done"
    ROLLED_BACK = "RolledBack"


class Prediction(Record):
    """What a fully busy replica should serve on the new slice, and whether the outcome was
    checked against it once measured there."""

    rate: float = Field(gt=0)
    unit: str
    basis: str  # Measured or Estimated: the ratio of the slices' throughputs it rests on
    checked: bool = False


class ReshapeRecord(Record):
    """A slice change: started, then Done or RolledBack."""

    state: ReshapeState
    origin: Placement = Field(alias="from")
    to: Placement
    units: int = Field(1, ge=1, description="GPU resource units per pod")
    container: str
    started: str = Field(description="RFC 3339 time the change was written")
    deadline_seconds: float = Field(alias="deadlineSeconds", gt=0)
    message: str = ""
    prediction: Prediction | None = None

    def moved_message(self) -> str:
        return f"now on {self.to.slice} ({self.to.product}): {self.message}"


HELD_PREFIX = f"activator.{GROUP}/"
# An activator replica rewrites its record at least this often while it holds requests...
HELD_REFRESH_SECONDS = 10.0
# ...so one not rewritten for this long is from a replica that is gone (killed, partitioned):
# its requests are lost with it and no longer count as demand.
HELD_TTL_SECONDS = 3 * HELD_REFRESH_SECONDS
_NAME_LIMIT = 63  # the name part of an annotation key


class HeldRecord(Record):
    """What one activator replica holds for a workload."""

    pending: int = Field(ge=0)
    since: str  # when the first of them arrived (RFC 3339, to the millisecond)
    at: str  # when the replica wrote this record


def held_key(replica: str) -> str:
    """The annotation key of one activator replica (its pod's name, shortened with a hash
    when it is too long for a key)."""
    if len(replica) <= _NAME_LIMIT:
        return HELD_PREFIX + replica
    digest = hashlib.sha256(replica.encode()).hexdigest()[:10]
    return f"{HELD_PREFIX}{replica[: _NAME_LIMIT - 11]}-{digest}"


@dataclass(frozen=True)
class Held:
    """The requests the live activator replicas hold for one workload."""

    pending: int = 0
    since: float | None = None  # when the earliest of them arrived
    stale: tuple[str, ...] = ()  # keys of replicas that stopped rewriting theirs
    unreadable: tuple[str, ...] = ()  # keys whose value does not parse


def held_requests(annotations: Mapping[str, str], now: float) -> Held:
    pending, since = 0, None
    stale, unreadable = [], []
    for key, raw in annotations.items():
        if not key.startswith(HELD_PREFIX):
            continue
        try:
            record = HeldRecord.model_validate_json(raw)
        except (ValidationError, ValueError):
            unreadable.append(key)
            continue
        at, first = parse_time(record.at), parse_time(record.since)
        if at is None or first is None:
            unreadable.append(key)
            continue
        if now - at > HELD_TTL_SECONDS:
            stale.append(key)
            continue
        if record.pending > 0:
            pending += record.pending
            since = first if since is None else min(since, first)
    return Held(pending, since, tuple(stale), tuple(unreadable))
