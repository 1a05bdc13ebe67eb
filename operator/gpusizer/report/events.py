"""Events the operator wants posted; the handler posts them through kopf."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gpusizer.vocabulary import EventReason


@dataclass(frozen=True)
class EventIntent:
    type: Literal["Normal", "Warning"]
    reason: EventReason
    message: str
