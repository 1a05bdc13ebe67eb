"""The activator's own Prometheus metrics (docs/operations.md), in a registry of their own:
the process imports modules that register the operator's series, which it does not serve."""

from __future__ import annotations

import contextlib

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

REGISTRY = CollectorRegistry()

PENDING = Gauge(
    "gpusizer_activator_pending_requests",
    "Requests this activator replica holds for a workload that has no ready replica: a wake "
    "signal the operator could also read from Prometheus.",
    ["namespace", "workload"],
    registry=REGISTRY,
)
REQUESTS = Counter(
    "gpusizer_activator_requests",
    "Requests that reached the activator, by workload and outcome: proxied (a replica was "
    "ready), released (held, then forwarded), full, hold_timeout, workload_gone, draining, "
    "client_gone, bad_gateway.",
    ["namespace", "workload", "outcome"],
    registry=REGISTRY,
)
HOLD_SECONDS = Histogram(
    "gpusizer_activator_hold_seconds",
    "How long requests were held before a replica was ready (or they were answered without).",
    ["namespace", "workload"],
    buckets=(0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600),
    registry=REGISTRY,
)
OUTCOMES = (
    "proxied",
    "released",
    "full",
    "hold_timeout",
    "workload_gone",
    "draining",
    "client_gone",
    "bad_gateway",
)


def forget(namespace: str, workload: str) -> None:
    """A workload the activator no longer serves keeps no series."""
    series: list[tuple[Gauge | Counter | Histogram, tuple[str, ...]]] = [
        (PENDING, ()),
        (HOLD_SECONDS, ()),
        *((REQUESTS, (outcome,)) for outcome in OUTCOMES),
    ]
    for family, more in series:
        with contextlib.suppress(KeyError):  # never labelled with it
            family.remove(namespace, workload, *more)


REFUSED = Counter(
    "gpusizer_activator_refused_requests",
    "Requests refused before they were held or forwarded: not_found (no workload on that port "
    "or Host), too_large (413), header_timeout (408).",
    ["reason"],
    registry=REGISTRY,
)
