"""The soak's judge: every /scale and pod-template write the operator made (audit.py), held
against what was true when it was made: each workload's rules as the harness set them, the
faults the harness injected, and the demand the emulator served.

It imports nothing of the operator: its rules are the product's promises (docs/concepts.md,
"Behaviour users can rely on"), written again from outside, and a test fails the operator on
them, not on what the operator says of itself.

A wrong action is one of: a write to a workload in Recommend mode, paused, or owned by another
autoscaler; a write while its spec was invalid; a count outside min and max; a scale-down or a
scale to zero while its metrics were unknown to the operator (a slice change is not one: its
replicas are of another slice); a write that changes nothing (a
second write for one decision); a reshape started while another is in flight; a scale-up owed
for longer than `owed_bound_seconds` while nothing excused the operator.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from e2e.soak.audit import Action

RESHAPE_ANNOTATION = "gpusizer.io/reshape"
# reasons of the Events a workload's load causes; any other says something went wrong
# a rollback is the end of a reshape the load asked for, one per ReshapeStarted: seed 33's five,
# whose slice had no capacity, were judged the first fault's (2026-11-26)
LOAD_EVENTS = frozenset(
    {"Scaled", "ScaledToZero", "Woke", "ReshapeStarted", "Reshaped", "ReshapeRolledBack"}
)


@dataclass(frozen=True)
class Rules:
    """A WorkloadSizing as the harness made it."""

    name: str
    minimum: int
    maximum: int
    scale_to_zero: bool = False
    hands_off: str = ""  # why the operator must never write to it: Recommend, paused, HPA
    target_utilization: float = 70.0
    tolerance: float = 0.1


@dataclass
class Window:
    """A stretch of time in which something was true of some workloads (None: all of them).

    kind: `unknown` (their metrics were unknown to the operator), `invalid` (their spec was),
    `held` (the operator could not act: no API server, no leader, ...)."""

    kind: str
    fault: str
    start: float
    names: frozenset[str] | None = None
    end: float | None = None

    def covers(self, name: str, t: float, before: float = 0.0, after: float = 0.0) -> bool:
        if self.names is not None and name not in self.names:
            return False
        return self.start + before <= t and (self.end is None or t <= self.end + after)


@dataclass(frozen=True)
class WrongAction:
    time: float
    workload: str
    rule: str
    detail: str


@dataclass
class _Owed:
    since: float | None = None  # when the operator started to owe the scale-up
    last: float | None = None  # the last sample that saw it owed
    accrued: float = 0.0  # owed time not excused by a fault
    flagged: bool = False
    seen: tuple[float, int, float] = (0.0, 0, 0.0)  # the last sample: rps, replicas, capacity


@dataclass
class Checker:
    """Feed it the harness's own changes (`set_replicas`, `window`), the audit log's actions
    (`observe`) and the emulator's demand (`demand`); read `wrong`.

    `grace_seconds`: how long after a window opens a write may still come from a decision
    taken before it (a read period, the decision, the request).
    """

    rules: dict[str, Rules]
    grace_seconds: float = 10.0
    owed_bound_seconds: float = 90.0
    excuse_after_seconds: float = 30.0  # a held or unknown stretch excuses owing this long after
    replicas: dict[str, int] = field(default_factory=dict)  # as the target has them now
    windows: list[Window] = field(default_factory=list)
    wrong: list[WrongAction] = field(default_factory=list)
    writes: int = 0
    conflicts: int = 0
    failed_writes: int = 0
    events: list[tuple[float, str, str, str]] = field(default_factory=list)
    status_patches: list[tuple[float, str]] = field(default_factory=list)
    lists: list[tuple[float, str]] = field(default_factory=list)
    scale_ups: list[tuple[float, str]] = field(default_factory=list)
    reshapes: dict[str, str] = field(default_factory=dict)  # in flight: target -> started
    owed: dict[str, _Owed] = field(default_factory=dict)
    episodes: list[tuple[str, float, float]] = field(default_factory=list)  # owed: from, until
    # since when a workload's last write may be missing from the audit log: a SIGKILLed API
    # server can apply a write it never audits (the soak, seed 28: a /scale PUT to 3 landed
    # unaudited, and the operator's next write, to 2, read as one that changed nothing)
    unaudited: dict[str, float] = field(default_factory=dict)

    def audit_may_have_lost(self, t: float) -> None:
        """The API server was killed at `t`: until a workload's next write after it, what its
        target has is unknown, and that write is judged without it."""
        self.unaudited = dict.fromkeys(self.rules, t)

    def set_replicas(self, name: str, replicas: int) -> None:
        """The harness made the target (again) with these replicas."""
        self.replicas[name] = replicas
        self.reshapes.pop(name, None)

    def window(
        self, kind: str, fault: str, start: float, names: Iterable[str] | None = None
    ) -> Window:
        """Opens a window; the caller sets its `end`."""
        opened = Window(kind, fault, start, None if names is None else frozenset(names))
        self.windows.append(opened)
        return opened

    def _in(self, kind: str, name: str, t: float, before: float, after: float = 0.0) -> Window:
        found = [w for w in self.windows if w.kind == kind and w.covers(name, t, before, after)]
        return found[0] if found else _NONE

    def observe(self, action: Action) -> None:
        if action.resource == "events" and action.verb == "create":
            event = action.event()
            if event is not None:
                self.events.append((action.time, *event))
        elif action.resource == "workloadsizings" and action.subresource == "status":
            if action.succeeded and action.verb in ("patch", "update"):
                self.status_patches.append((action.time, action.name))
        elif action.verb == "list":
            if action.succeeded:  # a list refused by a server shutting down relists nothing
                self.lists.append((action.time, action.resource))
        elif action.resource in ("deployments", "statefulsets") and action.verb in (
            "update",
            "patch",
        ):
            self._write(action)

    def _write(self, action: Action) -> None:
        name, t = action.name, action.time
        rules = self.rules.get(name)
        if rules is None:
            return
        if action.code == 409:
            self.conflicts += 1
            return
        if not action.succeeded:
            self.failed_writes += 1
            return
        wanted = action.replicas_requested()
        record = action.annotation(RESHAPE_ANNOTATION)
        if wanted is None and record is None:
            return  # another annotation
        self.writes += 1
        before = self.replicas.get(name)
        lost_since = self.unaudited.get(name)
        if lost_since is not None:
            before = None
            if t > lost_since:
                del self.unaudited[name]

        def flag(rule: str, detail: str) -> None:
            self.wrong.append(WrongAction(t, name, rule, detail))

        if rules.hands_off:
            flag("hands off", f"written while {rules.hands_off}")
        invalid = self._in("invalid", name, t, self.grace_seconds)
        if invalid is not _NONE:
            flag("invalid spec", f"written while its spec was invalid ({invalid.fault})")
        if wanted is not None:
            below = wanted < rules.minimum and not (wanted == 0 and rules.scale_to_zero)
            if below or wanted > rules.maximum:
                flag("bounds", f"{wanted} replicas, outside {rules.minimum}..{rules.maximum}")
            # a slice change (a reshape, or its rollback at the deadline) sets the replicas of
            # another slice: fewer of a bigger one is no scale-down
            if before is not None and wanted < before and not action.changes_template():
                unknown = self._in("unknown", name, t, self.grace_seconds)
                if unknown is not _NONE:
                    what = "scale to zero" if wanted == 0 else "scale-down"
                    flag(
                        "unknown metrics",
                        f"{what} {before} -> {wanted} while its metrics were unknown "
                        f"({unknown.fault} since {t - unknown.start:.0f}s)",
                    )
            if before is not None and wanted == before and not action.changes_template():
                flag("duplicate", f"set {wanted} replicas, which it already had")
            if before is not None and wanted > before:
                self.scale_ups.append((t, name))
            written = ((action.response or {}).get("spec") or {}).get("replicas", wanted)
            self.replicas[name] = int(written)
        if record is not None:
            self._reshape(name, t, record, action.changes_template(), flag)

    def _reshape(
        self, name: str, t: float, raw: str, template: bool, flag: Callable[[str, str], None]
    ) -> None:
        try:
            record = json.loads(raw)
        except json.JSONDecodeError:
            flag("reshape", f"unreadable reshape record {raw[:80]!r}")
            return
        state, started = record.get("state"), str(record.get("started"))
        if state == "InProgress" and template:
            if name in self.reshapes:
                flag(
                    "reshape twice",
                    f"a reshape started at {started} while the one of {self.reshapes[name]} "
                    "was in flight",
                )
            self.reshapes[name] = started
        elif state in ("Done", "RolledBack"):
            self.reshapes.pop(name, None)

    def demand(
        self, t: float, name: str, rps: float, capacity_rps: float, unplaced: bool = False
    ) -> None:
        """The requests per second the workload was asked for (a mean over the recent past)
        and what one of its replicas serves: a scale-up is owed when its replicas at the
        target utilisation (and tolerance) serve less, or it is at zero with demand; not while
        one of its replicas waits for a place (`unplaced`: the scale-up was written, or there
        is no room for more of its slice, and another replica would not serve)."""
        rules = self.rules.get(name)
        replicas = self.replicas.get(name)
        owed = self.owed.setdefault(name, _Owed())
        if rules is None or rules.hands_off or replicas is None:
            return
        serves = replicas * capacity_rps * rules.target_utilization / 100 * (1 + rules.tolerance)
        short = (
            not unplaced and replicas < rules.maximum and (rps > serves if replicas else rps > 0.05)
        )
        if not short:
            if owed.since is not None:
                self.episodes.append((name, owed.since, t))
            owed.since = owed.last = None
            owed.accrued, owed.flagged = 0.0, False
            return
        owed.seen = (rps, replicas, capacity_rps)
        if owed.since is None:
            owed.since = t
        elif owed.last is not None and not self.excused(name, t):
            owed.accrued += t - owed.last
        owed.last = t
        if owed.accrued > self.owed_bound_seconds and not owed.flagged:
            owed.flagged = True
            self.wrong.append(
                WrongAction(
                    t,
                    name,
                    "scale-up owed",
                    f"{rps:.1f} rps on {replicas} replica(s) of {capacity_rps:g} rps for "
                    f"{owed.accrued:.0f}s not excused by a fault (bound "
                    f"{self.owed_bound_seconds:g}s)",
                ),
            )

    def excused(self, name: str, t: float) -> bool:
        """Whether the operator could not be expected to act on `name` at `t`."""
        return name in self.reshapes or any(
            w.covers(name, t, after=self.excuse_after_seconds) for w in self.windows
        )

    def still_owed(self) -> list[dict[str, Any]]:
        """The scale-ups owed when the soak ended: how long, how much of it unexcused, and the
        last demand seen."""
        return [
            {
                "workload": name,
                "since": o.since,
                "accrued_s": round(o.accrued, 1),
                "rps": round(o.seen[0], 2),
                "replicas": o.seen[1],
                "capacity_rps": round(o.seen[2], 2),
            }
            for name, o in sorted(self.owed.items())
            if o.since is not None
        ]

    def owed_at(self, t: float) -> dict[str, float | None]:
        """The workloads owed a scale-up at `t`, each with when it stopped being owed (None:
        still owed)."""
        found: dict[str, float | None] = {
            name: until for name, since, until in self.episodes if since <= t < until
        }
        for name, o in self.owed.items():
            if o.since is not None and o.since <= t:
                found[name] = None
        return found


_NONE = Window("", "", 0.0, frozenset())
