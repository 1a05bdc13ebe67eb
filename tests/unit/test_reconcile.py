"""One turn of a WorkloadSizing, every branch: what ends the turn, what the mode and a pause
hold back, what a write that fails says, and right-sizing's moves and rollbacks. Each row is
the state in and the decision out (Ready's reason, the Events, the writes), run through the
in-memory ports."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import pytest
from gpusizer.activation import ActivatorRoute, RouteProblem
from gpusizer.actuate.target_view import (
    ScaleConflict,
    TargetNotScalable,
    TargetProblem,
    TargetUnanswered,
    TargetView,
)
from gpusizer.api.annotations import (
    PAUSE_ANNOTATION,
    RESHAPE_ANNOTATION,
    HeldRecord,
    Placement,
    Prediction,
    ReshapeRecord,
    ReshapeState,
    held_key,
)
from gpusizer.api.v1alpha1 import Server
from gpusizer.clock import Cycle
from gpusizer.cluster import ClusterView
from gpusizer.memory import Memory
from gpusizer.reconcile import reconcile
from gpusizer.report.turn import Outcome
from gpusizer.signals.autoscalers import owners_by_target
from gpusizer.signals.discovery import NodeInfo
from gpusizer.signals.parse import LabelledValue, PodSamples, Problem, Sample
from gpusizer.signals.pods import PodInfo
from gpusizer.signals.queries import GPU_UTIL, MEMORY, MIG_UTIL, queue_signal
from gpusizer.signals.snapshot import Snapshot
from gpusizer.timefmt import iso, iso_millis
from gpusizer.vocabulary import ConditionType, Reason

from tests.fakes import FakeMetrics, FakeRoutes, FakeTargets, services, workload

NOW = 1_800_000_000.0
NS = "llm"
H100 = "NVIDIA-H100-80GB-HBM3"
NODE = NodeInfo("gpu-a", H100, {"nvidia.com/gpu": 8, "nvidia.com/mig-3g.40gb": 8}, True)
DOWN = Problem(Reason.PROMETHEUS_UNREACHABLE, "http://prometheus:9090: connection refused")


def spec(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "targetRef": {"name": "chat"},
        "mode": "Auto",
        "replicas": {"min": 1, "max": 8, "targetGPUUtilization": 70},
        "rightSizing": {"mode": "Off"},
    }
    for key, value in overrides.items():
        base[key] = {**base.get(key, {}), **value} if isinstance(value, dict) else value
    return base


def pod(name: str, resource: str = "nvidia.com/gpu", **kw: Any) -> PodInfo:
    fields: dict[str, Any] = dict(
        namespace=NS,
        name=name,
        labels={"app": "chat"},
        node=NODE.name,
        ready=True,
        terminating=False,
        phase="Running",
        gpu_resource=resource,
        gpu_container="vllm",
        oom_kills=0,
        created=NOW - 7200,
        ready_since=NOW - 7000,
    )
    fields.update(kw)
    return PodInfo(**fields)


def target(replicas: int = 2, resource: str = "nvidia.com/gpu", **kw: Any) -> TargetView:
    fields: dict[str, Any] = dict(
        replicas=replicas,
        selector="app=chat",
        resource_version="7",
        pod_spec={
            "nodeSelector": {"nvidia.com/gpu.product": H100},
            "containers": [{"name": "vllm", "resources": {"limits": {resource: "1"}}}],
        },
    )
    fields.update(kw)
    return TargetView(**fields)


def snapshot(util: float | None, pods: list[PodInfo], memory_mib: float = 20000) -> Snapshot:
    """Every pod at `util` percent with fresh samples; None: Prometheus did not answer."""
    if util is None:
        failed = (GPU_UTIL, MIG_UTIL, queue_signal(Server.VLLM), MEMORY)
        return Snapshot(NOW, errors={signal: DOWN for signal in failed})

    def each(value: float, of: list[PodInfo]) -> PodSamples:
        return PodSamples({(p.namespace, p.name): Sample(value, 5) for p in of}, read_at=NOW)

    return Snapshot(
        NOW,
        signals={
            GPU_UTIL: each(util, [p for p in pods if not p.is_mig]),
            MIG_UTIL: each(util, [p for p in pods if p.is_mig]),
            queue_signal(Server.VLLM): each(0, pods),
            MEMORY: each(memory_mib, pods),
        },
    )


@dataclass
class Turn:
    """A turn's inputs, with the defaults of a busy Auto workload on two whole H100s."""

    spec: dict[str, Any] = field(default_factory=spec)
    status: dict[str, Any] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    target: TargetView | None = field(default_factory=target)
    pods: list[PodInfo] = field(default_factory=lambda: [pod("chat-0"), pod("chat-1")])
    util: float | None = 95.0
    autoscalers: dict[tuple[str, str, str], str] = field(default_factory=dict)
    autoscaler_error: str | None = None
    fail: dict[str, TargetProblem] = field(default_factory=dict)
    history: dict[str, PodSamples] = field(default_factory=dict)  # right-sizing's window
    instances: dict[str, list[LabelledValue]] = field(default_factory=dict)  # its MIG series
    scalars: dict[str, float] = field(default_factory=dict)  # wake queries' answers
    watched: bool = False  # the target comes from the watch, not a read
    routes: FakeRoutes = field(default_factory=FakeRoutes)  # the activator's routes
    activator_ports: dict[int, list[tuple[str, str]]] = field(default_factory=dict)
    memory: Memory = field(default_factory=Memory)  # what the process kept of earlier turns
    unchanged_until: float | None = None  # the fleet saw nothing change till then

    async def run(self) -> tuple[Outcome, FakeTargets, FakeMetrics, Memory]:
        stored = {(NS, "chat"): self.target} if self.target is not None else {}
        targets = FakeTargets(stored, fail=self.fail)
        metrics = FakeMetrics(
            answers=dict(self.history), scalars=dict(self.scalars), series=dict(self.instances)
        )
        cluster = ClusterView(
            {NS: self.pods},
            {NODE.name: NODE},
            targets={"Deployment": dict(stored)} if self.watched else None,
            activator_ports=self.activator_ports,
        )
        cycle = Cycle(
            snapshot(self.util, self.pods),
            autoscalers=self.autoscalers,
            error=self.autoscaler_error,
        )
        memory = self.memory
        outcome = await reconcile(
            workload(self.spec, self.status, self.annotations),
            cluster,
            cycle,
            services(metrics, targets, routes=self.routes, now=NOW),
            memory,
            NOW,
            self.unchanged_until,
        )
        return outcome, targets, metrics, memory


def condition(outcome: Outcome, type_: ConditionType) -> dict[str, Any]:
    found = [c for c in outcome.status_patch["conditions"] if c["type"] == type_.value]
    assert len(found) == 1, outcome.status_patch["conditions"]
    return found[0]


def events(outcome: Outcome) -> list[tuple[str, str]]:
    return [(e.type, e.reason.value) for e in outcome.events]


HPA = {(NS, "Deployment", "chat"): "HorizontalPodAutoscaler chat"}
KEDA = owners_by_target(
    [],
    [
        {
            "metadata": {"namespace": NS, "name": "chat-so"},
            "spec": {"scaleTargetRef": {"name": "chat"}},
        }
    ],
)
PAUSED = {PAUSE_ANNOTATION: "true"}
WAITING_RECORD = ReshapeRecord(
    state=ReshapeState.IN_PROGRESS,
    origin=Placement(
        slice="gpu-h100",
        product="h100-80gb",
        resource="nvidia.com/gpu",
        product_label=H100,
        replicas=2,
    ),
    to=Placement(
        slice="mig-3g.40gb",
        product="h100-80gb",
        resource="nvidia.com/mig-3g.40gb",
        product_label=H100,
        replicas=1,
    ),
    units=1,
    container="vllm",
    started=iso(NOW - 60),
    deadline_seconds=600,
    message="saves 40%",
)
RESHAPING = target(annotations={RESHAPE_ANNOTATION: WAITING_RECORD.annotation()})


@pytest.mark.parametrize(
    ("label", "turn", "ready", "expected_events", "writes"),
    [
        ("busy: scale up", Turn(), ("True", Reason.ACTING), [("Normal", "Scaled")], [3]),
        (
            "invalid spec",
            Turn(spec=spec(replicas={"min": 5, "max": 2})),
            ("False", Reason.INVALID_SPEC),
            [("Warning", "InvalidSpec")],
            [],
        ),
        (
            "malformed wake query",
            Turn(
                spec=spec(
                    replicas={"min": 0},
                    scaleToZero={"enabled": True, "wakeQuery": "sum(rate(x[5m]"},
                )
            ),
            ("False", Reason.INVALID_SPEC),
            [("Warning", "InvalidSpec")],
            [],
        ),
        ("mode Off", Turn(spec=spec(mode="Off")), ("True", Reason.MODE_OFF), [], []),
        (
            "mode Recommend",
            Turn(spec=spec(mode="Recommend")),
            ("True", Reason.RECOMMEND_ONLY),
            [],
            [],
        ),
        (
            "paused on the WorkloadSizing",
            Turn(annotations=PAUSED),
            ("True", Reason.PAUSED),
            [("Normal", "Paused")],
            [],
        ),
        (
            "paused on the target",
            Turn(target=target(annotations=PAUSED)),
            ("True", Reason.PAUSED),
            [("Normal", "Paused")],
            [],
        ),
        (
            "still paused: no second Paused event",
            Turn(
                annotations=PAUSED,
                status={
                    "conditions": [
                        {"type": "Ready", "status": "True", "reason": "Paused", "message": "m"}
                    ]
                },
            ),
            ("True", Reason.PAUSED),
            [],
            [],
        ),
        (
            "the HPA and ScaledObject list failed",
            Turn(autoscaler_error="listing HPAs and ScaledObjects failed: 503"),
            ("False", Reason.AUTOSCALER_CHECK_FAILED),
            [],
            [],
        ),
        (
            "an HPA owns the target",
            Turn(autoscalers=HPA),
            ("False", Reason.CONFLICTING_AUTOSCALER),
            [("Warning", "ConflictingAutoscaler")],
            [],
        ),
        (
            "a KEDA ScaledObject owns the target",
            Turn(autoscalers=KEDA),
            ("False", Reason.CONFLICTING_AUTOSCALER),
            [("Warning", "ConflictingAutoscaler")],
            [],
        ),
        (
            "target gone",
            Turn(target=None),
            ("False", Reason.TARGET_NOT_FOUND),
            [("Warning", "TargetNotFound")],
            [],
        ),
        (
            "target not scalable",
            Turn(fail={"read": TargetNotScalable("spec.targetRef: Pod v1 has no /scale")}),
            ("False", Reason.TARGET_NOT_SCALABLE),
            [("Warning", "TargetNotFound")],
            [],
        ),
        (
            "a reshape in flight holds replicas",
            Turn(spec=spec(rightSizing={"mode": "Auto"}), target=RESHAPING),
            ("True", Reason.RESHAPING),
            [],
            [],
        ),
        (
            "the scale write conflicts",
            Turn(fail={"write": ScaleConflict("Deployment llm/chat changed to 3 replicas")}),
            ("True", Reason.ACTING),
            [],
            [],
        ),
        (
            "the scale write fails",
            Turn(fail={"write": TargetProblem("scaling Deployment llm/chat: Forbidden")}),
            ("False", Reason.SCALE_FAILED),
            [("Warning", "ScaleFailed")],
            [],
        ),
        (
            "metrics unknown: nothing scales down",
            Turn(util=None),
            ("True", Reason.ACTING),
            [("Warning", "MetricsUnavailable")],
            [],
        ),
        (
            "metrics known again",
            Turn(
                util=70.0,
                status={
                    "conditions": [
                        {"type": "MetricsAvailable", "status": "False", "reason": "NoSamples"}
                    ]
                },
            ),
            ("True", Reason.ACTING),
            [("Normal", "MetricsRecovered")],
            [],
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
async def test_a_turn(
    label: str,
    turn: Turn,
    ready: tuple[str, Reason],
    expected_events: list[tuple[str, str]],
    writes: list[int],
) -> None:
    outcome, targets, _, _ = await turn.run()
    got = condition(outcome, ConditionType.READY)
    assert (got["status"], got["reason"]) == (ready[0], ready[1].value), got["message"]
    assert events(outcome) == expected_events
    assert [replicas for _, _, replicas in targets.writes] == writes
    assert targets.reshapes == [], "no row moves the workload to another slice"


async def test_a_written_scale_is_in_the_status_and_the_history() -> None:
    outcome, _, _, _ = await Turn().run()
    patch = outcome.status_patch
    assert (patch["currentReplicas"], patch["desiredReplicas"]) == (3, 3)
    assert patch["lastScaleTime"] == iso(NOW)
    assert patch["scaleEvents"] == [{"time": iso(NOW), "fromReplicas": 2, "toReplicas": 3}]
    assert outcome.pods == ((NS, "chat-0"), (NS, "chat-1"))


@pytest.mark.parametrize(
    "turn",
    [Turn(spec=spec(mode="Recommend")), Turn(annotations=PAUSED), Turn(util=None)],
    ids=["recommend", "paused", "unknown"],
)
async def test_nothing_held_back_records_a_scale(turn: Turn) -> None:
    outcome, _, _, _ = await turn.run()
    assert outcome.status_patch["currentReplicas"] == 2
    assert outcome.status_patch.get("scaleEvents", []) == []
    assert "lastScaleTime" not in outcome.status_patch


async def test_a_recommendation_says_what_it_would_set() -> None:
    outcome, _, _, _ = await Turn(spec=spec(mode="Recommend")).run()
    assert condition(outcome, ConditionType.READY)["message"].startswith("would set 3:")
    assert outcome.status_patch["desiredReplicas"] == 3


async def test_unknown_metrics_say_why_and_hold_replicas() -> None:
    outcome, _, _, _ = await Turn(util=None, pods=[pod("chat-0"), pod("chat-1")]).run()
    metrics = condition(outcome, ConditionType.METRICS_AVAILABLE)
    assert (metrics["status"], metrics["reason"]) == ("False", "PrometheusUnreachable")
    assert "connection refused" in metrics["message"]
    assert "Holding replicas" in metrics["message"]


async def test_a_conflict_on_a_watched_target_reads_the_api_server_next_turn() -> None:
    turn = Turn(watched=True, fail={"write": ScaleConflict("changed to 3 replicas")})
    _, _, _, memory = await turn.run()
    assert memory.watch_behind == {(NS, "chat"): "7"}
    _, _, _, memory = await Turn(watched=True, util=70.0).run()  # nothing written
    assert memory.watch_behind == {}
    _, _, _, memory = await Turn(watched=True).run()  # its own write: the watch is behind it
    assert memory.watch_behind == {(NS, "chat"): "7"}


async def test_an_unanswered_write_keeps_its_decision_and_reads_the_target_next_turn() -> None:
    """The soak: a /scale PUT to 3 landed on an API server killed before it answered; the turn
    failed whole, its recommendation was lost, and the next turn scaled 3 -> 2 at once."""
    unanswered = TargetUnanswered("scaling Deployment llm/chat to 3: the API server did not answer")
    outcome, targets, _, memory = await Turn(watched=True, fail={"write": unanswered}).run()
    ready = condition(outcome, ConditionType.READY)
    assert (ready["status"], ready["reason"]) == ("False", Reason.SCALE_FAILED.value)
    assert "did not answer" in ready["message"]
    assert memory.watch_behind == {(NS, "chat"): "7"}
    assert [r["replicas"] for r in outcome.status_patch["recommendations"]] == [3]
    assert targets.writes == []


async def test_scaling_to_zero_and_waking_are_events_of_their_own() -> None:
    zero = spec(
        replicas={"min": 0},
        scaleToZero={"enabled": True, "idleSeconds": 600, "wakeQuery": "sum(pending)"},
        metrics={"server": "none"},
    )
    pending = 'sum(pending{namespace="llm"})'  # the wake query as it is sent
    idle = {
        "lastActiveTime": iso(NOW - 3600),
        "conditions": [{"type": "ScaledToZero", "status": "False", "reason": "Idle"}],
    }
    one = [pod("chat-0")]
    quiet = Turn(zero, idle, target=target(1), pods=one, util=0.0, scalars={pending: 0})
    outcome, targets, _, _ = await quiet.run()
    assert [r for _, _, r in targets.writes] == [0]
    assert events(outcome) == [("Normal", "ScaledToZero")]

    asked = Turn(zero, target=target(0), pods=[], util=0.0, scalars={pending: 5})
    outcome, targets, _, _ = await asked.run()
    assert [r for _, _, r in targets.writes] == [1]
    assert events(outcome) == [("Normal", "Woke")]


async def test_a_wake_query_prometheus_does_not_answer_keeps_its_last_answer_while_fresh() -> None:
    """The soak, seed 30: a slow Prometheus timed out one wake query in a few, and each
    workload at zero said its metrics lost and back within seconds."""
    zero = spec(
        replicas={"min": 0},
        scaleToZero={"enabled": True, "idleSeconds": 600, "wakeQuery": "sum(pending)"},
        metrics={"server": "none", "maxSampleAgeSeconds": 30},
    )
    pending = 'sum(pending{namespace="llm"})'
    memory = Memory()

    def at_zero(answer: float | Problem, age: float) -> Turn:
        memory.wake_answers = {k: (v, NOW - age) for k, (v, _) in memory.wake_answers.items()}
        return Turn(zero, target=target(0), pods=[], scalars={pending: answer}, memory=memory)

    timed_out = Problem(Reason.PROMETHEUS_UNREACHABLE, "ReadTimeoutError: read timed out")
    outcome, _, _, _ = await at_zero(0, 0).run()
    assert condition(outcome, ConditionType.METRICS_AVAILABLE)["status"] == "True"
    outcome, _, _, _ = await at_zero(timed_out, 29).run()
    assert condition(outcome, ConditionType.METRICS_AVAILABLE)["status"] == "True"
    outcome, _, _, _ = await at_zero(timed_out, 31).run()
    metrics = condition(outcome, ConditionType.METRICS_AVAILABLE)
    assert (metrics["status"], metrics["reason"]) == ("False", "PrometheusUnreachable")
    refused = Problem(Reason.QUERY_ERROR, "parse error")
    await at_zero(5, 0).run()  # an answer again: fresh
    outcome, targets, _, _ = await at_zero(refused, 1).run()
    metrics = condition(outcome, ConditionType.METRICS_AVAILABLE)
    assert (metrics["status"], metrics["reason"]) == ("False", "QueryError"), "said at once"
    assert targets.writes == []


async def test_pods_killed_for_memory_are_reported_even_without_right_sizing() -> None:
    pods = [pod("chat-0", oom_kills=2), pod("chat-1")]
    outcome, _, _, _ = await Turn(pods=pods, util=70.0).run()
    sized = condition(outcome, ConditionType.RIGHT_SIZED)
    assert (sized["status"], sized["reason"]) == ("False", "OutOfMemory")
    assert "chat-0 (2x on nvidia.com/gpu)" in sized["message"]
    assert events(outcome) == [("Warning", "OutOfMemory")]


# --- right-sizing: gated by the mode and the pause, and rolled back exactly ----------------

# two whole H100s at 10 % over the window, 20 GiB at peak: a 3g.40gb slice serves it cheaper
QUIET_HISTORY = {
    "peak_memory": PodSamples({(NS, "chat-0"): Sample(20000, 0), (NS, "chat-1"): Sample(20000, 0)}),
    "utilization": PodSamples({(NS, "chat-0"): Sample(10, 0), (NS, "chat-1"): Sample(10, 0)}),
}


def oversized(**kw: Any) -> Turn:
    """A steady workload (no replica change) that right-sizing would move to mig-3g.40gb."""
    fields: dict[str, Any] = dict(
        spec=spec(rightSizing={"mode": "Auto"}), util=70.0, history=QUIET_HISTORY
    )
    fields.update(kw)
    return Turn(**fields)


async def test_auto_moves_an_oversized_workload_in_one_template_change() -> None:
    outcome, targets, _, _ = await oversized().run()
    [(_, _, change)] = targets.reshapes
    assert (change.old_resource, change.new_resource) == (
        "nvidia.com/gpu",
        "nvidia.com/mig-3g.40gb",
    )
    assert (change.container, change.product_label) == ("vllm", H100)
    record = ReshapeRecord.parse(change.annotations[RESHAPE_ANNOTATION])
    assert record.state == ReshapeState.IN_PROGRESS and record.origin.replicas == 2
    assert events(outcome) == [("Normal", "ReshapeStarted")]
    assert condition(outcome, ConditionType.READY)["reason"] == "Reshaping"
    assert condition(outcome, ConditionType.RIGHT_SIZED)["reason"] == "Reshaping"
    assert targets.writes == [], "replicas wait for the rollout"


async def test_a_change_is_not_decided_again_on_the_watchs_older_copy(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The next turn comes a read period later, before the watch shows the change: it reads
    the target from the API server, and finds the move under way; the lag is logged once."""
    turn = oversized(watched=True)
    assert turn.target is not None
    targets = FakeTargets({(NS, "chat"): turn.target})
    # the watch's copy, never updated: a watch that lags
    stale = ClusterView(
        {NS: turn.pods}, {NODE.name: NODE}, targets={"Deployment": {(NS, "chat"): turn.target}}
    )
    metrics = FakeMetrics(answers=dict(turn.history))
    memory = Memory()
    cycle = Cycle(snapshot(turn.util, turn.pods), autoscalers={})
    ports = services(metrics, targets)
    caplog.set_level(logging.INFO, "gpusizer.reconcile")
    for now in (NOW, NOW + 1, NOW + 2):
        obj = workload(turn.spec)
        await reconcile(obj, stale, cycle, ports, memory, now)
    assert len(targets.reshapes) == 1, "a second reshape on the watch's older copy"
    assert targets.reads == 2
    lagging = [r.getMessage() for r in caplog.records if "the watch still shows" in r.getMessage()]
    assert lagging == [
        "llm/chat: the watch still shows Deployment chat as it was before its last change: "
        "reading it from the API server until the watch shows it"
    ]


@pytest.mark.parametrize(
    "turn",
    [
        oversized(spec=spec(mode="Recommend", rightSizing={"mode": "Auto"})),
        oversized(annotations=PAUSED),
        oversized(target=target(annotations=PAUSED)),
        oversized(spec=spec(rightSizing={"mode": "Recommend"})),
    ],
    ids=["mode Recommend", "paused WorkloadSizing", "paused target", "rightSizing Recommend"],
)
async def test_right_sizing_only_recommends_unless_auto_and_unpaused(turn: Turn) -> None:
    outcome, targets, _, _ = await turn.run()
    assert targets.reshapes == [] and targets.annotations == []
    sized = condition(outcome, ConditionType.RIGHT_SIZED)
    assert (sized["status"], sized["reason"]) == ("False", "CheaperSlice")
    assert outcome.status_patch["recommendation"]["slice"] == "mig-3g.40gb"


def in_flight(started: float, origin_product: str = H100) -> TargetView:
    record = WAITING_RECORD.model_copy(
        update={
            "started": iso(started),
            "origin": WAITING_RECORD.origin.model_copy(update={"product_label": origin_product}),
        }
    )
    return target(replicas=1, annotations={RESHAPE_ANNOTATION: record.annotation()})


A100 = "NVIDIA-A100-SXM4-80GB"
NEW = "nvidia.com/mig-3g.40gb"


@pytest.mark.parametrize(
    ("label", "pods", "started"),
    [
        (
            "out of memory on the new slice",
            [pod("chat-n", NEW, ready=False, oom_kills=1)],
            NOW - 60,
        ),
        ("not ready by the deadline", [pod("chat-n", NEW, ready=False)], NOW - 700),
    ],
)
async def test_a_failed_move_restores_the_slice_the_node_selector_and_the_replicas(
    label: str, pods: list[PodInfo], started: float
) -> None:
    turn = Turn(spec=spec(rightSizing={"mode": "Auto"}), target=in_flight(started, A100), pods=pods)
    outcome, targets, _, _ = await turn.run()
    [(_, _, change)] = targets.reshapes
    assert (change.old_resource, change.new_resource) == (NEW, "nvidia.com/gpu")
    assert (change.product_label, change.replicas, change.count) == (A100, 2, 1)
    assert change.container == "vllm"
    record = ReshapeRecord.parse(change.annotations[RESHAPE_ANNOTATION])
    assert record.state == ReshapeState.ROLLED_BACK
    assert events(outcome) == [("Warning", "ReshapeRolledBack")]
    sized = condition(outcome, ConditionType.RIGHT_SIZED)
    assert (sized["status"], sized["reason"]) == ("False", "ReshapeRolledBack")
    assert targets.writes == []


async def test_a_move_still_rolling_out_waits_and_one_done_is_recorded() -> None:
    waiting = Turn(
        spec=spec(rightSizing={"mode": "Auto"}),
        target=in_flight(NOW - 60),
        pods=[pod("chat-n", NEW, ready=False)],
    )
    outcome, targets, _, _ = await waiting.run()
    assert targets.reshapes == [] and targets.annotations == [] and events(outcome) == []

    done = Turn(
        spec=spec(rightSizing={"mode": "Auto"}),
        target=in_flight(NOW - 60),
        pods=[pod("chat-n", NEW)],
        util=70.0,
    )
    outcome, targets, _, _ = await done.run()
    [(_, _, annotations)] = targets.annotations
    assert ReshapeRecord.parse(annotations[RESHAPE_ANNOTATION]).state == ReshapeState.DONE
    assert events(outcome) == [("Normal", "Reshaped")]
    sized = condition(outcome, ConditionType.RIGHT_SIZED)
    assert (sized["status"], sized["reason"]) == ("True", "RightSized")


async def test_what_is_learned_is_kept_for_a_workload_that_scales_to_zero_only() -> None:
    zero = spec(
        replicas={"min": 0},
        scaleToZero={"enabled": True, "wakeQuery": "sum(pending)"},
        metrics={"server": "none"},
    )
    pending = 'sum(pending{namespace="llm"})'
    # the newest ready pod took 300 s from creation to Ready (the older one 200 s)
    pods = [pod("chat-0"), pod("chat-1", created=NOW - 600, ready_since=NOW - 300)]
    outcome, _, _, _ = await Turn(zero, util=70.0, pods=pods, scalars={pending: 0}).run()
    assert outcome.status_patch["learned"]["startupSeconds"] == 300
    outcome, _, _, _ = await Turn(util=70.0, pods=pods).run()
    assert "learned" not in outcome.status_patch


# --- the activator: the route goes in before the last replica goes, and out once one is ready ---

ZERO_BY_ACTIVATOR = spec(
    replicas={"min": 0},
    scaleToZero={"enabled": True, "idleSeconds": 600, "activator": {"enabled": True}},
    metrics={"server": "none"},
)
PORT = 20000
ROUTE = ActivatorRoute("chat", "uid-chat", "chat", "http", PORT, ("10.0.0.7", "10.0.0.8"))
IDLE_AT_PORT = {
    "lastActiveTime": iso(NOW - 3600),
    "conditions": [{"type": "ScaledToZero", "status": "False", "reason": "Idle"}],
    "activator": {"port": PORT, "routing": "Direct"},
}
AT_ZERO = {"activator": {"port": PORT, "routing": "Activator"}}


def held(pending: int, since: float, at: float = NOW - 0.2) -> dict[str, str]:
    record = HeldRecord(pending=pending, since=iso_millis(since), at=iso_millis(at))
    return {held_key("gpusizer-activator-7d9f-x2x4q"): record.annotation()}


def idle_one(**kw: Any) -> Turn:
    """One ready replica, idle for an hour: it goes to zero, behind the activator."""
    fields: dict[str, Any] = dict(
        spec=ZERO_BY_ACTIVATOR, status=IDLE_AT_PORT, target=target(1), pods=[pod("chat-0")]
    )
    fields.update(util=0.0, **kw)
    return Turn(**fields)


def at_zero(**kw: Any) -> Turn:
    fields: dict[str, Any] = dict(
        spec=ZERO_BY_ACTIVATOR, status=AT_ZERO, target=target(0), pods=[], util=0.0
    )
    fields.update(kw)
    return Turn(**fields)


def routes(**kw: Any) -> FakeRoutes:
    return FakeRoutes(**kw)


@pytest.mark.parametrize(
    ("label", "turn", "ready", "writes", "route_writes", "routing"),
    [
        (
            "idle: the route goes in, then the last replica goes",
            idle_one(),
            ("True", Reason.ACTING),
            [0],
            [ROUTE],
            "Activator",
        ),
        (
            "idle, but the route cannot be written: the last replica stays",
            idle_one(routes=routes(fail=RouteProblem("writing EndpointSlice: HTTP 403"))),
            ("False", Reason.ACTIVATOR_ROUTE_FAILED),
            [],
            [],
            "Direct",
        ),
        (
            "idle, but the Service is missing: the last replica stays",
            idle_one(routes=routes(services={})),
            ("False", Reason.ACTIVATOR_ROUTE_FAILED),
            [],
            [],
            "Direct",
        ),
        (
            "idle, but no activator replica is ready: unknown demand, nothing scales",
            idle_one(routes=routes(ready=())),
            ("True", Reason.ACTING),
            [],
            [],
            "Direct",
        ),
        (
            "idle, port just given out: the activator takes it before the replica goes",
            idle_one(status={**IDLE_AT_PORT, "activator": None}),
            ("True", Reason.ACTING),
            [],
            [],
            "Direct",
        ),
        (
            "at zero: requests held wake it, the route stays",
            at_zero(annotations=held(3, since=NOW - 0.4)),
            ("True", Reason.ACTING),
            [1],
            [ROUTE],
            "Activator",
        ),
        (
            "at zero: a gone replica's record is no demand",
            at_zero(annotations=held(3, since=NOW - 90, at=NOW - 60)),
            ("True", Reason.ACTING),
            [],
            [ROUTE],
            "Activator",
        ),
        (
            "starting: no replica ready yet, the route stays",
            at_zero(target=target(1), pods=[pod("chat-0", ready=False, phase="Pending")]),
            ("True", Reason.ACTING),
            [],
            [ROUTE],
            "Activator",
        ),
        (
            "a replica is ready: the route comes out",
            Turn(
                spec=ZERO_BY_ACTIVATOR,
                status=AT_ZERO,
                target=target(1),
                pods=[pod("chat-0")],
                util=50.0,
                routes=routes(slices={(NS, "chat"): ROUTE}),
            ),
            ("True", Reason.ACTING),
            [],
            [None],
            "Direct",
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
async def test_a_turn_with_the_activator(
    label: str,
    turn: Turn,
    ready: tuple[str, Reason],
    writes: list[int],
    route_writes: list[ActivatorRoute | None],
    routing: str,
) -> None:
    outcome, targets, _, _ = await turn.run()
    got = condition(outcome, ConditionType.READY)
    assert (got["status"], got["reason"]) == (ready[0], ready[1].value), got["message"]
    assert [replicas for _, _, replicas in targets.writes] == writes
    assert [route for _, _, route in turn.routes.writes] == route_writes
    assert outcome.status_patch["activator"]["routing"] == routing
    assert outcome.status_patch["activator"]["port"] == PORT


async def test_a_wake_by_the_activator_says_how_long_it_took() -> None:
    outcome, targets, _, _ = await at_zero(annotations=held(3, since=NOW - 0.4)).run()
    assert targets.writes == [(NS, "chat", 1)]
    activator = outcome.status_patch["activator"]
    assert (activator["pendingRequests"], activator["lastWakeSeconds"]) == (3, 0.4)
    assert activator["lastWakeTime"] == iso(NOW)
    assert events(outcome) == [("Normal", "Woke")]


async def test_without_an_activator_ready_the_reason_is_named() -> None:
    outcome, _, _, _ = await idle_one(routes=routes(ready=())).run()
    metrics = condition(outcome, ConditionType.METRICS_AVAILABLE)
    assert (metrics["status"], metrics["reason"]) == ("False", "NoActivator")
    assert "activator: NoActivator: no activator replica is ready" in metrics["message"]
    outcome, _, _, _ = await idle_one(routes=routes(ready=None)).run()
    assert "--activator-service" in condition(outcome, ConditionType.METRICS_AVAILABLE)["message"]


async def test_a_failed_route_names_the_field_and_warns_once() -> None:
    outcome, _, _, _ = await idle_one(
        routes=routes(services={(NS, "chat"): {80: "a", 81: "b"}})
    ).run()
    ready = condition(outcome, ConditionType.READY)
    assert ready["message"].startswith("spec.scaleToZero.activator.port: Service llm/chat has 2")
    assert ready["message"].endswith("replicas do not go to zero without the route")
    assert events(outcome) == [("Warning", "ActivatorRouteFailed")]
    still = idle_one(
        routes=routes(services={}),
        status={
            **IDLE_AT_PORT,
            "conditions": [
                *IDLE_AT_PORT["conditions"],
                {"type": "Ready", "status": "False", "reason": "ActivatorRouteFailed"},
            ],
        },
    )
    outcome, _, _, _ = await still.run()
    assert events(outcome) == [], "the Warning goes out when the route first fails"


async def test_the_port_recorded_is_kept_and_a_taken_one_is_not_given_twice() -> None:
    turn = idle_one(activator_ports={PORT: [(NS, "chat")], PORT + 1: [(NS, "aaa")]})
    outcome, _, _, memory = await turn.run()
    assert outcome.status_patch["activator"]["port"] == PORT
    assert memory.activator_ports == {(NS, "chat"): PORT}
    # another workload recorded the same port and sorts first: this one moves to a free port
    clash = idle_one(activator_ports={PORT: [(NS, "chat"), (NS, "aaa")], PORT + 1: [(NS, "b")]})
    outcome, targets, _, _ = await clash.run()
    assert outcome.status_patch["activator"]["port"] == PORT + 2
    assert targets.writes == [], "a port the activator does not listen on yet is not routed"


async def test_turning_the_activator_off_takes_the_route_out_and_clears_the_status() -> None:
    turn = Turn(
        status={"activator": {"port": PORT, "routing": "Activator"}},
        routes=routes(slices={(NS, "chat"): ROUTE}),
    )
    outcome, _, _, _ = await turn.run()
    assert turn.routes.writes == [(NS, "chat", None)]
    assert outcome.status_patch["activator"] is None


# --- what a result costs, and throughput learned ------------------------------------------


def each(value: float, *names: str) -> PodSamples:
    return PodSamples({(NS, name): Sample(value, 0) for name in names})


# two whole H100s over the default hour, each at 10 % serving 1 req/s (100 tokens each) at 133 W
SERVING = {
    **QUIET_HISTORY,
    "requests": each(3600, "chat-0", "chat-1"),
    "output_tokens": each(360_000, "chat-0", "chat-1"),
    "prompt_tokens": each(720_000, "chat-0", "chat-1"),
    "energy": each(133 * 3600 * 1000, "chat-0", "chat-1"),
    "power": each(133, "chat-0", "chat-1"),
}


async def test_a_turn_reports_what_a_result_costs_measured_over_the_window() -> None:
    outcome, _, _, _ = await Turn(history=SERVING, util=10.0).run()
    found = outcome.status_patch["efficiency"]
    # $6/h for 7,200 requests an hour; 266 W for 7,200 requests an hour
    assert found["costPer1kRequests"] == pytest.approx(6.00 / 7.2, rel=1e-3)
    assert found["kWhPer1kRequests"] == pytest.approx(0.266 / 7.2, rel=1e-3)
    assert found["costPerMillionOutputTokens"] == pytest.approx(6.00 / 0.72, rel=1e-3)
    assert (found["windowSeconds"], found["currency"], found["powerWatts"]) == (3600, "USD", 266)
    assert found["unknown"] is None  # a merge patch's null: none is unknown
    [learned] = outcome.status_patch["measuredThroughput"]
    assert (learned["slice"], learned["requestsPerSecond"]) == ("gpu-h100", 10.0)


async def test_a_missing_counter_is_said_and_its_figures_left_out() -> None:
    no_tokens = {k: v for k, v in SERVING.items() if k != "output_tokens"}
    outcome, _, _, _ = await Turn(history=no_tokens, util=10.0).run()
    found = outcome.status_patch["efficiency"]
    assert found["costPerMillionOutputTokens"] is None and found["costPer1kRequests"] > 0
    assert found["unknown"].startswith("output tokens: no series for 2 of 2 pods")


async def test_a_move_predicts_the_throughput_on_the_new_slice() -> None:
    outcome, targets, _, _ = await oversized(history=SERVING).run()
    [(_, _, change)] = targets.reshapes
    record = ReshapeRecord.parse(change.annotations[RESHAPE_ANNOTATION])
    assert record.prediction is not None
    # 1,000 output tokens/s per busy H100, times the catalog's ratio for 3g.40gb
    assert record.prediction.rate == pytest.approx(1000 * 0.47740, rel=1e-4)
    assert (record.prediction.unit, record.prediction.basis) == ("outputTokens", "Estimated")
    recommendation = outcome.status_patch["recommendation"]
    assert recommendation["throughput"] == "Estimated"
    assert (
        recommendation["after"]["costPer1kRequests"]
        < outcome.status_patch["efficiency"]["costPer1kRequests"]
    )


def moved_here(prediction: Prediction | None) -> TargetView:
    record = WAITING_RECORD.model_copy(
        update={"state": ReshapeState.DONE, "started": iso(NOW - 7200), "prediction": prediction}
    )
    return target(replicas=2, resource=NEW, annotations={RESHAPE_ANNOTATION: record.annotation()})


# two 3g.40gb slices at 50 % serving 1 req/s each: 2 req/s per busy slice
ON_3G = {
    "peak_memory": each(20000, "chat-0", "chat-1"),
    "mig_utilization": each(50, "chat-0", "chat-1"),
    "requests": each(3600, "chat-0", "chat-1"),
}


@pytest.mark.parametrize(
    ("label", "predicted", "events_out", "checked"),
    [
        ("30 % under the prediction", 2.86, [("Warning", "ThroughputMispredicted")], True),
        ("within the tolerance", 2.1, [], True),
        ("already checked", None, [], None),
    ],
)
async def test_a_move_whose_outcome_misses_its_prediction_is_an_event(
    label: str, predicted: float | None, events_out: list[tuple[str, str]], checked: bool | None
) -> None:
    prediction = Prediction(rate=predicted or 2.86, unit="requests", basis="Estimated")
    if predicted is None:
        prediction = prediction.model_copy(update={"checked": True})
    turn = Turn(
        spec=spec(rightSizing={"mode": "Recommend"}),
        target=moved_here(prediction),
        pods=[pod("chat-0", NEW), pod("chat-1", NEW)],
        util=50.0,
        history=ON_3G,
    )
    outcome, targets, _, _ = await turn.run()
    assert [e for e in events(outcome) if e[1] == "ThroughputMispredicted"] == events_out
    if checked is None:
        assert targets.annotations == []
        return
    [(_, _, annotations)] = targets.annotations
    record = ReshapeRecord.parse(annotations[RESHAPE_ANNOTATION])
    assert record.prediction is not None and record.prediction.checked is checked
    if events_out:
        message = next(e.message for e in outcome.events if e.reason.value == events_out[0][1])
        assert "2 req/s, 30% less than the 2.86 predicted (estimated throughput)" in message


async def test_a_replica_ready_since_the_last_scrape_waits_for_its_first_count() -> None:
    """Not yet in the counters: left out of the window, not a hole that unknowns it all."""
    new = pod("chat-2", created=NOW - 40, ready_since=NOW - 10)
    outcome, _, _, _ = await Turn(history=SERVING, util=10.0, pods=[*Turn().pods, new]).run()
    found = outcome.status_patch["efficiency"]
    assert found["unknown"] is None and found["costPer1kRequests"] == pytest.approx(
        6.00 / 7.2, rel=1e-3
    )
    # one ready longer than metrics.maxSampleAgeSeconds without a count is a missing series
    old = pod("chat-2", created=NOW - 400, ready_since=NOW - 300)
    outcome, _, _, _ = await Turn(history=SERVING, util=10.0, pods=[*Turn().pods, old]).run()
    assert outcome.status_patch["efficiency"]["unknown"].startswith("requests: no series")


async def settled(turn: Turn) -> Outcome:
    """The turn again, its status what its first wrote: what a workload's next turn finds."""
    first, _, _, _ = await turn.run()
    turn.status = {k: v for k, v in first.status_patch.items() if v is not None}
    outcome, _, _, _ = await turn.run()
    return outcome


async def test_a_turn_with_nothing_to_do_that_time_could_change_is_quiet() -> None:
    outcome = await settled(Turn(util=70.0, watched=True))  # two replicas, where 70 % puts them
    assert (outcome.status_patch, outcome.events, outcome.quiet) == ({}, [], True)


@pytest.mark.parametrize(
    "turn",
    [
        Turn(util=95.0, watched=True),
        Turn(util=20.0, watched=True),
        Turn(util=70.0),
        Turn(util=70.0, watched=True, spec=spec(rightSizing={"mode": "Recommend"})),
        Turn(util=70.0, watched=True, spec=spec(mode="Recommend")),
        Turn(util=70.0, watched=True, annotations=PAUSED),
        Turn(util=70.0, watched=True, spec=spec(metrics={"queueQuery": "sum(pending)"})),
        Turn(util=70.0, watched=True, pods=[pod("chat-0"), pod("chat-1", ready=False)]),
        Turn(util=None, watched=True),
    ],
    ids=[
        "a scale up",
        "held up by the scale-down window",
        "its target read from the API server",
        "right-sizing on",
        "recommend only",
        "paused",
        "its own queue query",
        "a pod not ready",
        "Prometheus out",
    ],
)
async def test_a_turn_that_time_or_an_unwatched_input_could_change_is_not_quiet(
    turn: Turn,
) -> None:
    outcome = await settled(turn)
    assert not outcome.quiet


async def test_a_first_turn_that_writes_its_status_is_not_quiet() -> None:
    outcome, _, _, _ = await Turn(util=70.0, watched=True).run()
    assert outcome.status_patch
    assert not outcome.quiet


@pytest.mark.parametrize(
    ("unchanged_until", "closed_at"),
    [(None, NOW - 30), (NOW - 2, NOW - 2), (NOW - 60, NOW - 30)],
    ids=["its last turn", "the fleet's last read", "the later of both"],
)
async def test_a_running_decision_closes_when_it_was_last_seen(
    unchanged_until: float | None, closed_at: float
) -> None:
    memory = Memory()
    memory.decided[(NS, "chat")] = NOW - 30
    status = {"recommendations": [{"time": iso(NOW - 600), "replicas": 2}]}
    turn = Turn(status=status, memory=memory, unchanged_until=unchanged_until)
    outcome, _, _, _ = await turn.run()
    assert outcome.status_patch["recommendations"][:1] == [{"time": iso(closed_at), "replicas": 2}]
