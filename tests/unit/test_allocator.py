"""glibc's allocator as the operator sets it: each check runs in a process of its own, since an
arena limit or a trim acts on the whole process."""

from __future__ import annotations

import asyncio
import subprocess
import textwrap

import pytest
from gpusizer import allocator

from tests.support import in_a_fresh_interpreter


def run(script: str) -> subprocess.CompletedProcess[str]:
    return in_a_fresh_interpreter(textwrap.dedent(script), unset=["MALLOC_ARENA_MAX"])


ARENAS_AFTER_FOUR_THREADS = """
    import ctypes, sys, threading
    from gpusizer import allocator
    print(allocator.limit_arenas({count}))
    ready = threading.Barrier(5)
    def allocate():
        kept = [bytes(4096) for _ in range(100)]  # over pymalloc's 512 bytes: malloc's
        ready.wait()  # every thread holds its arena at once
        ready.wait()
    threads = [threading.Thread(target=allocate) for _ in range(4)]
    for t in threads:
        t.start()
    ready.wait()
    sys.stderr.flush()
    ctypes.CDLL(None).malloc_stats()  # "Arena N:" for each arena, on stderr
    ready.wait()
"""


def arenas(stderr: str) -> int:
    return sum(1 for line in stderr.splitlines() if line.startswith("Arena "))


def test_four_threads_share_the_limited_arenas() -> None:
    limited = run(ARENAS_AFTER_FOUR_THREADS.format(count=2))
    assert limited.stdout.strip() == "True"
    assert arenas(limited.stderr) == 2


def test_four_threads_take_an_arena_each_without_the_limit() -> None:
    """The check above can tell: glibc's default gives each new thread its own arena."""
    unlimited = run(ARENAS_AFTER_FOUR_THREADS.replace("allocator.limit_arenas({count})", "None"))
    assert arenas(unlimited.stderr) == 5


def test_malloc_arena_max_in_the_environment_wins() -> None:
    assert allocator.limit_arenas(2, environ={"MALLOC_ARENA_MAX": "8"}) is False


def test_give_back_returns_what_a_burst_freed_below_memory_still_held() -> None:
    script = """
        from gpusizer import allocator
        def rss_mib():
            with open("/proc/self/status") as f:
                line = next(l for l in f if l.startswith("VmRSS:"))
            return int(line.split()[1]) / 1024
        burst = [bytes(2048) for _ in range(100_000)]  # 200 MiB through malloc
        held = bytes(2048)  # allocated last: the freed memory is not at the heap's top
        del burst
        before = rss_mib()
        returned = allocator.give_back()
        print(before, rss_mib(), returned)
    """
    before, after, returned = run(script).stdout.split()
    assert returned == "True"
    assert float(before) - float(after) > 150


async def test_give_back_runs_again_every_period(monkeypatch: pytest.MonkeyPatch) -> None:
    loop, twice, calls = asyncio.get_running_loop(), asyncio.Event(), [0]

    def counted() -> bool:  # in a worker thread
        calls[0] += 1
        if calls[0] == 2:
            loop.call_soon_threadsafe(twice.set)
        return True

    monkeypatch.setattr(allocator, "give_back", counted)
    task = asyncio.create_task(allocator.give_back_every(0.01))
    await asyncio.wait_for(twice.wait(), timeout=5)  # a loop that stopped after one never sets it
    task.cancel()


def test_big_blocks_are_mapped_even_after_a_bigger_one_was_freed() -> None:
    """glibc would serve the second block from its heap, which keeps freed pages."""
    probe = """
import ctypes
from gpusizer import allocator


class MallInfo2(ctypes.Structure):  # glibc's struct mallinfo2, all ten fields
    _fields_ = [
        (f, ctypes.c_size_t)
        for f in "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"
        .split()
    ]


mallinfo2 = ctypes.CDLL(None).mallinfo2
mallinfo2.restype = MallInfo2
assert allocator.pin_mmap_threshold()
freed = bytearray(8 << 20)
del freed
kept = bytearray(6 << 20)
print(mallinfo2().hblkhd >> 20)
"""
    assert int(run(probe).stdout) >= 6
