"""GPUPartitioning v1alpha1: the GPUs' own MIG layouts, planned from the fleet's demand and
applied through NVIDIA's mig-manager protocol. The single source of its CRD.

Cluster-scoped: it selects GPU nodes by label, so two of them must never select the same node
(the operator reports it and moves nothing on such a node).
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gpusizer.api.annotations import Record
from gpusizer.api.v1alpha1 import GROUP, Condition, Mode, cel

KIND = "GPUPartitioning"
PLURAL = "gpupartitionings"
SINGULAR = "gpupartitioning"
SHORT_NAMES = ["gpup"]

PROFILE_PATTERN = r"^[1-7]g\.[0-9]+gb$"
_PROFILE = re.compile(PROFILE_PATTERN)

Profile = Annotated[str, Field(pattern=PROFILE_PATTERN, max_length=16)]


class _Model(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="forbid", frozen=True)


class DrainSpec(_Model):
    timeout_seconds: int = Field(
        1800,
        alias="timeoutSeconds",
        ge=30,
        le=86400,
        description=(
            "Give up draining a node after this long: it is uncordoned, left as it was and the "
            "reason reported. Evictions go through the Eviction API, so PodDisruptionBudgets "
            "are always respected; nothing is ever forced."
        ),
    )


class GPUPartitioningSpec(_Model):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "self.spareSlices.all(p, p.matches('^[1-7]g\\\\.[0-9]+gb$'))",
                    "spareSlices: every key must be a MIG profile such as 1g.10gb",
                    ".spareSlices",
                ),
                cel(
                    "size(self.allowedProfiles) == 0 || "
                    "self.spareSlices.all(p, p in self.allowedProfiles)",
                    "spareSlices may only name profiles listed in allowedProfiles",
                    ".spareSlices",
                ),
            ]
        }
    )

    node_selector: dict[str, Annotated[str, Field(max_length=63, description="A label value.")]] = (
        Field(
            alias="nodeSelector",
            min_length=1,
            description=(
                "Labels a GPU node must carry to be partitioned by this object, e.g. "
                "{gpusizer.io/partition: 'true'}. Two GPUPartitionings must not select the same "
                "node."
            ),
        )
    )
    mode: Mode = Field(
        Mode.RECOMMEND,
        description=(
            "Off does nothing; Recommend plans and reports the layouts (changes nothing); Auto "
            "also re-partitions the nodes, one drain at a time."
        ),
    )
    max_nodes_unavailable: int = Field(
        1,
        alias="maxNodesUnavailable",
        ge=1,
        le=1000,
        description="Most nodes cordoned for a re-partition at once.",
    )
    allowed_profiles: list[Profile] = Field(
        default_factory=list,
        alias="allowedProfiles",
        max_length=32,
        description=(
            "MIG profiles a new layout may contain, e.g. [1g.10gb, 3g.40gb]; empty: every "
            "profile of the node's GPU."
        ),
    )
    spare_slices: dict[
        str, Annotated[int, Field(ge=0, le=1000, description="Free slices of this profile.")]
    ] = Field(
        default_factory=dict,
        alias="spareSlices",
        max_length=32,
        description=(
            "Free slices to keep per profile beyond the demand, on each GPU product that has "
            "the profile, e.g. {3g.40gb: 1}, so a new replica finds one without a re-partition."
        ),
    )
    drain: DrainSpec = Field(
        default_factory=DrainSpec, description="How a node's GPU pods are moved off it."
    )
    reconfigure_timeout_seconds: int = Field(
        600,
        alias="reconfigureTimeoutSeconds",
        ge=30,
        le=7200,
        description=(
            "How long mig-manager may take to report nvidia.com/mig.config.state=success "
            "before the previous layout is restored and the node uncordoned."
        ),
    )

    @model_validator(mode="after")
    def _profiles(self) -> GPUPartitioningSpec:
        for profile in self.spare_slices:
            if not _PROFILE.match(profile):
                raise ValueError(
                    f"spareSlices: every key must be a MIG profile such as 1g.10gb, not {profile!r}"
                )
            if self.allowed_profiles and profile not in self.allowed_profiles:
                raise ValueError("spareSlices may only name profiles listed in allowedProfiles")
        return self


class NodeStep(StrEnum):
    """Where a node is in its re-partition."""

    UNCHANGED = "Unchanged"
    PLANNED = "Planned"
    DRAINING = "Draining"
    CONFIGURING = "Configuring"
    ROLLING_BACK = "RollingBack"
    EXCLUDED = "Excluded"


class NodePlan(_Model):
    name: str = Field(description="The node.")
    product: str | None = Field(None, description="Its GPU product (catalog key).")
    step: NodeStep = Field(description="Where the node is in its re-partition.")
    current_config: str | None = Field(
        None, alias="currentConfig", description="Its nvidia.com/mig.config label now."
    )
    current_layout: list[str] = Field(
        default_factory=list,
        alias="currentLayout",
        description="Per GPU: 'whole', 'none' (MIG on, no instance) or its profiles, joined by +.",
    )
    proposed_config: str | None = Field(
        None, alias="proposedConfig", description="The mig-parted config it would get."
    )
    proposed_layout: list[str] = Field(
        default_factory=list,
        alias="proposedLayout",
        description="Per GPU, the layout the plan gives it; empty when it keeps its own.",
    )
    pods_to_move: list[str] = Field(
        default_factory=list,
        alias="podsToMove",
        description="GPU pods (namespace/name) evicted when the node is re-partitioned.",
    )
    slices_gained: dict[str, int] = Field(
        default_factory=dict, alias="slicesGained", description="Slices the change adds."
    )
    slices_lost: dict[str, int] = Field(
        default_factory=dict, alias="slicesLost", description="Slices the change removes."
    )
    reason: str = Field("", description="Why the plan changes the node, or leaves it.")
    message: str = Field("", description="What the node's re-partition waits for, or did.")


class PlanSummary(_Model):
    nodes: int = Field(0, description="Nodes this object selects.")
    gpus: int = Field(0, description="GPUs on them.")
    gpus_needed_now: int = Field(
        0, alias="gpusNeededNow", description="Fewest GPUs the current layouts hold the demand on."
    )
    gpus_needed_planned: int = Field(
        0,
        alias="gpusNeededPlanned",
        description="Fewest GPUs the planned layouts hold the demand on.",
    )
    gpus_free: int = Field(
        0,
        alias="gpusFree",
        description="GPUs the demand does not need once the plan is applied.",
    )
    pods_to_move: int = Field(
        0, alias="podsToMove", description="GPU pods the plan's drains evict."
    )
    demand: dict[str, int] = Field(
        default_factory=dict,
        description=(
            "Slices the fleet needs, by product/slice: running and pending GPU pods, "
            "WorkloadSizings' recommendations waiting for free capacity and workloads at zero, "
            "plus spareSlices."
        ),
    )
    unmet: dict[str, int] = Field(
        default_factory=dict,
        description="Demand no allowed layout of the selected nodes can hold.",
    )


class GPUPartitioningStatus(_Model):
    observed_generation: int | None = Field(
        None, alias="observedGeneration", description="Spec generation last acted on."
    )
    summary: PlanSummary | None = Field(None, description="The plan in numbers.")
    nodes: list[NodePlan] = Field(
        default_factory=list, description="Per selected node: layout now, proposed, and step."
    )
    conditions: list[Condition] = Field(default_factory=list, description="Current state.")


class GPUPartitioning(_Model):
    """The whole object, for validating what the API server hands us."""

    model_config = ConfigDict(extra="ignore")

    spec: GPUPartitioningSpec
    status: GPUPartitioningStatus = Field(default_factory=GPUPartitioningStatus)


REPARTITION_ANNOTATION = f"{GROUP}/repartition"
"""On a node being re-partitioned: the record below, so a restarted operator resumes the
node's step instead of starting a second drain."""


class RepartitionRecord(Record):
    """One node's re-partition, from cordon to uncordon."""

    partitioning: str = Field(description="The GPUPartitioning that started it.")
    step: NodeStep
    from_config: str = Field(alias="from", description="The mig.config label before.")
    to_config: str = Field(alias="to", description="The mig.config label it is moving to.")
    layout: list[str] = Field(
        default_factory=list,
        description="Per GPU, what `to` holds (as the status writes layouts), so the config can "
        "be written again if it went missing.",
    )
    cordoned: bool = Field(description="Whether this re-partition cordoned the node.")
    started: str = Field(description="RFC 3339 time the node was cordoned.")
    configure_started: str | None = Field(
        None, alias="configureStarted", description="When the label was set (or restored)."
    )
    message: str = ""


REPARTITION_FAILURE_ANNOTATION = f"{GROUP}/repartition-failure"
"""On a node whose last re-partition did not finish: why, so the planner leaves the node alone
for a while (restarts included) and the status keeps saying why."""


class RepartitionFailure(Record):
    """Why a node's last re-partition did not finish, and when."""

    reason: str = Field(description="The Partitioned condition's reason for it.")
    config: str = Field(description="The config that was not applied.")
    time: str = Field(description="RFC 3339 time it ended.")
    message: str = ""
