"""Condition types, reasons and event reasons: the one place they are spelled.

Users alert on these strings and the docs explain them, so they never appear as literals
anywhere else.
"""

from enum import StrEnum


class ConditionType(StrEnum):
    READY = "Ready"
    METRICS_AVAILABLE = "MetricsAvailable"
    SCALED_TO_ZERO = "ScaledToZero"
    SCALING_LIMITED = "ScalingLimited"
    RIGHT_SIZED = "RightSized"
    PARTITIONED = "Partitioned"


class Reason(StrEnum):
    # replica decisions
    WITHIN_TOLERANCE = "WithinTolerance"
    SCALE_UP = "ScaleUp"
    SCALE_DOWN = "ScaleDown"
    SCALE_TO_ZERO = "ScaleToZero"
    WAKE = "Wake"
    STAYING_AT_ZERO = "StayingAtZero"
    HOLDING_ON_UNKNOWN_METRICS = "HoldingOnUnknownMetrics"
    WAITING_FOR_STARTING_REPLICAS = "WaitingForStartingReplicas"
    PRE_WARM = "PreWarm"
    # limits
    NOT_LIMITED = "NotLimited"
    AT_MAX = "AtMaxReplicas"
    AT_MIN = "AtMinReplicas"
    STEP_LIMIT = "StepLimit"
    STABILIZATION_WINDOW = "StabilizationWindow"
    RECURRING_SHORTFALL = "RecurringShortfall"
    # metrics
    METRICS_OK = "MetricsOK"
    PROMETHEUS_UNREACHABLE = "PrometheusUnreachable"
    PROMETHEUS_UNAUTHORIZED = "PrometheusUnauthorized"
    QUERY_RESTRICTED = "QueryRestricted"
    QUERY_ERROR = "QueryError"
    NO_SAMPLES = "NoSamples"
    STALE_SAMPLES = "StaleSamples"
    INVALID_VALUE = "InvalidValue"
    PARTIAL_SAMPLES = "PartialSamples"
    NO_READY_PODS = "NoReadyPods"
    # target and control
    ACTING = "Acting"
    RECOMMEND_ONLY = "RecommendOnly"
    MODE_OFF = "ModeOff"
    PAUSED = "Paused"
    TARGET_NOT_FOUND = "TargetNotFound"
    TARGET_NOT_SCALABLE = "TargetNotScalable"
    CONFLICTING_AUTOSCALER = "ConflictingAutoscaler"
    AUTOSCALER_CHECK_FAILED = "AutoscalerCheckFailed"
    INVALID_SPEC = "InvalidSpec"
    SCALE_FAILED = "ScaleFailed"
    OUT_OF_MEMORY = "OutOfMemory"
    IDLE = "Idle"
    ACTIVE = "Active"
    # right-sizing
    RIGHT_SIZED = "RightSized"
    CHEAPER_SLICE = "CheaperSlice"
    SAVING_TOO_SMALL = "SavingTooSmall"
    NO_MEASUREMENT = "NoMeasurement"
    NO_FITTING_SLICE = "NoFittingSlice"
    NO_FREE_CAPACITY = "NoFreeCapacity"
    LOW_CONFIDENCE = "LowConfidence"
    TOO_SOON = "TooSoon"
    UNKNOWN_SLICE = "UnknownSlice"
    RESHAPING = "Reshaping"
    RESHAPE_ROLLED_BACK = "ReshapeRolledBack"
    # activator
    NO_ACTIVATOR = "NoActivator"
    ACTIVATOR_ROUTE_FAILED = "ActivatorRouteFailed"
    # GPU partitioning: what keeps a GPUPartitioning from moving anything (Ready)
    MIG_CONFIG_UNAVAILABLE = "MigConfigUnavailable"
    MIG_CONFIG_EDITED = "MigConfigEdited"
    NODE_NOT_LABELLED = "NodeNotLabelled"
    NODE_SELECTED_TWICE = "NodeSelectedTwice"
    LAYOUT_NOT_SUPPORTED = "LayoutNotSupported"
    # GPU partitioning: the layouts (Partitioned)
    LAYOUTS_HOLD_DEMAND = "LayoutsHoldDemand"
    PLAN_PENDING = "PlanPending"
    REPARTITIONING = "Repartitioning"
    DRAIN_BLOCKED = "DrainBlocked"
    DRAIN_TIMED_OUT = "DrainTimedOut"
    MIG_CONFIG_FAILED = "MigConfigFailed"
    ROLLBACK_FAILED = "RollbackFailed"
    LABEL_CHANGED_UNDER_PLAN = "LabelChangedUnderPlan"
    DEMAND_UNMET = "DemandUnmet"


class EventReason(StrEnum):
    SCALED = "Scaled"
    SCALED_TO_ZERO = "ScaledToZero"
    WOKE = "Woke"
    METRICS_UNAVAILABLE = "MetricsUnavailable"
    METRICS_RECOVERED = "MetricsRecovered"
    QUERY_RESTRICTED = "QueryRestricted"
    TARGET_NOT_FOUND = "TargetNotFound"
    CONFLICTING_AUTOSCALER = "ConflictingAutoscaler"
    INVALID_SPEC = "InvalidSpec"
    SCALE_FAILED = "ScaleFailed"
    PAUSED = "Paused"
    OUT_OF_MEMORY = "OutOfMemory"
    RESHAPE_STARTED = "ReshapeStarted"
    RESHAPED = "Reshaped"
    RESHAPE_ROLLED_BACK = "ReshapeRolledBack"
    ACTIVATOR_ROUTE_FAILED = "ActivatorRouteFailed"
    PARTITIONING_BLOCKED = "PartitioningBlocked"
    REPARTITION_STARTED = "RepartitionStarted"
    REPARTITIONED = "Repartitioned"
    REPARTITION_ROLLED_BACK = "RepartitionRolledBack"
    DRAIN_BLOCKED = "DrainBlocked"
    DRAIN_TIMED_OUT = "DrainTimedOut"
    REPARTITION_ABANDONED = "RepartitionAbandoned"
    ROLLBACK_FAILED = "RollbackFailed"
