"""Objects from the API server kept past their event, made to share their strings. Pure.

The JSON decoder shares a key between the dicts of one document but not of two, so every
WorkloadSizing, pod template and label set kept holds its own copy of each key and of each
repeated value ("Ready", a timestamp, an image). Shared, a kept object takes about half the
memory (bench/README.md, "Issue 29: a failed scrape is not a lost metric; kept objects share
their strings").
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

# Longer strings are seldom repeated (a message, a last-applied-configuration); a uid or a
# timestamp is shorter, and a unique one costs its interned entry only while it is alive.
LONGEST_SHARED = 64


def compact(tree: Any) -> Any:
    """A copy of a decoded JSON tree whose keys and short strings are the interpreter's one
    copy of each (`sys.intern`), made of plain dicts and lists: a kopf Body or any other
    mapping becomes a dict."""
    if isinstance(tree, str):
        return sys.intern(tree) if len(tree) <= LONGEST_SHARED else tree
    if isinstance(tree, Mapping):
        return {sys.intern(str(key)): compact(value) for key, value in tree.items()}
    if isinstance(tree, list):
        return [compact(item) for item in tree]
    return tree


def compact_dict(tree: Mapping[str, Any]) -> dict[str, Any]:
    """`compact` of a mapping, typed as the dict it returns."""
    compacted: dict[str, Any] = compact(tree)
    return compacted
