"""What `gpusizer run` is told: the operator's settings, and the periods derived from them.

Plain data, imported by the command line before anything heavy is.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Between two full reads (a sync period) a read asks only for the pods that moved: a load change
# is acted on within a read period of its scrape, for a little more Prometheus and operator CPU
# than reading once per sync period (bench/README.md, "Side by side at 5,000").
DEFAULT_READ_PERIOD_SECONDS = 2.0
# A workload whose last turn found nothing that time alone could change waits up to this many
# sync periods for its next turn while nothing it reads changes (fleet.py), within this long: the
# turns of unchanged workloads held the operator's core at 10,000 (bench/README.md, "Issue 29").
QUIET_SYNC_PERIODS = 4
QUIET_WAIT_SECONDS = 60.0
# Where the GPU Operator's mig-manager reads its mig-parted configs when ClusterPolicy's
# migManager.config.name points at a ConfigMap of the user's (docs/partitioning.md).
DEFAULT_MIG_CONFIG_MAP = "gpu-operator/custom-mig-parted-config"


@dataclass(frozen=True)
class PrometheusSettings:
    url: str
    timeout_seconds: float = 10.0
    bearer_token_file: str | None = None
    ca_file: str | None = None
    insecure_skip_verify: bool = False
    basic_auth: tuple[str, str] | None = None


@dataclass(frozen=True)
class Tenancy:
    """How far the PromQL in a WorkloadSizing may see."""

    label: str = "namespace"
    allow_cross_namespace: bool = False


def read_period_seconds(read_period: float | None, sync_period: float) -> float:
    """`--read-period`, or its default (DEFAULT_READ_PERIOD_SECONDS, or the sync period when
    that is shorter); ValueError naming both flags when it is not in (0, sync period]: a read
    less often than the decisions would leave them nothing new."""
    if read_period is None:
        read_period = min(DEFAULT_READ_PERIOD_SECONDS, sync_period)
    if not 0 < read_period <= sync_period:
        raise ValueError(
            f"--read-period ({read_period:g}) must be above 0 and at most "
            f"--sync-period ({sync_period:g})"
        )
    return read_period


@dataclass(frozen=True)
class OperatorSettings:
    prometheus: PrometheusSettings
    tenancy: Tenancy = field(default_factory=Tenancy)
    sync_period_seconds: float = 15.0
    read_period_seconds: float | None = None  # at most the sync period; None: the default
    metrics_port: int = 8080
    peering: str | None = None  # a kopf peering name; None runs standalone
    # with a peering: the Lease (namespace, name) whose holder acts (`charge`), and the
    # namespace of a KopfPeering (None: the ClusterKopfPeering of a cluster-wide operator)
    lease: tuple[str, str] | None = None
    peering_namespace: str | None = None
    catalog_file: str | None = None
    rightsizing_period_seconds: float = 60.0
    reshape_deadline_seconds: float = 600.0
    min_reshape_interval_seconds: float = 3600.0
    activator_service: tuple[str, str] | None = None  # namespace, name; None: none installed
    partitioning: bool = True  # GPUPartitionings served: only cluster-wide, as they drain nodes
    mig_config_map: str = DEFAULT_MIG_CONFIG_MAP  # namespace/name
    # mig-manager reads the ConfigMap from a mounted file, which the kubelet refreshes about a
    # minute after a change: a label set sooner could name a config it does not have yet
    mig_config_settle_seconds: float = 60.0
    prediction_tolerance: float = 0.2  # a move whose measured throughput misses by more: Event

    @property
    def read_period(self) -> float:
        return read_period_seconds(self.read_period_seconds, self.sync_period_seconds)

    @property
    def once_per_sync_period(self) -> float:
        """The age at which what is done once per sync period (a full read, the HPA list) is
        done again: at the read nearest the period's end."""
        return self.sync_period_seconds - self.read_period / 2

    @property
    def max_accounted_gap_seconds(self) -> float:
        """The longest time between two turns of a workload that the savings ledger counts:
        longer, another replica was in charge or this one was stopped (`ledger.held`)."""
        return max(120.0, 4 * self.sync_period_seconds)

    @property
    def ledger_period_seconds(self) -> float:
        """How often every workload's savings ledger is read back: ten minutes, or the
        right-sizing period if longer. Its windows (a day, a week) move by well under 1 % in
        that time, and each read takes the increase of every workload's counters over days of
        samples, which Prometheus would otherwise evaluate at every right-sizing period."""
        return max(600.0, self.rightsizing_period_seconds)

    @property
    def outage_grace_seconds(self) -> float:
        """How long Prometheus may answer nothing before every workload's status says so:
        twenty sync periods (5 minutes at the default, when GpusizerPrometheusUnavailable
        fires), so a restart or a flap costs no status write per workload; the fleet-wide
        signals say it at once (docs/operations.md)."""
        return 20 * self.sync_period_seconds

    @property
    def outage_spread_seconds(self) -> float:
        """Over how long, at least, the workloads' statuses follow either end of an outage."""
        return 4 * self.sync_period_seconds

    @property
    def decide_every(self) -> int:
        """Reads per sync period: an unchanged workload decides on every this many."""
        return int(self.sync_period_seconds // self.read_period)

    @property
    def quiet_every(self) -> int:
        """The most sync periods between two turns of a quiet workload (fleet.py):
        QUIET_SYNC_PERIODS, or as many as fit in QUIET_WAIT_SECONDS, so that a status refresh
        and the figures and accounting each turn updates keep about their pace."""
        fit = int(QUIET_WAIT_SECONDS // self.sync_period_seconds)
        return max(1, min(QUIET_SYNC_PERIODS, fit))
