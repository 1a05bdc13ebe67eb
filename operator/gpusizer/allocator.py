"""The C allocator under the interpreter: big blocks mapped, fewer arenas, and what a burst
freed given back. Python's own small objects are not here (pymalloc's arenas); this is the
rest: large dicts and lists, strings, buffers.

glibc raises its mmap threshold to the largest block freed, so each cycle's megabytes of
Prometheus responses came from the heap, whose freed pages it keeps: pinned at its default,
the operator's steady RSS is lower (bench/README.md). It also gives each thread that
allocates an arena of its own, up to eight per core, and returns freed memory only from the
top of each. The operator parses watch events, status writes and Prometheus answers in dozens
of threads: 16 arenas at 5,000 workloads (bench/README.md, "Issue 29: what the bursts leave
resident"). Under the GIL the threads seldom allocate at the same moment, so two arenas
should cost little waiting (the scale bench runs with them).

Without glibc (musl, macOS) each call does nothing and says so.
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import logging
import os
import time
from collections.abc import Mapping

log = logging.getLogger(__name__)

MMAP_THRESHOLD_BYTES = 128 * 1024  # glibc's default, which it would otherwise raise
ARENAS = 2
GIVE_BACK_SECONDS = 30.0  # a burst's memory is back within this long
M_MMAP_THRESHOLD = -3  # mallopt's parameter numbers, <malloc.h>
M_ARENA_MAX = -8


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None)  # the symbols the process has loaded
    except OSError:
        return None
    if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim"):
        return libc
    return None


def pin_mmap_threshold() -> bool:
    """Big blocks always mapped, and returned to the system when freed."""
    libc = _glibc()
    return libc is not None and bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))


def limit_arenas(count: int = ARENAS, environ: Mapping[str, str] = os.environ) -> bool:
    """At most `count` arenas from now on: call it before any thread starts. glibc's own
    MALLOC_ARENA_MAX, read at the process's start, wins. Whether the limit was set here."""
    libc = _glibc()
    if libc is None or "MALLOC_ARENA_MAX" in environ:
        return False
    return bool(libc.mallopt(M_ARENA_MAX, count))


def give_back() -> bool:
    """Returns every whole free page of every arena to the system (malloc_trim): whether any
    was returned."""
    libc = _glibc()
    return libc is not None and bool(libc.malloc_trim(0))


async def give_back_every(seconds: float = GIVE_BACK_SECONDS) -> None:
    """`give_back` in a worker thread every `seconds` (ctypes lets go of the GIL for it, so
    the event loop goes on), until cancelled."""
    if _glibc() is None:
        log.info("not glibc: memory freed after a burst stays with the allocator")
        return
    while True:
        await asyncio.sleep(seconds)
        started = time.monotonic()
        returned = await asyncio.to_thread(give_back)
        log.debug(
            "malloc_trim took %.1f ms (%s)",
            1000 * (time.monotonic() - started),
            "memory returned" if returned else "nothing to return",
        )
