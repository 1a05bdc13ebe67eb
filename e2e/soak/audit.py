"""What the operator did, from the API server's audit log (e2e/cluster/audit.go), read as it
grows: the operator's own account of its writes is never asked."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Action:
    """One request of the operator, as the API server answered it."""

    time: float  # when the API server answered (stageTimestamp), epoch seconds
    verb: str  # update, patch, create, list, ...
    resource: str  # deployments, events, workloadsizings, pods, ...
    subresource: str  # scale, status, or ""
    namespace: str
    name: str
    code: int
    request: Mapping[str, Any] | None = None
    response: Mapping[str, Any] | None = None

    @property
    def succeeded(self) -> bool:
        return 200 <= self.code < 300

    def replicas_requested(self) -> int | None:
        """The replicas a /scale update or a template patch asks for, if any."""
        spec = (self.request or {}).get("spec")
        if isinstance(spec, Mapping) and isinstance(spec.get("replicas"), int):
            return int(spec["replicas"])
        return None

    def annotation(self, key: str) -> str | None:
        """An annotation the request sets."""
        meta = (self.request or {}).get("metadata")
        annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
        value = annotations.get(key) if isinstance(annotations, Mapping) else None
        return value if isinstance(value, str) else None

    def changes_template(self) -> bool:
        spec = (self.request or {}).get("spec")
        return isinstance(spec, Mapping) and "template" in spec

    def event(self) -> tuple[str, str, str] | None:
        """(involved object's namespace/name, type, reason) of an Event the request creates."""
        if self.resource != "events" or self.verb != "create" or not self.request:
            return None
        involved = self.request.get("involvedObject") or self.request.get("regarding") or {}
        who = f"{involved.get('namespace', self.namespace)}/{involved.get('name', '')}"
        return who, str(self.request.get("type", "")), str(self.request.get("reason", ""))


def _epoch(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def parse(line: str) -> Action | None:
    """One audit event (a JSON line); None for what is not a completed request."""
    try:
        raw = json.loads(line)
    except json.JSONDecodeError:
        return None
    if raw.get("stage") != "ResponseComplete":
        return None
    ref = raw.get("objectRef") or {}
    return Action(
        time=_epoch(raw["stageTimestamp"]),
        verb=str(raw.get("verb", "")),
        resource=str(ref.get("resource", "")),
        subresource=str(ref.get("subresource", "")),
        namespace=str(ref.get("namespace", "")),
        name=str(ref.get("name", "")),
        code=int((raw.get("responseStatus") or {}).get("code", 0)),
        request=raw.get("requestObject"),
        response=raw.get("responseObject"),
    )


class AuditLog:
    """The audit log, read from where the last read stopped (a line still being written is
    left for the next read)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0

    def skip_to_end(self) -> None:
        self._offset = self.path.stat().st_size if self.path.exists() else 0

    def read(self) -> list[Action]:
        if not self.path.exists():
            return []
        with self.path.open("rb") as f:
            f.seek(self._offset)
            data = f.read()
        end = data.rfind(b"\n") + 1
        self._offset += end
        actions = []
        for line in data[:end].decode(errors="replace").splitlines():
            action = parse(line)
            if action is not None:
                actions.append(action)
        return actions
