"""The operator's log: one line per event worth reading."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator

import pytest
from gpusizer.cli import _drop_routine_success_lines, configure_logging


def _record(level: int, message: str) -> logging.LogRecord:
    return logging.LogRecord("kopf.objects", level, __file__, 1, message, None, None)


@pytest.mark.parametrize(
    ("level", "message", "kept"),
    [
        (logging.INFO, "Timer 'partition' succeeded.", False),
        (logging.ERROR, "Timer 'partition' failed with an exception. Will retry.", True),
        (logging.WARNING, "Patching failed with inconsistencies", True),
        (logging.INFO, "Handler 'workload_event' is invoked.", True),
    ],
)
def test_only_routine_success_lines_are_dropped(level: int, message: str, kept: bool) -> None:
    assert _drop_routine_success_lines(_record(level, message)) is kept


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root, objects = logging.getLogger(), logging.getLogger("kopf.objects")
    handlers, level, filters = root.handlers[:], root.level, objects.filters[:]
    yield
    root.handlers[:], objects.filters[:] = handlers, filters
    root.setLevel(level)


@pytest.mark.usefixtures("restore_logging")
@pytest.mark.parametrize("log_format", ["plain", "full", "json"])
def test_a_line_about_a_workload_names_it(log_format: str) -> None:
    configure_logging(log_format, "info")
    record = _record(logging.INFO, "Scaled: 1 -> 4")
    record.k8s_ref = {"namespace": "llm", "name": "chat", "kind": "WorkloadSizing"}  # kopf's
    line = logging.getLogger().handlers[-1].format(record)
    if log_format == "plain":
        assert line == "[llm/chat] Scaled: 1 -> 4"
    elif log_format == "full":
        assert re.fullmatch(
            r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}\] kopf\.objects +\[INFO +\] "
            r"\[llm/chat\] Scaled: 1 -> 4",
            line,
        ), line
    else:
        parsed = json.loads(line)
        assert parsed["message"] == "Scaled: 1 -> 4"
        assert parsed["object"]["namespace"] == "llm" and parsed["object"]["name"] == "chat"
