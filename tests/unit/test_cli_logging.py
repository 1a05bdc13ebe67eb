"""The operator's log: one line per event worth reading."""

from __future__ import annotations

import logging

import pytest
from gpusizer.cli import _drop_routine_timer_lines


def _record(level: int, message: str) -> logging.LogRecord:
    return logging.LogRecord("kopf.objects", level, __file__, 1, message, None, None)


@pytest.mark.parametrize(
    ("level", "message", "kept"),
    [
        (logging.INFO, "Timer 'size_workload' succeeded.", False),
        (logging.ERROR, "Timer 'size_workload' failed with an exception. Will retry.", True),
        (logging.WARNING, "Patching failed with inconsistencies", True),
        (logging.INFO, "Handler 'forget_deleted' is invoked.", True),
    ],
)
def test_only_routine_success_lines_are_dropped(level: int, message: str, kept: bool) -> None:
    assert _drop_routine_timer_lines(_record(level, message)) is kept
