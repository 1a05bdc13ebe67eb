"""RFC 3339 times as Kubernetes writes them, to and from seconds since the epoch."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any


def iso(seconds: float) -> str:
    return (
        datetime.fromtimestamp(seconds, tz=UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    )


def iso_millis(seconds: float) -> str:
    """To the millisecond: for the times a wake's latency is measured between."""
    return (
        datetime.fromtimestamp(seconds, tz=UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


def parse_time(value: Any) -> float | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()
