"""What this process remembers of each workload between its turns.

None of it needs to survive a restart: what must (the decision history, the reshape in flight)
lives in the status and on the target.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from gpusizer.actuate.target_view import TargetView
from gpusizer.api.v1alpha1 import TargetRef, WorkloadSizingSpec
from gpusizer.cluster import ClusterView
from gpusizer.signals.parse import Problem
from gpusizer.throughput import ThroughputBook
from gpusizer.vocabulary import Reason

# the sections of a spec that many workloads have alike; the targetRef is each one's own
SHARED_SECTIONS = ("replicas", "scale_to_zero", "metrics", "right_sizing")


class SpecCache:
    """Each workload's spec as validated at its generation: the API server bumps the
    generation at every change of the spec, so validating once per generation suffices, and
    validating every spec every turn was a large share of a decision (bench/README.md).

    Equal parts of different specs (their replicas, metrics, scale-to-zero and right-sizing
    sections) are one shared object: most workloads of a fleet leave most of them at their
    defaults or copy them from one manifest, and each spec's own was most of its size
    (bench/README.md, "specs that share their parts"). The parts are frozen models."""

    def __init__(self) -> None:
        self._specs: dict[tuple[str, str], tuple[int, WorkloadSizingSpec]] = {}
        # each part once, by its section and its JSON, for as long as a spec holds it
        self._parts: weakref.WeakValueDictionary[tuple[str, str], BaseModel] = (
            weakref.WeakValueDictionary()
        )

    def get(
        self, namespace: str, name: str, generation: int | None, raw: Mapping[str, Any]
    ) -> WorkloadSizingSpec:
        """The validated spec; raises ValidationError, and then validates again next time."""
        known = self._specs.get((namespace, name))
        if known is not None and generation is not None and known[0] == generation:
            return known[1]
        spec = self._sharing_parts(WorkloadSizingSpec.model_validate(raw))
        if generation is not None:
            self._specs[(namespace, name)] = (generation, spec)
        return spec

    def _sharing_parts(self, spec: WorkloadSizingSpec) -> WorkloadSizingSpec:
        shared = {}
        for section in SHARED_SECTIONS:
            part: BaseModel = getattr(spec, section)
            shared[section] = self._parts.setdefault((section, part.model_dump_json()), part)
        return spec.model_copy(update=shared)

    def forget(self, namespace: str, name: str) -> None:
        self._specs.pop((namespace, name), None)


@dataclass
class Memory:
    """What this process remembers of each workload between its turns. None of it needs to
    survive a restart: what must (the decision history, the reshape in flight) lives in the
    status and on the target."""

    specs: SpecCache = field(default_factory=SpecCache)
    # when this process last decided each workload: see History.decided_at
    decided: dict[tuple[str, str], float] = field(default_factory=dict)
    # the resourceVersion of each workload's target as the watch showed it when a scale write
    # found the API server's copy newer: see watched_target
    watch_behind: dict[tuple[str, str], str] = field(default_factory=dict)
    watch_lagging: set[tuple[str, str]] = field(default_factory=set)  # said: see first_lag
    # the activator port this process gave each workload, before its status shows it
    activator_ports: dict[tuple[str, str], int] = field(default_factory=dict)
    # what each workload's status says it measured, shared by those serving alike: refilled
    # from the statuses within a sync period of a restart
    throughput: ThroughputBook = field(default_factory=ThroughputBook)
    # workloads whose last turn found a query failing: see first_failure
    failing: set[tuple[str, str]] = field(default_factory=set)
    # each workload's last answer to its wake query, and when: see wake_answer
    wake_answers: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)

    def forget(self, namespace: str, name: str) -> None:
        self.throughput.forget((namespace, name))
        self.decided.pop((namespace, name), None)
        self.specs.forget(namespace, name)
        self.watch_behind.pop((namespace, name), None)
        self.activator_ports.pop((namespace, name), None)
        self.watch_lagging.discard((namespace, name))
        self.failing.discard((namespace, name))
        self.wake_answers.pop((namespace, name), None)

    def wake_answer(
        self,
        namespace: str,
        name: str,
        answer: tuple[float | None, Problem | None],
        now: float,
        max_age: float,
    ) -> tuple[float | None, Problem | None]:
        """The wake query's answer, or, while Prometheus cannot be reached, the last one it
        gave for as long as a sample stays fresh (`maxSampleAgeSeconds`): a pod's samples ride
        out a slow Prometheus in the shared read, and a workload at zero, whose wake query is
        its own, said its metrics lost and back within seconds (the soak, seed 30). A query
        Prometheus refuses is said at once."""
        key = (namespace, name)
        value, problem = answer
        if problem is None and value is not None:
            self.wake_answers[key] = (value, now)
            return answer
        last = self.wake_answers.get(key)
        if (
            problem is not None
            and problem.reason is Reason.PROMETHEUS_UNREACHABLE
            and last is not None
            and now - last[1] <= max_age
        ):
            return last[0], None
        return answer

    def first_failure(self, namespace: str, name: str, failing: bool) -> bool:
        """Whether this turn is the first of a run of turns whose queries fail. A query sent
        just after Prometheus stopped answering fails before the next shared read can say the
        outage is Prometheus's: the first failing turn holds the replicas without saying so in
        the status, and the next says it, damped if the outage is Prometheus's (report.turn)."""
        key = (namespace, name)
        if not failing:
            self.failing.discard(key)
            return False
        if key in self.failing:
            return False
        self.failing.add(key)
        return True

    def watched_target(
        self, namespace: str, name: str, ref: TargetRef, view: ClusterView
    ) -> TargetView | None:
        """The watch's copy of the target, unless a write found it out of date and the watch
        has shown nothing newer since. A watch whose connection a partition left silent shows
        an old copy until kopf's inactivity timeout: deciding on that copy meant a conflicting
        write every turn and no scaling at all."""
        cached = view.target(namespace, ref)
        behind = self.watch_behind.get((namespace, name))
        if cached is None or behind is None:
            return cached
        if cached.resource_version == behind:
            return None
        del self.watch_behind[(namespace, name)]
        self.watch_lagging.discard((namespace, name))
        return cached

    def first_lag(self, namespace: str, name: str) -> bool:
        """Whether a turn finds the watch behind the target's last change for the first time
        since that change: it normally shows a change within milliseconds, long before the
        next turn, so a watch still behind then is lagging, or left silent (said once)."""
        key = (namespace, name)
        if key not in self.watch_behind or key in self.watch_lagging:
            return False
        self.watch_lagging.add(key)
        return True

    def found_behind(self, namespace: str, name: str, watched: TargetView) -> None:
        """The API server's copy of the target is newer than the watch's: a write found it so,
        or made it so."""
        self.watch_behind[(namespace, name)] = watched.resource_version
        self.watch_lagging.discard((namespace, name))
