"""The annotations gpusizer reads and writes on WorkloadSizings and their targets, and the
records it keeps in them.

A reshape in flight and the slice before it live on the target, so a restarted operator picks
up a rollout where the last one left it and never starts a second one: the record is parsed
and rendered only here, and older operators' records still parse. Pure.
"""

from __future__ import annotations

import json
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from gpusizer.api.v1alpha1 import GROUP

PAUSE_ANNOTATION = f"{GROUP}/paused"
RESHAPE_ANNOTATION = f"{GROUP}/reshape"
PREVIOUS_SLICE_ANNOTATION = f"{GROUP}/previous-slice"


class _Record(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore", frozen=True)

    def annotation(self) -> str:
        return json.dumps(self.model_dump(by_alias=True, mode="json"), sort_keys=True)


class Placement(_Record):
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


class ReshapeRecord(_Record):
    """A slice change: started, then Done or RolledBack."""

    state: ReshapeState
    origin: Placement = Field(alias="from")
    to: Placement
    units: int = Field(1, ge=1, description="GPU resource units per pod")
    container: str
    started: str = Field(description="RFC 3339 time the change was written")
    deadline_seconds: float = Field(alias="deadlineSeconds", gt=0)
    message: str = ""

    @classmethod
    def parse(cls, raw: str) -> ReshapeRecord:
        """Raises ValueError (pydantic's ValidationError is one) for a record it cannot read."""
        return cls.model_validate_json(raw)

    def moved_message(self) -> str:
        return f"now on {self.to.slice} ({self.to.product}): {self.message}"
