"""One GPUPartitioning's turn: read what the selected nodes hold and what the fleet needs,
plan the layouts, carry every node in flight one step further, start the next nodes (Auto),
and report the plan per node.

Kopf-free: the caller passes the object and the watches' views in and posts the events and the
status patch this returns; every write goes through `ports.NodeClient`, so each branch has a
table test (tests/unit/test_partition_turn.py).

Bad input (a node without GPU Feature Discovery labels, one selected twice, a layout its product
cannot hold, an unreadable or hand-edited mig-parted ConfigMap) starts nothing: the Ready
condition names it. A node already in flight is still carried to its end, so no node is left
cordoned halfway.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from gpusizer.api.partitioning import (
    REPARTITION_ANNOTATION,
    REPARTITION_FAILURE_ANNOTATION,
    GPUPartitioningSpec,
    GPUPartitioningStatus,
    NodePlan,
    NodeStep,
    PlanSummary,
    RepartitionFailure,
    RepartitionRecord,
)
from gpusizer.api.v1alpha1 import Condition, Mode
from gpusizer.catalog import Catalog, GPUProduct
from gpusizer.catalog.migparted import (
    ALL_DISABLED,
    Entries,
    NodeLayout,
    config_name,
    describe,
    edited,
    is_ours,
    node_layout,
    parse_config,
    read_described,
    standard_layout,
    with_configs,
)
from gpusizer.partition.demand import Demand, TemplateLookup, fleet_demand
from gpusizer.partition.objects import (
    GPU_COUNT_LABEL,
    MIG_CAPABLE_LABEL,
    MIG_CONFIG_LABEL,
    MIG_STATE_LABEL,
    MIG_STRATEGY_LABEL,
    ConfigMapRef,
    GpuNode,
    GpuPod,
    PartitionProblem,
    SizingDemand,
)
from gpusizer.policy.partitioning import NodeChange, Plan, PlanNode, SliceKey, plan_partitions
from gpusizer.policy.repartition import Action, NodeNow, next_action
from gpusizer.ports import NodeClient
from gpusizer.report.events import EventIntent
from gpusizer.report.status import ConditionState, merge_conditions
from gpusizer.timefmt import iso, parse_time
from gpusizer.vocabulary import ConditionType, EventReason, Reason

FAILURE_BACKOFF_SECONDS = 3600.0
"""A node whose re-partition did not finish is left alone this long (its annotation says why)."""
WATCH_GRACE_SECONDS = 60.0
"""How long a node whose watch does not show gpusizer's own last write yet is waited for."""
APPLYING_STATES = ("pending", "rebooting")


class Written:
    """The record this process last wrote on each node, and when: a turn must not act on a
    node its watch shows from before that write (it would cordon it, or set its label, a
    second time)."""

    def __init__(self) -> None:
        self._records: dict[str, tuple[str | None, float]] = {}

    def wrote(self, node: str, record: str | None, now: float) -> None:
        self._records[node] = (record, now)

    def behind(self, node: GpuNode, now: float) -> bool:
        """The watch does not show the last write yet (given a grace period: someone else may
        have changed the record since)."""
        found = self._records.get(node.name)
        if found is None:
            return False
        record, when = found
        if record == node.record or now - when > WATCH_GRACE_SECONDS:
            del self._records[node.name]
            return False
        return True


@dataclass(frozen=True)
class PartitionServices:
    catalog: Catalog
    nodes: NodeClient
    config_map: ConfigMapRef
    written: Written = field(default_factory=Written)
    config_settle_seconds: float = 0.0  # from a node's cordon (its config written) to its label


@dataclass(frozen=True)
class PartitionView:
    """The watches' objects: every node, every GPU pod, the WorkloadSizings that ask for slices,
    their targets' templates, and every GPUPartitioning's node selector by name."""

    nodes: Mapping[str, GpuNode]
    pods: Iterable[GpuPod]
    sizings: Iterable[SizingDemand]
    template: TemplateLookup
    selectors: Mapping[str, Mapping[str, str]]


@dataclass(frozen=True)
class PartitioningObject:
    name: str
    spec: Mapping[str, Any]
    status: Mapping[str, Any]
    generation: int | None


@dataclass(frozen=True)
class Outcome:
    status_patch: dict[str, Any]
    events: list[EventIntent]


@dataclass
class NodeState:
    """A selected node as this turn finds it."""

    node: GpuNode
    product: GPUProduct | None = None
    layout: NodeLayout | None = None  # now (for a node in flight: where it is going)
    current: NodeLayout | None = None  # what its label's config holds now
    record: RepartitionRecord | None = None  # ours, in flight
    pods: list[GpuPod] = field(default_factory=list)  # GPU pods on it, not terminating
    terminating: int = 0
    problem: tuple[Reason, str] | None = None  # bad input: nothing moves while it lasts
    held: str | None = None  # why the plan may not change it
    behind: bool = False  # the watch does not show this process's last write on it yet
    step: NodeStep = NodeStep.UNCHANGED
    message: str = ""

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def label(self) -> str:
        return self.node.mig_config or ALL_DISABLED


@dataclass
class ConfigFile:
    """The mig-parted ConfigMap as read this turn."""

    text: str | None = None
    version: str = ""
    configs: dict[str, Entries] = field(default_factory=dict)
    problem: tuple[Reason, str] | None = None


class Turn:
    """A turn's state: what it read, what it decided, and what it did."""

    def __init__(
        self,
        obj: PartitioningObject,
        spec: GPUPartitioningSpec,
        view: PartitionView,
        services: PartitionServices,
        now: float,
    ) -> None:
        self.obj, self.spec, self.view, self.services, self.now = obj, spec, view, services, now
        self.events: list[EventIntent] = []
        self.problems: list[tuple[Reason, str]] = []
        self.config = ConfigFile()
        self.states: list[NodeState] = []
        self.blocked: list[str] = []  # evictions PodDisruptionBudgets refused this turn
        self.failures: list[tuple[Reason, str]] = []  # re-partitions that ended badly

    # --- reading ---------------------------------------------------------------------------

    async def read_config(self) -> None:
        ref = self.services.config_map
        try:
            text, version = await self.services.nodes.read_config(ref)
        except PartitionProblem as exc:
            self.config.problem = (Reason.MIG_CONFIG_UNAVAILABLE, f"ConfigMap {ref}: {exc}")
            return
        self.config.text, self.config.version = text, version
        try:
            self.config.configs = parse_config(text)
        except ValueError as exc:
            self.config.problem = (Reason.MIG_CONFIG_UNAVAILABLE, f"ConfigMap {ref}: {exc}")
            return
        changed = edited(self.config.configs)
        if changed:
            self.config.problem = (
                Reason.MIG_CONFIG_EDITED,
                f"ConfigMap {ref}: {', '.join(changed)} no longer hold(s) what gpusizer wrote "
                "(edited by hand?); gpusizer changes nothing until they are restored or removed",
            )

    def layout_of(self, name: str, product: GPUProduct, gpus: int) -> NodeLayout:
        """The layout a config name stands for; ValueError saying why it has none."""
        found = standard_layout(product, name, gpus)
        if found is not None:
            return found
        entries = self.config.configs.get(name)
        if entries is None:
            if self.config.problem is not None and self.config.problem[0] != (
                Reason.MIG_CONFIG_EDITED
            ):
                raise ValueError(f"config {name} cannot be read: {self.config.problem[1]}")
            where = f"ConfigMap {self.services.config_map}"
            raise ValueError(
                f"config {name} is not a standard layout a {product.gfd_label} holds, "
                f"nor in {where}"
            )
        return node_layout(entries, product, gpus, name)

    def classify(self, node: GpuNode, pods: Sequence[GpuPod]) -> NodeState:
        state = NodeState(node, behind=self.services.written.behind(node, self.now))
        if state.behind:
            state.held = state.message = "waiting for the watch to show gpusizer's last change"
        state.pods = [p for p in pods if not p.terminating]
        state.terminating = len(pods) - len(state.pods)
        label = node.product_label
        product = self.services.catalog.product_by_label(label or "")
        count = node.labels.get(GPU_COUNT_LABEL, "")
        if not label or product is None or not count.isdigit() or int(count) == 0:
            what = (
                f"no {GPU_COUNT_LABEL}"
                if label and product is not None
                else f"GPU product {label!r} is not in the catalog"
                if label
                else "no nvidia.com/gpu.product label"
            )
            state.problem = (
                Reason.NODE_NOT_LABELLED,
                f"node {node.name}: {what} from GPU Feature Discovery",
            )
            state.step = NodeStep.EXCLUDED
            return state
        state.product = product
        gpus = int(count)
        record = self._record(state)
        if record is not None:
            state.record, state.step = record, record.step
            state.layout = _target(record)
            if state.layout is None:
                state.message = f"its {REPARTITION_ANNOTATION} record names no layout of its own"
            try:
                on_target = state.label == record.to_config and state.layout is not None
                state.current = (
                    state.layout if on_target else self.layout_of(state.label, product, gpus)
                )
            except ValueError as exc:
                state.message = str(exc)
            return state
        try:
            state.current = state.layout = self.layout_of(state.label, product, gpus)
        except ValueError as exc:
            state.problem = (Reason.LAYOUT_NOT_SUPPORTED, f"node {node.name}: {exc}")
            state.step = NodeStep.EXCLUDED
            return state
        state.held = self._held(state, product)
        return state

    def _record(self, state: NodeState) -> RepartitionRecord | None:
        """Our record on the node; another GPUPartitioning's (or an unreadable one) holds it."""
        raw = state.node.record
        if not raw:
            return None
        try:
            record = RepartitionRecord.parse(raw)
        except ValueError:
            state.held = f"its {REPARTITION_ANNOTATION} annotation cannot be read; left alone"
            return None
        if record.partitioning != self.obj.name:
            state.held = f"being re-partitioned by GPUPartitioning {record.partitioning}"
            return None
        return record

    def _held(self, state: NodeState, product: GPUProduct) -> str | None:
        node = state.node
        if state.held:
            return state.held
        if product.mig is None or node.labels.get(MIG_CAPABLE_LABEL) != "true":
            return "not MIG-capable"
        strategy = node.labels.get(MIG_STRATEGY_LABEL)
        if strategy != "mixed":
            return f"{MIG_STRATEGY_LABEL} is {strategy or 'not set'}; re-partitioning needs mixed"
        if node.mig_state in APPLYING_STATES:
            return f"mig-manager is applying {state.label} ({node.mig_state}); left alone"
        if node.mig_state == "failed":
            return f"mig-manager reported failed for {state.label}; left alone"
        if node.unschedulable:
            return "cordoned by someone else; left alone"
        failure = _failure(node)
        if failure is not None:
            since = parse_time(failure.time) or 0.0
            if self.now - since < FAILURE_BACKOFF_SECONDS:
                self.failures.append((Reason(failure.reason), f"{node.name}: {failure.message}"))
                return _held_after(failure)
        return None

    def check_spec(self) -> None:
        """Profiles the spec names that no selected product has."""
        products = {s.product.key: s.product for s in self.states if s.product is not None}
        if not products:
            return
        named = set(self.spec.allowed_profiles) | set(self.spec.spare_slices)
        for profile in sorted(named):
            if not any(p.mig and profile in p.mig.profiles for p in products.values()):
                self.problems.append(
                    (
                        Reason.LAYOUT_NOT_SUPPORTED,
                        f"{profile} (in allowedProfiles or spareSlices) is not a MIG profile of "
                        f"any selected node's GPU ({', '.join(sorted(products)) or 'none'})",
                    )
                )

    def demand(self) -> Demand:
        node_products = {s.name: s.product.key for s in self.states if s.product is not None}
        demand = fleet_demand(
            self.services.catalog,
            node_products,
            self.view.pods,
            self.view.sizings,
            self.view.template,
        )
        for key in set(node_products.values()):
            mig = self.services.catalog.products[key].mig
            for profile, n in self.spec.spare_slices.items():
                if mig is not None and profile in mig.profiles:
                    demand.add((key, profile), n)
        return demand

    def plan(self, demand: Demand) -> Plan:
        nodes = [
            PlanNode(
                name=s.name,
                product=s.product,
                layout=s.layout,
                pods=tuple(p.key for p in s.pods),
                changeable=s.record is None and s.held is None and not s.behind,
            )
            for s in self.states
            if s.product is not None and s.layout is not None and s.problem is None
        ]
        return plan_partitions(nodes, demand.counts, self.spec.allowed_profiles, demand.running)

    # --- acting ----------------------------------------------------------------------------

    def referenced(self) -> set[str]:
        """gpusizer's configs some node's label or record still names: never dropped."""
        names: set[str] = set()
        for node in self.view.nodes.values():
            names.add(node.mig_config or ALL_DISABLED)
            if node.record:
                try:
                    record = RepartitionRecord.parse(node.record)
                except ValueError:
                    continue
                names.update((record.from_config, record.to_config))
        return {n for n in names if is_ours(n)}

    async def ensure_config(self, name: str, layout: NodeLayout) -> str | None:
        """`name` written to the ConfigMap if missing (dropping configs nothing names any more);
        the problem, if it could not be."""
        if self.config.problem is not None:
            return self.config.problem[1]
        if name in self.config.configs:
            return None
        ref = self.services.config_map
        text = with_configs(self.config.text, self.referenced(), {name: layout})
        try:
            version = await self.services.nodes.write_config(ref, text, self.config.version)
        except PartitionProblem as exc:
            return f"writing {name} to ConfigMap {ref}: {exc}"
        self.config.configs = parse_config(text)
        self.config.text, self.config.version = text, version
        return None

    async def carry(self, state: NodeState) -> None:
        """One step of a node in flight."""
        record = state.record
        assert record is not None
        action, message = next_action(
            record,
            NodeNow(
                state.label,
                state.node.mig_state,
                tuple(p.key for p in state.pods),
                state.terminating,
            ),
            self.now,
            started=parse_time(record.started) or self.now,
            configure_started=parse_time(record.configure_started),
            drain_timeout=self.spec.drain.timeout_seconds,
            reconfigure_timeout=self.spec.reconfigure_timeout_seconds,
        )
        settled = (parse_time(record.started) or self.now) + self.services.config_settle_seconds
        if action == Action.CONFIGURE and self.now < settled:
            action = Action.WAIT
            message = (
                f"drained; {record.to_config} is set in {settled - self.now:.0f}s, once the "
                "kubelet has refreshed mig-manager's copy of the ConfigMap"
            )
        state.message = message
        nodes, name = self.services.nodes, state.name
        try:
            if action == Action.EVICT:
                await self._evict(state)
            elif action == Action.WAIT and record.step == NodeStep.DRAINING:
                await self._ensure_target(state)
            elif action == Action.CONFIGURE:
                problem = await self._ensure_target(state)
                if problem is None:
                    await self._move(state, NodeStep.CONFIGURING, record.to_config, message)
                else:
                    state.message = problem
            elif action == Action.ROLL_BACK:
                await self._move(state, NodeStep.ROLLING_BACK, record.from_config, message)
                self.events.append(
                    EventIntent(
                        "Warning",
                        EventReason.REPARTITION_ROLLED_BACK,
                        f"node {name}: {message}; restoring {record.from_config}",
                    )
                )
            elif action == Action.FINISH:
                await nodes.patch_node(
                    name,
                    annotations={
                        REPARTITION_ANNOTATION: None,
                        REPARTITION_FAILURE_ANNOTATION: None,
                    },
                    unschedulable=False if record.cordoned else None,
                )
                self.services.written.wrote(name, None, self.now)
                self.events.append(
                    EventIntent("Normal", EventReason.REPARTITIONED, f"node {name}: {message}")
                )
                state.step, state.record = NodeStep.UNCHANGED, None
            elif action in (Action.RESTORED, Action.GIVE_UP, Action.ABANDON):
                await self._end_badly(state, action, message)
            elif action == Action.STUCK:
                self.failures.append((Reason.ROLLBACK_FAILED, f"{name}: {message}"))
        except PartitionProblem as exc:
            state.message = f"{message}; {exc} (tried again next turn)"

    async def _ensure_target(self, state: NodeState) -> str | None:
        record, layout = state.record, state.layout
        assert record is not None
        if layout is None:
            return state.message
        return await self.ensure_config(record.to_config, layout)

    async def _evict(self, state: NodeState) -> None:
        refused = []
        for pod in state.pods:
            why = await self.services.nodes.evict(pod.namespace, pod.name)
            if why is not None:
                refused.append(f"{pod.key}: {why}")
        if refused:
            state.message = (
                f"waiting: eviction refused for {len(refused)} GPU pod(s), never forced: "
                f"{'; '.join(refused[:3])}"
            )
            self.blocked.append(f"node {state.name}: {state.message}")
        await self._ensure_target(state)

    async def _move(self, state: NodeState, step: NodeStep, config: str, message: str) -> None:
        """Set the label (mig-manager's cue) and the record's step in one patch; the state label
        goes, so the next `success` is mig-manager's answer to this label and not an old one."""
        record = state.record
        assert record is not None
        updated = record.model_copy(
            update={
                "step": step,
                "configure_started": iso(self.now),
                "message": message if step == NodeStep.ROLLING_BACK else record.message,
            }
        )
        await self.services.nodes.patch_node(
            state.name,
            labels={MIG_CONFIG_LABEL: config, MIG_STATE_LABEL: None},
            annotations={REPARTITION_ANNOTATION: updated.annotation()},
        )
        self.services.written.wrote(state.name, updated.annotation(), self.now)
        state.record, state.step = updated, step

    async def _end_badly(self, state: NodeState, action: Action, message: str) -> None:
        record = state.record
        assert record is not None
        reason, event = {
            Action.RESTORED: (Reason.MIG_CONFIG_FAILED, EventReason.REPARTITION_ROLLED_BACK),
            Action.GIVE_UP: (Reason.DRAIN_TIMED_OUT, EventReason.DRAIN_TIMED_OUT),
            Action.ABANDON: (Reason.LABEL_CHANGED_UNDER_PLAN, EventReason.REPARTITION_ABANDONED),
        }[action]
        failure = RepartitionFailure(
            reason=reason.value, config=record.to_config, time=iso(self.now), message=message
        )
        # someone else's label change: their node now; the cordon stays for them to lift
        uncordon = record.cordoned and action != Action.ABANDON
        await self.services.nodes.patch_node(
            state.name,
            annotations={
                REPARTITION_ANNOTATION: None,
                REPARTITION_FAILURE_ANNOTATION: failure.annotation(),
            },
            unschedulable=False if uncordon else None,
        )
        self.services.written.wrote(state.name, None, self.now)
        line = f"node {state.name}: {message}" + (
            "" if uncordon or not record.cordoned else "; left cordoned for them"
        )
        self.events.append(EventIntent("Warning", event, line))
        self.failures.append((reason, line))
        state.step, state.record, state.message = NodeStep.EXCLUDED, None, line
        state.held = _held_after(failure)

    async def start(self, state: NodeState, layout: NodeLayout) -> bool:
        """Cordon the node with its record in one patch, then write its config."""
        target = config_name(layout)
        record = RepartitionRecord(
            partitioning=self.obj.name,
            step=NodeStep.DRAINING,
            from_config=state.label,
            to_config=target,
            layout=[describe(gpu) for gpu in layout],
            cordoned=not state.node.unschedulable,
            started=iso(self.now),
        )
        try:
            await self.services.nodes.patch_node(
                state.name,
                annotations={REPARTITION_ANNOTATION: record.annotation()},
                unschedulable=True,
            )
        except PartitionProblem as exc:
            state.message = f"could not cordon: {exc}"
            return False
        self.services.written.wrote(state.name, record.annotation(), self.now)
        state.record, state.step, state.layout = record, NodeStep.DRAINING, layout
        problem = await self.ensure_config(target, layout)
        state.message = problem or f"cordoned; draining {len(state.pods)} GPU pod(s)"
        self.events.append(
            EventIntent(
                "Normal",
                EventReason.REPARTITION_STARTED,
                f"node {state.name}: cordoned to move from {state.label} to {target} "
                f"({len(state.pods)} GPU pod(s) to evict)",
            )
        )
        return True


def _target(record: RepartitionRecord) -> NodeLayout | None:
    """The layout the record moves to, when it is the one its config name says."""
    try:
        layout = tuple(read_described(gpu) for gpu in record.layout)
    except ValueError:
        return None
    return layout if layout and config_name(layout) == record.to_config else None


def _held_after(failure: RepartitionFailure) -> str:
    until = iso((parse_time(failure.time) or 0.0) + FAILURE_BACKOFF_SECONDS)
    return f"{failure.reason} at {failure.time}: {failure.message}; held until {until}"


def _failure(node: GpuNode) -> RepartitionFailure | None:
    if not node.failure:
        return None
    try:
        return RepartitionFailure.parse(node.failure)
    except ValueError:
        return None


async def partition_turn(
    obj: PartitioningObject, view: PartitionView, services: PartitionServices, now: float
) -> Outcome:
    """Read, plan, carry the nodes in flight, start the next ones (Auto), report."""
    try:
        spec = GPUPartitioningSpec.model_validate(obj.spec)
    except ValidationError as exc:
        message = "; ".join(
            f"spec.{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}"
            for e in exc.errors()[:3]
        )
        ready = ConditionState(ConditionType.READY, False, Reason.INVALID_SPEC, message)
        return _outcome(obj, now, GPUPartitioningStatus(), [ready], [])
    turn = Turn(obj, spec, view, services, now)
    await turn.read_config()
    if turn.config.problem is not None:
        turn.problems.append(turn.config.problem)
    pods: dict[str, list[GpuPod]] = defaultdict(list)
    for pod in view.pods:
        if pod.node is not None:
            pods[pod.node].append(pod)
    others = {n: s for n, s in view.selectors.items() if n != obj.name}
    for node in sorted(view.nodes.values(), key=lambda n: n.name):
        if not node.selected_by(spec.node_selector):
            continue
        twice = sorted(n for n, s in others.items() if node.selected_by(s))
        if twice:
            turn.problems.append(
                (
                    Reason.NODE_SELECTED_TWICE,
                    f"node {node.name} is also selected by GPUPartitioning {', '.join(twice)}",
                )
            )
        state = turn.classify(node, pods.get(node.name, []))
        if twice and state.record is None:
            state.step, state.held = NodeStep.EXCLUDED, "selected twice"
        if state.problem is not None:
            turn.problems.append(state.problem)
        turn.states.append(state)
    turn.check_spec()
    demand = turn.demand()
    # a plan's time grows with the nodes (bench/README.md, GPU partitioning): off the event loop
    plan = await asyncio.to_thread(turn.plan, demand)
    for state in turn.states:
        if state.record is not None and not state.behind:
            await turn.carry(state)
    by_name = {s.name: s for s in turn.states}
    changes = {c.node: c for c in plan.changes}
    in_flight = sum(1 for s in turn.states if s.record is not None or s.behind)
    if spec.mode == Mode.AUTO and not turn.problems:
        for change in plan.changes:
            if in_flight >= spec.max_nodes_unavailable:
                break
            state = by_name[change.node]
            if state.record is None and await turn.start(state, change.layout):
                in_flight += 1
    return _report(turn, plan, demand, changes)


def _key(key: SliceKey) -> str:
    return f"{key[0]}/{key[1]}"


def _node_plan(state: NodeState, change: NodeChange | None, mode: Mode) -> NodePlan:
    current = state.current or ()
    fields: dict[str, Any] = {
        "name": state.name,
        "product": state.product.key if state.product else None,
        "current_config": state.node.mig_config,
        "current_layout": [describe(g) for g in current],
        "message": state.message,
    }
    if state.record is not None:
        fields.update(
            step=state.step,
            proposed_config=state.record.to_config,
            proposed_layout=[describe(g) for g in state.layout or ()],
            pods_to_move=[p.key for p in state.pods],
            reason=f"re-partitioning from {state.record.from_config}",
        )
    elif change is not None:
        verb = "would re-partition" if mode != Mode.AUTO else "re-partitions"
        fields.update(
            step=NodeStep.PLANNED,
            proposed_config=config_name(change.layout),
            proposed_layout=[describe(g) for g in change.layout],
            pods_to_move=list(change.pods),
            slices_gained=dict(change.gained),
            slices_lost=dict(change.lost),
            reason=f"the plan {verb} it: "
            + ("no GPU pods, no drain" if not change.pods else f"{len(change.pods)} pod(s) move"),
        )
    else:
        reason = (
            state.problem[1]
            if state.problem
            else state.held
            if state.held
            else "its layout stays: the plan needs no change here"
        )
        fields.update(step=state.step, reason=reason)
    return NodePlan(**fields)


def _report(turn: Turn, plan: Plan, demand: Demand, changes: Mapping[str, NodeChange]) -> Outcome:
    spec = turn.spec
    nodes = [_node_plan(s, changes.get(s.name), spec.mode) for s in turn.states]
    summary = PlanSummary(
        nodes=len(turn.states),
        gpus=plan.gpus,
        gpus_needed_now=plan.gpus_now,
        gpus_needed_planned=plan.gpus_planned,
        gpus_free=plan.gpus - plan.gpus_planned,
        pods_to_move=plan.pods_moved,
        demand={_key(k): n for k, n in sorted(demand.counts.items())},
        unmet={_key(k): n for k, n in sorted(plan.unmet.items())},
    )
    if turn.problems:
        reason, _ = turn.problems[0]
        message = "; ".join(m for _, m in turn.problems[:5])
        if len(turn.problems) > 5:
            message += f"; and {len(turn.problems) - 5} more"
        ready = ConditionState(
            ConditionType.READY, False, reason, f"nothing is started while: {message}"
        )
    elif spec.mode == Mode.AUTO:
        ready = ConditionState(ConditionType.READY, True, Reason.ACTING, "re-partitions nodes")
    elif spec.mode == Mode.RECOMMEND:
        ready = ConditionState(
            ConditionType.READY, True, Reason.RECOMMEND_ONLY, "plans and reports; moves nothing"
        )
    else:
        ready = ConditionState(ConditionType.READY, True, Reason.MODE_OFF, "mode is Off")
    status = GPUPartitioningStatus(
        observed_generation=turn.obj.generation, summary=summary, nodes=nodes
    )
    return _outcome(turn.obj, turn.now, status, [ready, _partitioned(turn, plan)], turn.events)


def _partitioned(turn: Turn, plan: Plan) -> ConditionState:
    def condition(status: bool, reason: Reason, message: str) -> ConditionState:
        return ConditionState(ConditionType.PARTITIONED, status, reason, message)

    stuck = [m for r, m in turn.failures if r == Reason.ROLLBACK_FAILED]
    if stuck:
        return condition(False, Reason.ROLLBACK_FAILED, "; ".join(stuck))
    if turn.failures:
        reason, _ = turn.failures[0]
        return condition(False, reason, "; ".join(m for _, m in turn.failures))
    if turn.blocked:
        return condition(False, Reason.DRAIN_BLOCKED, "; ".join(turn.blocked))
    moving = [s for s in turn.states if s.record is not None]
    if moving:
        lines = [f"node {s.name}: {s.step.value}: {s.message}" for s in moving]
        return condition(False, Reason.REPARTITIONING, "; ".join(lines))
    if plan.changes:
        names = ", ".join(c.node for c in plan.changes)
        return condition(
            False,
            Reason.PLAN_PENDING,
            f"re-partitioning {names} would hold the demand on {plan.gpus_planned} GPU(s) "
            f"instead of {plan.gpus_now}, moving {plan.pods_moved} pod(s)",
        )
    if plan.unmet:
        unmet = ", ".join(f"{n} x {_key(k)}" for k, n in sorted(plan.unmet.items()))
        return condition(
            False, Reason.DEMAND_UNMET, f"no allowed layout of the selected nodes holds {unmet}"
        )
    return condition(
        True,
        Reason.LAYOUTS_HOLD_DEMAND,
        f"the layouts hold the demand on {plan.gpus_planned} of {plan.gpus} GPU(s)",
    )


def _outcome(
    obj: PartitioningObject,
    now: float,
    status: GPUPartitioningStatus,
    conditions: Sequence[ConditionState],
    events: list[EventIntent],
) -> Outcome:
    merged = merge_conditions(obj.status.get("conditions"), conditions, now, obj.generation)
    full = status.model_copy(update={"conditions": merged}).model_dump(
        by_alias=True, mode="json", exclude_none=True
    )
    patch = merge_patch(obj.status, full)
    for flipped in _flips(obj.status.get("conditions"), merged):
        events.append(flipped)
    return Outcome(patch, events)


def merge_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON merge patch from `old` to `new`: changed keys, and null for keys `new` no longer
    has, in nested objects too (a merge patch merges them; lists it replaces whole)."""
    patch: dict[str, Any] = {}
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            inner = merge_patch(before, value)
            if inner:
                patch[key] = inner
        elif before != value:
            patch[key] = value
    patch.update({key: None for key in old if key not in new})
    return patch


def _flips(old: Any, new: Sequence[Condition]) -> list[EventIntent]:
    """A Warning when Ready turns False (bad input someone must fix) or a drain starts to wait
    on a PodDisruptionBudget."""
    before = {
        c.get("type"): (c.get("status"), c.get("reason"))
        for c in old or []
        if isinstance(c, Mapping)
    }
    out = []
    for c in new:
        if before.get(c.type) == (c.status, c.reason) or c.status != "False":
            continue
        if c.type == ConditionType.READY.value:
            out.append(EventIntent("Warning", EventReason.PARTITIONING_BLOCKED, c.message))
        elif c.reason == Reason.DRAIN_BLOCKED.value:
            out.append(EventIntent("Warning", EventReason.DRAIN_BLOCKED, c.message))
    return out
