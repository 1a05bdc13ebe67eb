"""bench/scale.py measures a fleet at rest: its window waits until the operator writes no more
than such a fleet does, so that a backlog of first handling or a wave of status writes is not
measured as the steady state."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from kubernetes.client.rest import ApiException
from urllib3.exceptions import ProtocolError

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import scale as bench

EVENTS = "gpusizer_kube_api_requests_total:POST"
CONDITIONS = "gpusizer_status_writes_total:status.conditions"
PATCHES = "gpusizer_kube_api_requests_total:PATCH"
BEFORE = {EVENTS: 40.0, CONDITIONS: 30.0, PATCHES: 1000.0}


def written(events: float = 0, conditions: float = 0, patches: float = 0) -> dict[str, float]:
    return {
        EVENTS: BEFORE[EVENTS] + events,
        CONDITIONS: BEFORE[CONDITIONS] + conditions,
        PATCHES: BEFORE[PATCHES] + patches,
    }


def test_a_fleet_at_rest_says_what_it_wrote() -> None:
    quiet = bench.at_rest(BEFORE, written(events=1, patches=12))
    assert quiet == "1 events, 0 conditions, 12 status patches in 10s"


@pytest.mark.parametrize(
    "after",
    [
        written(events=3),  # the first decisions' Events still going out
        written(conditions=3),
        # twenty-third session's window: 252 status patches a 13 s cycle
        written(patches=190),
    ],
)
def test_more_than_a_fleet_at_rest_writes_is_not_quiet(after: dict[str, float]) -> None:
    assert bench.at_rest(BEFORE, after) == ""


def test_the_refresh_budget_is_what_a_fleet_at_rest_may_patch() -> None:
    assert bench.at_rest(BEFORE, written(patches=100)) != ""
    assert bench.at_rest(BEFORE, written(patches=101)) == ""


def test_a_busy_api_server_is_asked_again_and_a_refusal_is_not() -> None:
    answers: list[Exception | int] = [ApiException(status=504, reason="Gateway Timeout"), 7]

    def check() -> int:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert bench.wait_for(check, timeout=60, what="decisions", interval=0) == 7
    answers[:] = [ProtocolError("Connection broken: IncompleteRead(31646909 bytes read)"), 8]
    assert bench.wait_for(check, timeout=60, what="decisions", interval=0) == 8
    answers[:] = [ApiException(status=403, reason="Forbidden")]
    with pytest.raises(ApiException, match="Forbidden"):
        bench.wait_for(check, timeout=60, what="decisions", interval=0)


@pytest.mark.parametrize("size", [100, 1000, 5000, 10000, 20000])
def test_the_bench_lists_no_faster_than_its_budget_and_as_before_up_to_5000(size: int) -> None:
    interval = bench.poll_interval(size)
    assert size / interval <= bench.LISTED_PER_SECOND
    assert interval == 5.0 or size > 5000  # figures up to 5,000 comparable with earlier runs


class SlowCluster:
    """kubectl that times out `slow` times, then applies."""

    def __init__(self, slow: int) -> None:
        self.slow = slow
        self.applied: list[int] = []

    def kubectl(self, *args: str, stdin: str = "") -> None:
        if self.slow:
            self.slow -= 1
            raise subprocess.TimeoutExpired(["kubectl", *args], 120)
        self.applied.append(len(json.loads(stdin)["items"]))


def test_a_chunk_kubectl_gave_up_on_is_applied_again_and_not_forever() -> None:
    cluster = SlowCluster(slow=2)
    bench.apply_list(cluster, [{"kind": "Deployment"}] * 300)
    assert cluster.applied == [250, 50]
    with pytest.raises(subprocess.TimeoutExpired):
        bench.apply_list(SlowCluster(slow=bench.APPLY_ATTEMPTS), [{}])
