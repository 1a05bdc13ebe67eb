"""The operator's I/O edge: what a turn needs from Prometheus, the scaled targets and the
WorkloadSizing status, as Protocols.

The operator runs `signals.prometheus.PrometheusSource`, `actuate.targets.Targets` and
`report.writer.StatusWriter`; tests run the in-memory fakes in tests/fakes.py, so every branch
of a turn has a fast test.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from gpusizer.actuate.target_view import SliceChange, TargetView
from gpusizer.api.v1alpha1 import TargetRef
from gpusizer.signals.parse import PodSamples, Problem
from gpusizer.signals.queries import PodQuery


class MetricsSource(Protocol):
    async def per_pod_batch(
        self, wanted: Mapping[str, PodQuery]
    ) -> tuple[dict[str, PodSamples], dict[str, Problem]]:
        """Each signal's samples per pod; a signal whose query failed is in the second dict,
        with the reason, never in the first."""
        ...

    async def scalar(self, promql: str) -> tuple[float | None, Problem | None]:
        """One value (a wake query's): a number, or the reason there is none."""
        ...


class TargetClient(Protocol):
    """Raises `actuate.target_view.TargetProblem` (or a subclass) with the reason for the user."""

    async def read(self, namespace: str, ref: TargetRef) -> TargetView: ...

    async def write(self, namespace: str, ref: TargetRef, expected: int, replicas: int) -> None:
        """Set replicas, unless the target no longer has `expected` (ScaleConflict)."""
        ...

    async def reshape(self, namespace: str, ref: TargetRef, change: SliceChange) -> None: ...

    async def annotate(
        self, namespace: str, ref: TargetRef, annotations: Mapping[str, str]
    ) -> None: ...


class StatusSink(Protocol):
    async def write(self, namespace: str, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        """Merge-patch a WorkloadSizing's status; returns the status as stored. Raises
        `report.writer.StatusNotWritten`."""
        ...
