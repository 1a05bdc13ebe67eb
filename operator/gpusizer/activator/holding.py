"""What the activator holds for each workload: the route the operator gave it, the workload's
ready backends, and the requests waiting for one, first come first served.

No I/O: the HTTP side asks `Workload.backend()` for a place to send a request, and
`Workload.hold()` waits for one within the workload's bounds; the watches say when backends
appear (`serve`) or the workload goes (`close`). `changed` is called whenever the number held
changes, for the push to the operator and the metrics.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from gpusizer.activation import service_of, uses_activator
from gpusizer.api.v1alpha1 import WorkloadSizingSpec

WorkloadKey = tuple[str, str]  # namespace, name

# Retry-After, in seconds, by why a request was not served (docs/concepts.md)
RETRY_FULL_SECONDS = 10  # the workload is starting: some held requests will be on their way
RETRY_TIMED_OUT_SECONDS = 30  # a long start is not over: try again in a while
RETRY_DRAINING_SECONDS = 1  # another activator replica takes it at once


@dataclass(frozen=True)
class Route:
    """A workload as the activator serves it: from its WorkloadSizing's spec and status."""

    namespace: str
    name: str
    service: str
    service_port: str | None  # the name of the Service's port, as its EndpointSlices give it
    port: int | None  # the activator's port for it, once the operator gave one out
    max_pending: int
    hold_timeout: float

    @property
    def key(self) -> WorkloadKey:
        return self.namespace, self.name


def route_of(obj: Mapping[str, Any]) -> Route | None:
    """The route of a WorkloadSizing that uses the activator; None for any other, or one whose
    spec is invalid (the operator says why in its status)."""
    meta = obj.get("metadata") or {}
    try:
        spec = WorkloadSizingSpec.model_validate(obj.get("spec") or {})
    except ValidationError:
        return None
    if not uses_activator(spec):
        return None
    status = (obj.get("status") or {}).get("activator") or {}
    port = status.get("port")
    service_port = status.get("servicePort")
    activator = spec.scale_to_zero.activator
    return Route(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        service=service_of(spec),
        service_port=service_port if isinstance(service_port, str) else None,
        port=port if isinstance(port, int) else None,
        max_pending=activator.max_pending_requests,
        hold_timeout=float(activator.hold_timeout_seconds),
    )


class Refused(Exception):
    """A request the activator answers itself: the status, why, and when to try again."""

    def __init__(self, status: int, why: str, retry_after: int | None, outcome: str) -> None:
        super().__init__(why)
        self.status = status
        self.why = why
        self.retry_after = retry_after
        self.outcome = outcome  # gpusizer_activator_requests_total's label


class Workload:
    """One workload's backends and the requests held for one."""

    def __init__(
        self,
        route: Route,
        changed: Callable[[Workload], None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.route = route
        self.backends: tuple[str, ...] = ()  # "address:port" of the ready replicas
        self._next = 0
        # in arrival order; a dict, so one that leaves from the middle goes in O(1)
        self._held: dict[int, tuple[float, asyncio.Future[str]]] = {}
        self._count = itertools.count()
        self._changed = changed
        self._clock = clock
        self.gone: str | None = None  # why it is gone, once it is

    @property
    def pending(self) -> int:
        return len(self._held)

    @property
    def since(self) -> float | None:
        """When the oldest request held arrived (wall clock)."""
        for arrived, _ in self._held.values():
            return arrived
        return None

    def backend(self) -> str | None:
        """A ready replica, in turn; None while there is none."""
        if not self.backends:
            return None
        self._next = (self._next + 1) % len(self.backends)
        return self.backends[self._next]

    async def hold(self, arrived: float) -> str:
        """Waits for a ready replica within the bounds; raises Refused past one."""
        route = self.route
        if self.gone is not None:
            raise Refused(503, self.gone, None, "workload_gone")
        if len(self._held) >= route.max_pending:
            raise Refused(
                503,
                f"{route.namespace}/{route.name} has no ready replica yet and this activator "
                f"already holds {len(self._held)} requests for it (maxPendingRequests "
                f"{route.max_pending})",
                RETRY_FULL_SECONDS,
                "full",
            )
        waiter: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        number = next(self._count)
        self._held[number] = (arrived, waiter)
        self._changed(self)
        try:
            remaining = route.hold_timeout - (self._clock() - arrived)
            async with asyncio.timeout(max(0.0, remaining)):
                return await waiter
        except TimeoutError:
            raise Refused(
                504,
                f"{route.namespace}/{route.name} had no ready replica within "
                f"holdTimeoutSeconds ({route.hold_timeout:g} s)",
                RETRY_TIMED_OUT_SECONDS,
                "hold_timeout",
            ) from None
        finally:
            if self._held.pop(number, None) is not None:  # left before it was served
                self._changed(self)

    def serve(self, backends: tuple[str, ...]) -> None:
        """The ready replicas now; the requests held go to them, oldest first."""
        self.backends = backends
        if not backends or not self._held:
            return
        held, self._held = self._held, {}
        for _, waiter in held.values():
            if not waiter.done():  # done: its client left, or it timed out, a moment ago
                backend = self.backend()
                assert backend is not None
                waiter.set_result(backend)
        self._changed(self)

    def close(self, why: str) -> None:
        """The workload is gone (deleted, or no longer uses the activator): every request held
        is answered at once, and so is every one that comes."""
        self.gone = why
        self._refuse_all(lambda: Refused(503, why, None, "workload_gone"))

    def stop(self, why: str) -> None:
        """The activator stops before a replica came: every request held is answered, to be
        tried again at another activator replica."""
        self._refuse_all(lambda: Refused(503, why, RETRY_DRAINING_SECONDS, "draining"))

    def _refuse_all(self, refusal: Callable[[], Refused]) -> None:
        held, self._held = self._held, {}
        for _, waiter in held.values():
            if not waiter.done():
                waiter.set_exception(refusal())
        if held:
            self._changed(self)
