"""The slice choice and the reshape rollback rule, as tables of (situation, outcome)."""

from __future__ import annotations

from typing import Any

import pytest
from gpusizer.api.v1alpha1 import RightSizingSpec
from gpusizer.catalog import Slice, load_catalog
from gpusizer.policy.reshape import NewPods, Progress, reshape_progress
from gpusizer.policy.slices import Offer, Usage, choose_slice, memory_need
from gpusizer.vocabulary import Reason

CATALOG = load_catalog()
NOW = 1_800_000_000.0


def slice_(name: str, product: str = "h100-80gb") -> Slice:
    found = CATALOG.slice(name, product)
    assert found is not None, (name, product)
    return found


H100 = slice_("gpu-h100")
MIG_1G = slice_("mig-1g.10gb")
MIG_2G = slice_("mig-2g.20gb")
MIG_3G = slice_("mig-3g.40gb")
L4 = slice_("gpu-l4", "l4")


def usage(**kw: Any) -> Usage:
    base: dict[str, Any] = dict(
        peak_memory_mib=12 * 1024,
        mean_utilization=10.0,
        served_rps=1.0,
        replicas=2,
        oom_kills=0,
        coverage=1.0,
    )
    return Usage(**{**base, **kw})


def spec(**kw: Any) -> RightSizingSpec:
    return RightSizingSpec.model_validate({"mode": "Auto", **kw})


def offers(*pairs: tuple[Slice, int]) -> list[Offer]:
    return [Offer(s, n) for s, n in pairs]


ALL_FREE = offers((H100, 8), (MIG_1G, 16), (MIG_2G, 8), (MIG_3G, 8), (L4, 8))
H100_FAMILY = ["gpu-h100", "mig-1g.10gb", "mig-2g.20gb", "mig-3g.40gb"]


def choose(current: Slice = H100, used: Usage | None = None, **kw: Any) -> Any:
    args: dict[str, Any] = dict(
        current=current,
        usage=used or usage(),
        offers=ALL_FREE,
        spec=spec(allowedSlices=H100_FAMILY),
        target_utilization=70.0,
        min_replicas=1,
        last_reshape_time=None,
        min_interval_seconds=3600,
        now=NOW,
    )
    args.update(kw)
    return choose_slice(**args)


@pytest.mark.parametrize(
    ("label", "kwargs", "reason", "slice_name", "replicas", "apply"),
    [
        # 2 H100 at 10 %: 0.2 busy H100s. On a 3g.40gb (0.48 of an H100) that is 0.42 busy:
        # 1 replica at 70 %, $1.50/h; on a 2g.20gb (0.26) 0.77 busy: 2 replicas, $1.71/h.
        # 12 GiB x 1.15 fits 20 GB but not 10 GB.
        ("fits: small MIG slice", {}, Reason.CHEAPER_SLICE, "mig-3g.40gb", 1, True),
        (
            "does not fit anywhere allowed",
            {"used": usage(peak_memory_mib=90_000)},
            Reason.NO_FITTING_SLICE,
            None,
            None,
            False,
        ),
        (
            "low confidence: reported, never applied",
            {"used": usage(coverage=0.2)},
            Reason.LOW_CONFIDENCE,
            "mig-3g.40gb",
            1,
            False,
        ),
        (
            "saving under the threshold (50 % < 60 %)",
            {
                "used": usage(mean_utilization=30.0, replicas=1),
                "spec": spec(allowedSlices=H100_FAMILY, minSavingsPercent=60),
            },
            Reason.SAVING_TOO_SMALL,
            "mig-3g.40gb",
            1,
            False,
        ),
        (
            "nothing free for the better slices",
            {"offers": offers((H100, 0), (MIG_2G, 0), (MIG_3G, 0), (MIG_1G, 16))},
            Reason.NO_FREE_CAPACITY,
            "mig-3g.40gb",
            1,
            False,
        ),
        (
            "moved too recently",
            {"last_reshape_time": NOW - 60},
            Reason.TOO_SOON,
            "mig-3g.40gb",
            1,
            False,
        ),
        (
            "already the cheapest",
            {"current": MIG_2G, "used": usage(replicas=1, mean_utilization=50.0)},
            Reason.RIGHT_SIZED,
            "mig-2g.20gb",
            1,
            False,
        ),
        (
            "no memory samples",
            {"used": usage(peak_memory_mib=None)},
            Reason.NO_MEASUREMENT,
            None,
            None,
            False,
        ),
        (
            "OOM moves up even without savings, even with little history",
            {
                "current": MIG_1G,
                "used": usage(
                    peak_memory_mib=None,
                    mean_utilization=None,
                    replicas=1,
                    oom_kills=3,
                    coverage=0.0,
                ),
            },
            Reason.OUT_OF_MEMORY,
            "mig-2g.20gb",
            1,
            True,
        ),
        (
            "without an allow-list the cheapest fitting GPU of any product wins",
            {"spec": spec(), "used": usage(mean_utilization=2.0, replicas=1)},
            Reason.CHEAPER_SLICE,
            "gpu-l4",
            1,
            True,
        ),
    ],
)
def test_choice(
    label: str,
    kwargs: dict[str, Any],
    reason: Reason,
    slice_name: str | None,
    replicas: int | None,
    apply: bool,
) -> None:
    choice = choose(**kwargs)
    assert choice.reason == reason, f"{label}: {choice.message}"
    got = choice.recommended
    assert (got.slice.name if got else None) == slice_name, label
    assert (got.replicas if got else None) == replicas, label
    assert choice.apply is apply, label
    assert choice.message


def test_oom_memory_need_exceeds_the_current_slice() -> None:
    need = memory_need(MIG_1G, usage(peak_memory_mib=5000, oom_kills=1), 15)
    assert need is not None and need > MIG_1G.memory_mib


def test_costs_are_replicas_times_price() -> None:
    choice = choose()
    assert choice.current_cost_per_hour == pytest.approx(2 * H100.price_per_hour)
    assert choice.recommended.cost_per_hour == pytest.approx(MIG_3G.price_per_hour)


@pytest.mark.parametrize(
    ("pods", "wanted", "elapsed", "progress"),
    [
        (NewPods(ready=2, total=2, unschedulable=[], oom_kills=0), 2, 30, Progress.DONE),
        (NewPods(ready=1, total=2, unschedulable=[], oom_kills=0), 2, 30, Progress.WAITING),
        (
            NewPods(ready=0, total=2, unschedulable=["0/9 nodes"], oom_kills=0),
            2,
            30,
            Progress.WAITING,
        ),
        (
            NewPods(ready=0, total=2, unschedulable=["0/9 nodes"], oom_kills=0),
            2,
            601,
            Progress.ROLL_BACK,
        ),
        (NewPods(ready=1, total=2, unschedulable=[], oom_kills=0), 2, 601, Progress.ROLL_BACK),
        (NewPods(ready=0, total=0, unschedulable=[], oom_kills=0), 1, 601, Progress.ROLL_BACK),
        (NewPods(ready=0, total=1, unschedulable=[], oom_kills=1), 1, 5, Progress.ROLL_BACK),
    ],
)
def test_rollback_rule(pods: NewPods, wanted: int, elapsed: float, progress: Progress) -> None:
    got, message = reshape_progress(
        pods, wanted, started=NOW, deadline_seconds=600, now=NOW + elapsed
    )
    assert got == progress
    if got == Progress.ROLL_BACK and pods.unschedulable:
        assert "could not be scheduled: 0/9 nodes" in message
