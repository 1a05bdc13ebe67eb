"""WorkloadSizing v1alpha1: the single source of the CRD schema, the operator and the simulator.

Field names (the aliases) are the product's interface; Python attribute names are snake_case.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

GROUP = "gpusizer.io"
VERSION = "v1alpha1"
KIND = "WorkloadSizing"
PLURAL = "workloadsizings"
SINGULAR = "workloadsizing"
SHORT_NAMES = ["wls"]

Percent = Annotated[float, Field(ge=0, le=100)]


class _Model(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="forbid", frozen=True)


def cel(rule: str, message: str, field_path: str | None = None) -> dict[str, Any]:
    """One x-kubernetes-validations entry; the API server reports `message` at `field_path`."""
    entry: dict[str, Any] = {"rule": rule, "message": message}
    if field_path:
        entry["fieldPath"] = field_path
    return entry


class Mode(StrEnum):
    AUTO = "Auto"
    RECOMMEND = "Recommend"
    OFF = "Off"


class Server(StrEnum):
    VLLM = "vllm"
    TRITON = "triton"
    TGI = "tgi"
    SGLANG = "sglang"
    NONE = "none"


class TargetRef(_Model):
    api_version: str = Field(
        "apps/v1",
        alias="apiVersion",
        min_length=1,
        description="API version of the scaled object, e.g. apps/v1.",
    )
    kind: str = Field(
        "Deployment",
        min_length=1,
        description="Kind of the scaled object; anything with a /scale subresource works.",
    )
    name: str = Field(
        min_length=1,
        max_length=253,
        description="Name of the scaled object, in the WorkloadSizing's namespace.",
    )


class ScalingRules(_Model):
    stabilization_window_seconds: int = Field(
        alias="stabilizationWindowSeconds",
        ge=0,
        le=3600,
        description=(
            "Look back this long and act on the most conservative recommendation of the window "
            "(the highest for scale-down, the lowest for scale-up)."
        ),
    )
    max_replicas_per_step: int = Field(
        alias="maxReplicasPerStep",
        ge=1,
        description="At most this many replicas added (or removed) per periodSeconds.",
    )
    period_seconds: int = Field(
        15,
        alias="periodSeconds",
        ge=1,
        le=1800,
        description="Length of the window over which maxReplicasPerStep applies.",
    )


def _default_scale_up() -> ScalingRules:
    return ScalingRules(stabilization_window_seconds=0, max_replicas_per_step=4, period_seconds=15)


def _default_scale_down() -> ScalingRules:
    return ScalingRules(
        stabilization_window_seconds=120, max_replicas_per_step=2, period_seconds=15
    )


class ReplicasSpec(_Model):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel("self.min <= self.max", "replicas.min must be <= replicas.max", ".min"),
                cel(
                    "has(self.targetGPUUtilization) || has(self.targetQueuePerReplica) "
                    "|| has(self.targetKVCacheUsage)",
                    "set at least one scaling signal: replicas.targetGPUUtilization, "
                    "replicas.targetQueuePerReplica or replicas.targetKVCacheUsage",
                ),
            ]
        }
    )

    minimum: int = Field(
        1,
        alias="min",
        ge=0,
        le=10000,
        description="Fewest replicas; 0 is allowed only with scaleToZero.enabled.",
    )
    maximum: int = Field(
        alias="max", ge=1, le=10000, description="Most replicas the operator will ever set."
    )
    target_gpu_utilization: float | None = Field(
        None,
        alias="targetGPUUtilization",
        gt=0,
        le=100,
        description=(
            "Percent busy to hold per replica: DCGM_FI_DEV_GPU_UTIL on whole GPUs, "
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE x 100 on MIG slices."
        ),
    )
    target_queue_per_replica: float | None = Field(
        None,
        alias="targetQueuePerReplica",
        gt=0,
        description="Waiting requests per replica to hold (the server's queue-depth gauge).",
    )
    target_kv_cache_usage: float | None = Field(
        None,
        alias="targetKVCacheUsage",
        gt=0,
        le=100,
        description=(
            "Percent of the KV cache in use to hold per replica (vllm:kv_cache_usage_perc x "
            "100). GPU utilisation saturates with one request in flight; the KV cache fills "
            "with the batch, so it shows load before a queue forms."
        ),
    )
    tolerance: float = Field(
        0.1,
        ge=0,
        lt=1,
        description="No change while |observed/target - 1| is within this fraction.",
    )
    scale_up: ScalingRules = Field(
        default_factory=_default_scale_up,
        alias="scaleUp",
        description="How fast replicas are added.",
    )
    scale_down: ScalingRules = Field(
        default_factory=_default_scale_down,
        alias="scaleDown",
        description=(
            "How fast replicas are removed. The default window (120 s) is about one GPU "
            "start-up: holding an idle replica longer than it takes to get one back does not "
            "pay; set it to your start-up time if yours is longer."
        ),
    )

    @model_validator(mode="after")
    def _bounds_and_signal(self) -> ReplicasSpec:
        if self.minimum > self.maximum:
            raise ValueError("replicas.min must be <= replicas.max")
        if (
            self.target_gpu_utilization is None
            and self.target_queue_per_replica is None
            and self.target_kv_cache_usage is None
        ):
            raise ValueError(
                "set at least one scaling signal: replicas.targetGPUUtilization, "
                "replicas.targetQueuePerReplica or replicas.targetKVCacheUsage"
            )
        return self


# The activator's ports for workloads, one per workload: the operator hands them out, the
# activator listens on them, and a workload Service's EndpointSlice names one (docs/concepts.md).
ACTIVATOR_PORTS = range(20000, 30000)

DNS_LABEL_OR_EMPTY = r"^([a-z]([-a-z0-9]*[a-z0-9])?)?$"
# the most metrics.maxSampleAgeSeconds may be: a sample older than this serves no workload
MAX_SAMPLE_AGE_SECONDS = 3600


class ActivatorSpec(_Model):
    enabled: bool = Field(
        False,
        description=(
            "While the workload has no ready replica, point its Service at gpusizer's "
            "activator, which holds each request, wakes the workload at once and forwards the "
            "requests in arrival order when a replica is ready. No wakeQuery is needed then."
        ),
    )
    service: str = Field(
        "",
        max_length=63,
        pattern=DNS_LABEL_OR_EMPTY,
        description="The workload's Service, in this namespace; default: the target's name.",
    )
    port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="The Service's port whose traffic is held; default: its only port.",
    )
    max_pending_requests: int = Field(
        1000,
        alias="maxPendingRequests",
        ge=1,
        le=100000,
        description=(
            "Requests each activator replica holds for this workload at most; the next one "
            "is answered 503 with Retry-After."
        ),
    )
    hold_timeout_seconds: int = Field(
        600,
        alias="holdTimeoutSeconds",
        ge=1,
        le=3600,
        description=(
            "How long a request is held for a ready replica before it is answered 504 with "
            "Retry-After. The default covers a GPU cold start of several minutes."
        ),
    )


class ScaleToZeroSpec(_Model):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!self.enabled || size(self.wakeQuery) > 0 "
                    "|| (has(self.activator) && self.activator.enabled)",
                    "scaleToZero.wakeQuery or scaleToZero.activator.enabled is required when "
                    "scaleToZero.enabled: at zero replicas nothing else shows demand",
                    ".wakeQuery",
                )
            ]
        }
    )

    enabled: bool = Field(False, description="Scale to zero when idle, and back on demand.")
    idle_seconds: int = Field(
        600,
        alias="idleSeconds",
        ge=0,
        description=(
            "Idle this long (no queue, utilisation under idleUtilization) before zero. With "
            "maxColdStartPercent, used only until enough idle gaps have been seen to learn one."
        ),
    )
    max_cold_start_percent: float | None = Field(
        None,
        alias="maxColdStartPercent",
        gt=0,
        le=100,
        description=(
            "Budget for the share of requests that may meet a cold start (arrive while no "
            "replica is ready). When set, how long to stay warm is learned from the workload's "
            "idle gaps, the requests that followed them and its measured start-up, as the "
            "cheapest idle time that keeps to the budget (shown in status.learned)."
        ),
    )
    pre_warm: bool = Field(
        False,
        alias="preWarm",
        description=(
            "Start one replica a start-up ahead of a return from idle that recurred at this "
            "time of day on most of the last seven days, or at this time of week in each of "
            "the last two weeks; and do not scale to zero just before one. Off by default: on "
            "the replayed traces it bought attainment at more GPU-hours than a longer idle "
            "time does (bench/README.md)."
        ),
    )
    idle_utilization: float = Field(
        5,
        alias="idleUtilization",
        ge=0,
        le=100,
        description="Utilisation percent under which a replica counts as idle.",
    )
    wake_query: str = Field(
        "",
        alias="wakeQuery",
        max_length=4096,
        description=(
            "PromQL returning the demand waiting outside the pods (e.g. a gateway's pending "
            "requests); a scalar or a one-element vector."
        ),
    )
    wake_threshold: float = Field(
        0,
        alias="wakeThreshold",
        ge=0,
        description=(
            "Wake when the demand (the wake query plus the requests the activator holds) is "
            "strictly above this."
        ),
    )
    activator: ActivatorSpec = Field(
        default_factory=ActivatorSpec,
        description="Hold the requests that arrive while the workload has no ready replica.",
    )

    @model_validator(mode="after")
    def _wake_signal_when_enabled(self) -> ScaleToZeroSpec:
        if self.enabled and not self.wake_query and not self.activator.enabled:
            raise ValueError(
                "scaleToZero.wakeQuery or scaleToZero.activator.enabled is required when "
                "scaleToZero.enabled"
            )
        return self


class MetricsSpec(_Model):
    server: Server = Field(
        Server.VLLM,
        description="Inference server; picks the default queue-depth series.",
    )
    queue_query: str = Field(
        "",
        alias="queueQuery",
        max_length=4096,
        description="PromQL overriding the server's queue series; summed per pod.",
    )
    max_sample_age_seconds: int = Field(
        90,
        alias="maxSampleAgeSeconds",
        ge=1,
        le=MAX_SAMPLE_AGE_SECONDS,
        description="Samples older than this count as missing.",
    )


class RightSizingSpec(_Model):
    mode: Mode = Field(
        Mode.RECOMMEND,
        description="Off, Recommend (report the better slice) or Auto (move the workload).",
    )
    allowed_slices: list[Annotated[str, Field(max_length=64)]] = Field(
        default_factory=list,
        alias="allowedSlices",
        max_length=64,
        description="Optional allow-list of slices, e.g. mig-3g.40gb, gpu-l4.",
    )
    memory_headroom_percent: float = Field(
        15,
        alias="memoryHeadroomPercent",
        ge=0,
        le=200,
        description="Added to the measured peak GPU memory before choosing a slice.",
    )
    history_seconds: int = Field(
        3600,
        alias="historySeconds",
        ge=60,
        le=30 * 86400,
        description="How much measured history a recommendation is based on.",
    )
    min_savings_percent: float = Field(
        15,
        alias="minSavingsPercent",
        ge=0,
        le=100,
        description="Do not move for a smaller saving than this.",
    )


class WorkloadSizingSpec(_Model):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "self.replicas.min > 0 || (has(self.scaleToZero) && self.scaleToZero.enabled)",
                    "replicas.min: 0 requires scaleToZero.enabled",
                    ".replicas.min",
                )
            ]
        }
    )

    target_ref: TargetRef = Field(alias="targetRef", description="The workload to size.")
    container: str | None = Field(
        None,
        max_length=253,
        description="Container to size; default: the container that requests GPUs.",
    )
    mode: Mode = Field(
        Mode.AUTO,
        description="Auto changes replicas; Recommend computes and reports only; Off does nothing.",
    )
    replicas: ReplicasSpec = Field(description="Replica bounds, targets and rate limits.")
    scale_to_zero: ScaleToZeroSpec = Field(
        default_factory=ScaleToZeroSpec,
        alias="scaleToZero",
        description="Scale to zero when idle and back when demand appears.",
    )
    metrics: MetricsSpec = Field(
        default_factory=MetricsSpec, description="Where the signals come from."
    )
    right_sizing: RightSizingSpec = Field(
        default_factory=RightSizingSpec,
        alias="rightSizing",
        description="Choice of MIG slice or GPU type.",
    )

    @model_validator(mode="after")
    def _zero_needs_scale_to_zero(self) -> WorkloadSizingSpec:
        if self.replicas.minimum == 0 and not self.scale_to_zero.enabled:
            raise ValueError("replicas.min: 0 requires scaleToZero.enabled")
        return self


class Observation(_Model):
    gpu_utilization: float | None = Field(
        None, alias="gpuUtilization", description="Mean GPU utilisation percent of ready pods."
    )
    queue_per_replica: float | None = Field(
        None, alias="queuePerReplica", description="Waiting requests per ready replica."
    )
    memory_peak_mib: float | None = Field(
        None, alias="memoryPeakMiB", description="Highest GPU memory used by a pod, MiB."
    )
    sample_age_seconds: float | None = Field(
        None, alias="sampleAgeSeconds", description="Age of the oldest sample used."
    )
    time: str | None = Field(None, description="When the observation was made.")


class Recommendation(_Model):
    slice: str | None = Field(None, description="Recommended slice, e.g. mig-3g.40gb.")
    resource: str | None = Field(None, description="Its extended resource name.")
    node_selector: dict[str, str] = Field(
        default_factory=dict, alias="nodeSelector", description="Node selector for the slice."
    )
    replicas: int | None = Field(None, description="Replicas needed on the slice.")
    cost_per_hour: float | None = Field(
        None, alias="costPerHour", description="Cost per hour on the slice."
    )
    current_cost_per_hour: float | None = Field(
        None, alias="currentCostPerHour", description="Cost per hour now."
    )
    reason: str | None = Field(None, description="What the recommendation is based on.")
    throughput: str | None = Field(
        None,
        description="Measured when the throughput of the recommended slice against the current "
        "one was measured on this workload (or one with the same image, command and "
        "arguments); Estimated when it comes from the GPU catalog.",
    )
    after: ResultCosts | None = Field(
        None,
        description="Estimated cost and energy per result on the recommended slice, for the "
        "requests measured now.",
    )


class ResultCosts(_Model):
    """What a result costs, in the GPU catalog's currency and kWh."""

    cost_per_1k_requests: float | None = Field(
        None, alias="costPer1kRequests", description="Cost per 1,000 requests served."
    )
    cost_per_million_output_tokens: float | None = Field(
        None,
        alias="costPerMillionOutputTokens",
        description="Cost per million output (generated) tokens.",
    )
    kwh_per_1k_requests: float | None = Field(
        None, alias="kWhPer1kRequests", description="GPU energy per 1,000 requests, kWh."
    )
    kwh_per_million_output_tokens: float | None = Field(
        None,
        alias="kWhPerMillionOutputTokens",
        description="GPU energy per million output tokens, kWh.",
    )
    output_tokens_per_second_per_cost_per_hour: float | None = Field(
        None,
        alias="outputTokensPerSecondPerCostPerHour",
        description="Output tokens per second for each unit of cost per hour.",
    )


class Efficiency(ResultCosts):
    """Measured over the right-sizing window, on the pods serving now: each figure is
    measured or absent, never estimated."""

    window_seconds: int | None = Field(
        None, alias="windowSeconds", description="The window measured (rightSizing.historySeconds)."
    )
    requests: float | None = Field(None, description="Requests served in the window.")
    output_tokens: float | None = Field(
        None, alias="outputTokens", description="Output tokens generated in the window."
    )
    power_watts: float | None = Field(
        None,
        alias="powerWatts",
        description="Mean GPU power of the serving pods, W: a MIG slice's share of its GPU's.",
    )
    currency: str | None = Field(None, description="Currency of the costs (the GPU catalog's).")
    unknown: str | None = Field(
        None, description="Why a figure is absent: the series or counter that was missing."
    )
    time: str | None = Field(None, description="When the window ended.")


class SliceThroughput(_Model):
    """What one fully busy replica served on a slice, as measured."""

    slice: str = Field(description="The slice, e.g. mig-3g.40gb.")
    product: str = Field(description="The GPU product key in the catalog, e.g. h100-80gb.")
    fingerprint: str = Field(
        description="Hash of the GPU container's image, command and arguments: workloads with "
        "the same one share their measurements."
    )
    requests_per_second: float = Field(
        alias="requestsPerSecond", ge=0, description="Requests per second per busy replica."
    )
    output_tokens_per_second: float | None = Field(
        None,
        alias="outputTokensPerSecond",
        ge=0,
        description="Output tokens per second per busy replica, when the server counts them.",
    )
    utilization: float = Field(ge=0, le=100, description="Mean utilisation it was measured at.")
    time: str = Field(description="When it was measured.")


class Condition(_Model):
    type: str = Field(description="Condition type.")
    status: str = Field(description="True, False or Unknown.")
    reason: str = Field(description="CamelCase reason.")
    message: str = Field("", description="Human-readable detail.")
    last_transition_time: str = Field(
        alias="lastTransitionTime", description="When the status last changed."
    )
    observed_generation: int | None = Field(
        None, alias="observedGeneration", description="Spec generation this reflects."
    )


class RecommendationSample(_Model):
    time: str = Field(
        description="When the replica count was last recommended; for the last entry, the "
        "run still going on, when it began."
    )
    replicas: int = Field(ge=0, description="The recommended replica count.")


class ScaleEvent(_Model):
    time: str = Field(description="When the operator changed the replica count.")
    from_replicas: int = Field(alias="fromReplicas", ge=0, description="Replicas before.")
    to_replicas: int = Field(alias="toReplicas", ge=0, description="Replicas after.")


class LearnedStatus(_Model):
    """What the policy learned from the workload; persisted so a restart keeps it."""

    startup_seconds: float | None = Field(
        None,
        alias="startupSeconds",
        description="Measured time from a pod's creation to Ready (the latest seen).",
    )
    idle_seconds: list[float] | None = Field(
        None,
        alias="idleSeconds",
        description="Idle time before zero learned for scaleToZero.maxColdStartPercent, per "
        "8-hour block (UTC) of a weekday (the first three) and of a weekend day (the last three).",
    )
    cold_start_percent: float | None = Field(
        None,
        alias="coldStartPercent",
        description="Share of requests meeting a cold start at the learned idle times, as "
        "estimated from the gaps seen.",
    )
    requests: float = Field(0, ge=0, description="Requests counted (decayed, half-life 7 d).")
    cold_requests: float = Field(
        0,
        alias="coldRequests",
        ge=0,
        description="Of those, the ones that met a cold start (decayed alike).",
    )
    head_cold: bool = Field(
        False, alias="headCold", description="The gap that just ended found no replica ready."
    )
    gaps: list[list[float]] = Field(
        default_factory=list,
        description="Idle gaps seen: [block, lower edge of the length bin (s), count, seconds, "
        "requests in the start-up after them], decayed like requests.",
    )
    idle_since: str | None = Field(
        None, alias="idleSince", description="When the running idle gap began."
    )
    head_until: str | None = Field(
        None,
        alias="headUntil",
        description="Until when arriving requests count against the gap that just ended.",
    )
    head_cell: int | None = Field(
        None, alias="headCell", description="The block and bin of the gap that just ended."
    )
    onsets: list[str] = Field(
        default_factory=list,
        description="Returns from idle after a gap longer than a start-up, last 15 days.",
    )
    decayed_at: str | None = Field(
        None, alias="decayedAt", description="When the gap counts were last decayed."
    )
    learned_at: str | None = Field(
        None, alias="learnedAt", description="When the idle times were last derived."
    )
    learned_budget: float | None = Field(
        None, alias="learnedBudget", description="The budget they were derived for."
    )


class Routing(StrEnum):
    ACTIVATOR = "Activator"  # the Service's traffic goes to the activator
    DIRECT = "Direct"  # the Service's traffic goes to the workload's pods only


class ActivatorStatus(_Model):
    port: int | None = Field(
        None, description="The activator's port for this workload, given out by the operator."
    )
    service_port: str | None = Field(
        None,
        alias="servicePort",
        description="The name of the Service's port the activator holds, as its EndpointSlices "
        "give it: the activator forwards to the ready pods' port of that name.",
    )
    routing: Routing | None = Field(
        None,
        description=(
            "Activator: the Service's traffic goes to the activator (no replica is ready); "
            "Direct: to the workload's pods only."
        ),
    )
    pending_requests: int | None = Field(
        None,
        alias="pendingRequests",
        description="Requests the activator replicas hold for this workload, as they last said.",
    )
    last_wake_seconds: float | None = Field(
        None,
        alias="lastWakeSeconds",
        description="At the last wake: seconds from the first request held to the /scale write.",
    )
    last_wake_time: str | None = Field(
        None, alias="lastWakeTime", description="When the operator last woke the workload."
    )


class WorkloadSizingStatus(_Model):
    observed_generation: int | None = Field(
        None, alias="observedGeneration", description="Spec generation last acted on."
    )
    current_replicas: int | None = Field(
        None, alias="currentReplicas", description="Replicas the target has."
    )
    desired_replicas: int | None = Field(
        None, alias="desiredReplicas", description="Replicas the operator wants."
    )
    observation: Observation | None = Field(None, description="What the signals showed.")
    last_scale_time: str | None = Field(
        None, alias="lastScaleTime", description="When replicas were last changed."
    )
    last_active_time: str | None = Field(
        None,
        alias="lastActiveTime",
        description="Last time the workload was not idle: exact while it is idle, refreshed about "
        "once a minute while it is active (less often past 600 workloads: see status writes).",
    )
    recommendation: Recommendation | None = Field(None, description="Right-sizing advice.")
    efficiency: Efficiency | None = Field(
        None, description="What a result costs, measured over the right-sizing window."
    )
    measured_throughput: list[SliceThroughput] = Field(
        default_factory=list,
        alias="measuredThroughput",
        max_length=16,
        description="Throughput measured on each slice the workload has run on; it replaces the "
        "catalog's estimate for a pair of slices both measured.",
    )
    conditions: list[Condition] = Field(default_factory=list, description="Current state.")
    recommendations: list[RecommendationSample] = Field(
        default_factory=list,
        description="Recent replica recommendations, kept for the stabilisation windows.",
    )
    scale_events: list[ScaleEvent] = Field(
        default_factory=list,
        alias="scaleEvents",
        description=(
            "Replica changes of the last hour, kept for the per-period step limits and the "
            "recurring-shortfall hold."
        ),
    )
    learned: LearnedStatus | None = Field(
        None, description="Start-up, idle gaps and returns from idle learned from the workload."
    )
    activator: ActivatorStatus | None = Field(
        None, description="The activator's part: its port, the routing, the requests held."
    )


class WorkloadSizing(_Model):
    """The whole object, for validating what the API server hands us."""

    model_config = ConfigDict(extra="ignore")

    api_version: str = Field(f"{GROUP}/{VERSION}", alias="apiVersion")
    kind: str = KIND
    spec: WorkloadSizingSpec
    status: WorkloadSizingStatus = Field(default_factory=WorkloadSizingStatus)
