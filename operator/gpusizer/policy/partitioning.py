"""The partition planner: per-GPU MIG layouts that hold the fleet's demand on the fewest GPUs.

Pure and deterministic. Demand is a count of slices per (product, slice kind), a kind being a
MIG profile or WHOLE; a layout holds the demand when its slices, over every GPU, cover it. The
plan re-partitions whole nodes (a node is drained as one), choosing, in this order: the least
unmet demand of running pods (a pod is never evicted without a slice to come back to), the
least unmet demand, the fewest GPUs holding the demand, the fewest GPU pods evicted (nodes
without pods first: no drain), the fewest nodes changed. It changes nothing unless that lowers
the unmet demand or the GPU count, and never proposes a layout the product cannot hold or one
with a profile outside `allowed`.

The search: nodes ordered by the pods a change would evict, each prefix of that order tried as
the set of nodes re-partitioned (their GPUs packed afresh, first fit decreasing, around what
the other nodes' layouts already hold), then every node the best set does not need dropped.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gpusizer.catalog import GPUProduct, layout_is_valid, valid_layouts
from gpusizer.catalog.migparted import GpuLayout, NodeLayout

WHOLE = "gpu"
"""The slice kind of a whole GPU (MIG disabled)."""

SliceKey = tuple[str, str]
"""(product key, slice kind)."""


@dataclass(frozen=True)
class PlanNode:
    """A node as the planner sees it: its GPUs' layouts, and the pods a change would evict."""

    name: str
    product: GPUProduct
    layout: NodeLayout
    pods: tuple[str, ...] = ()
    changeable: bool = True  # False: held at `layout` (in flight, or not ours to change)


@dataclass(frozen=True)
class NodeChange:
    node: str
    layout: NodeLayout
    pods: tuple[str, ...]
    gained: Mapping[str, int]
    lost: Mapping[str, int]


@dataclass(frozen=True)
class Plan:
    changes: tuple[NodeChange, ...]  # in the order to apply them: fewest pods first
    gpus: int
    gpus_now: int  # fewest GPUs the current layouts hold the demand on
    gpus_planned: int
    unmet_now: Mapping[SliceKey, int]
    unmet: Mapping[SliceKey, int]  # what even the planned layouts cannot hold

    @property
    def pods_moved(self) -> int:
        return sum(len(c.pods) for c in self.changes)


def slices_of(layout: GpuLayout) -> Iterable[str]:
    return (WHOLE,) if layout is None else layout


def slice_counts(layout: NodeLayout) -> Counter[str]:
    return Counter(kind for gpu in layout for kind in slices_of(gpu))


class _Fits:
    """layout_is_valid, remembered: the search asks about the same few layouts many times."""

    def __init__(self) -> None:
        self._known: dict[tuple[str, tuple[str, ...]], bool] = {}
        self._all: dict[str, list[tuple[str, ...]]] = {}

    def __call__(self, product: GPUProduct, profiles: tuple[str, ...]) -> bool:
        key = (product.key, profiles)
        found = self._known.get(key)
        if found is None:
            found = self._known[key] = layout_is_valid(product, sorted(profiles))
        return found

    def layouts(self, product: GPUProduct) -> list[tuple[str, ...]]:
        found = self._all.get(product.key)
        if found is None:
            found = self._all[product.key] = valid_layouts(product)
        return found


@dataclass(frozen=True)
class _Outcome:
    unmet_running: int
    unmet: Counter[str]
    gpus: int
    layouts: Mapping[str, NodeLayout]  # proposed, for the nodes that change
    pods: int

    def key(self) -> tuple[int, int, int, int, int]:
        return (
            self.unmet_running,
            sum(self.unmet.values()),
            self.gpus,
            self.pods,
            len(self.layouts),
        )


@dataclass
class _Product:
    """One product's nodes and demand: planned on their own, as no slice crosses products."""

    product: GPUProduct
    nodes: list[PlanNode]
    need: Counter[str]
    running: Counter[str]  # the part of `need` running pods hold now
    allowed: Collection[str]
    fits: _Fits
    weights: dict[str, int] = field(init=False)

    def __post_init__(self) -> None:
        mig = self.product.mig
        self.weights = {WHOLE: mig.memory_slots if mig else 1}
        if mig is not None:
            self.weights.update({name: p.memory_slots for name, p in mig.profiles.items()})

    def may_create(self, kind: str) -> bool:
        if kind == WHOLE:
            return True
        mig = self.product.mig
        allowed = not self.allowed or kind in self.allowed
        return mig is not None and kind in mig.profiles and allowed

    def size(self, kind: str) -> tuple[int, int]:
        mig = self.product.mig
        if kind == WHOLE or mig is None:
            return (99, 99)
        profile = mig.profiles[kind]
        return (profile.memory_slots, profile.compute_slices)

    def evaluate(self, changed: Sequence[PlanNode]) -> _Outcome:
        """The demand held by the unchanged nodes' layouts as they are, the rest packed afresh
        onto the changed nodes' GPUs."""
        names = {n.name for n in changed}
        kept = [gpu for n in self.nodes if n.name not in names for gpu in n.layout]
        used, remaining = self._cover(kept, self.need)
        free = sum(len(n.layout) for n in changed)
        packings = [
            self._pack(remaining, free, first) for first in (Counter(), self._running(remaining))
        ]
        packings.append(self._pack_by_layout(remaining, free))
        packed, unmet = min(
            packings, key=lambda p: (self._unmet_running(p[1]), sum(p[1].values()), len(p[0]))
        )
        layouts = self._assign(changed, packed)
        pods = sum(len(n.pods) for n in changed if n.name in layouts)
        return _Outcome(self._unmet_running(unmet), unmet, used + len(packed), layouts, pods)

    def _running(self, remaining: Counter[str]) -> Counter[str]:
        """What of `remaining` running pods need (any slice of a kind holds either)."""
        return Counter(
            {k: min(n, max(0, self.running[k] - (self.need[k] - n))) for k, n in remaining.items()}
        )

    def _unmet_running(self, unmet: Counter[str]) -> int:
        return sum(max(0, self.running[k] - (self.need[k] - unmet[k])) for k in self.running)

    def fewest_gpus(self) -> int:
        """No plan holds the demand on fewer GPUs: whole GPUs, plus the MIG instances' memory
        slots and compute slices over one GPU's."""
        mig = self.product.mig
        mig_need = [(k, n) for k, n in self.need.items() if k != WHOLE and self.may_create(k)]
        if mig is None or not mig_need:
            return self.need[WHOLE]
        memory = sum(self.size(k)[0] * n for k, n in mig_need)
        compute = sum(self.size(k)[1] * n for k, n in mig_need)
        per_gpu = max(-(-memory // mig.memory_slots), -(-compute // mig.compute_slices))
        return self.need[WHOLE] + per_gpu

    def _value(self, gpu: GpuLayout, remaining: Counter[str]) -> int:
        have = Counter(slices_of(gpu))
        return sum(min(n, remaining[k]) * self.weights.get(k, 1) for k, n in have.items())

    def _cover(self, gpus: Sequence[GpuLayout], need: Counter[str]) -> tuple[int, Counter[str]]:
        """How many of these GPUs (of fixed layouts) hold what they can of `need`, chosen
        greedily by the slots they hold, and the rest of `need`."""
        supply = Counter(gpus)
        remaining = Counter(need)
        used = 0
        while supply and +remaining:
            best = max(
                supply,
                key=lambda g: (self._value(g, remaining), _order(g)),
            )
            if self._value(best, remaining) == 0:
                break
            remaining.subtract(slices_of(best))
            remaining = +remaining
            supply[best] -= 1
            supply = +supply
            used += 1
        return used, remaining

    def _pack(
        self, remaining: Counter[str], limit: int, first: Counter[str]
    ) -> tuple[list[GpuLayout], Counter[str]]:
        """First fit decreasing into at most `limit` GPUs, `first` before the rest of
        `remaining`; what does not fit is unmet."""
        unmet: Counter[str] = Counter()
        bins: list[list[str] | None] = []

        def decreasing(counts: Counter[str]) -> list[str]:
            return sorted(
                (k for k, n in counts.items() for _ in range(n)),
                key=lambda k: (tuple(-x for x in self.size(k)), k),
            )

        items = decreasing(first) + decreasing(remaining - first)
        mig = self.product.mig
        room = (mig.memory_slots, mig.compute_slices) if mig else (0, 0)
        used: list[list[int]] = []  # memory slots and compute slices taken, per bin
        for kind in items:
            if not self.may_create(kind):
                unmet[kind] += 1
                continue
            if kind == WHOLE:
                if len(bins) < limit:
                    bins.append(None)
                    used.append(list(room))
                else:
                    unmet[kind] += 1
                continue
            memory, compute = self.size(kind)
            for current, taken in zip(bins, used, strict=True):
                if (
                    current is not None
                    and taken[0] + memory <= room[0]
                    and taken[1] + compute <= room[1]
                    and self.fits(self.product, (*current, kind))
                ):
                    current.append(kind)
                    taken[0] += memory
                    taken[1] += compute
                    break
            else:
                if len(bins) < limit:
                    bins.append([kind])
                    used.append([memory, compute])
                else:
                    unmet[kind] += 1
        return [None if b is None else tuple(sorted(b)) for b in bins], unmet

    def _pack_by_layout(
        self, remaining: Counter[str], limit: int
    ) -> tuple[list[GpuLayout], Counter[str]]:
        """GPU after GPU, the layout that fills the most of its memory, then of its compute,
        with the largest instances, from what is left: first fit decreasing leaves a memory
        slot empty beside seven 1g instances where a 1g.20gb would have filled it."""
        bins: list[GpuLayout] = []
        unmet: Counter[str] = Counter()
        left: Counter[str] = Counter()
        for k, n in remaining.items():
            if k == WHOLE:
                taken = min(n, limit - len(bins))
                bins += [None] * taken
                unmet[k] += n - taken
            elif self.may_create(k):
                left[k] = n
            else:
                unmet[k] += n
        candidates = sorted(
            (
                (self._fill(layout), tuple(Counter(layout).items()), layout)
                for layout in self.fits.layouts(self.product)
                if all(self.may_create(k) for k in layout)
            ),
            reverse=True,
        )
        while +left and len(bins) < limit:
            best = next(
                (c for c in candidates if all(left[k] >= n for k, n in c[1])),
                None,
            )
            if best is None:
                break
            _, counts, layout = best
            # the same layout as long as it stays the fullest: it does while all of it is left
            times = min(limit - len(bins), *(left[k] // n for k, n in counts))
            for k, n in counts:
                left[k] -= n * times
            bins += [layout] * times
        return bins, unmet + left

    def _fill(self, layout: tuple[str, ...]) -> tuple[int, int, tuple[tuple[int, int], ...]]:
        sizes = sorted((self.size(k) for k in layout), reverse=True)
        return (sum(m for m, _ in sizes), sum(c for _, c in sizes), tuple(sizes))

    def _assign(
        self, changed: Sequence[PlanNode], packed: list[GpuLayout]
    ) -> dict[str, NodeLayout]:
        """The packed layouts onto the changed nodes' GPUs: a GPU that already has one keeps it,
        the others go to the first GPUs in node order; GPUs left over keep their layouts. Only
        the nodes whose layout changes are returned."""
        slots = [(n, i) for n in changed for i in range(len(n.layout))]
        proposed = {n.name: list(n.layout) for n in changed}
        left: list[GpuLayout] = []
        taken: set[tuple[str, int]] = set()
        for layout in packed:
            match = next(
                ((n, i) for n, i in slots if (n.name, i) not in taken and n.layout[i] == layout),
                None,
            )
            if match is None:
                left.append(layout)
            else:
                taken.add((match[0].name, match[1]))
        free = [(n, i) for n, i in slots if (n.name, i) not in taken]
        for layout, (node, index) in zip(left, free, strict=False):
            proposed[node.name][index] = layout
        return {
            n.name: tuple(proposed[n.name]) for n in changed if tuple(proposed[n.name]) != n.layout
        }


def _order(gpu: GpuLayout) -> tuple[int, tuple[str, ...]]:
    """Ties between GPUs of equal value go the same way every time."""
    return (0, ()) if gpu is None else (1, tuple(gpu))


def plan_partitions(
    nodes: Sequence[PlanNode],
    demand: Mapping[SliceKey, int],
    allowed: Collection[str] = (),
    running: Mapping[SliceKey, int] | None = None,
) -> Plan:
    """The plan for `nodes` to hold `demand` (spare slices included); `running` is the part of
    it running pods hold now; `allowed` limits the profiles a new layout may contain (empty:
    any the product has)."""
    fits = _Fits()
    ordered = sorted(nodes, key=lambda n: (n.product.key, n.name))
    changes: list[NodeChange] = []
    gpus_now = gpus_planned = 0
    unmet_now: dict[SliceKey, int] = {}
    unmet: dict[SliceKey, int] = {}
    products = {n.product.key: n.product for n in ordered}
    wanted = {key for key, _ in demand}
    for key in sorted(products.keys() | wanted):
        group = [n for n in ordered if n.product.key == key]
        need = Counter({kind: n for (p, kind), n in demand.items() if p == key and n > 0})
        held = Counter({k: n for (p, k), n in (running or {}).items() if p == key and n > 0})
        if not group:
            unmet_now.update({(key, k): n for k, n in need.items()})
            unmet.update({(key, k): n for k, n in need.items()})
            continue
        planner = _Product(products[key], group, need, held & need, allowed, fits)
        now = planner.evaluate([])
        best, chosen = _search(planner, group, now)
        gpus_now += now.gpus
        gpus_planned += best.gpus
        unmet_now.update({(key, k): n for k, n in now.unmet.items()})
        unmet.update({(key, k): n for k, n in best.unmet.items()})
        by_name = {n.name: n for n in chosen}
        for name, layout in best.layouts.items():
            node = by_name[name]
            before, after = slice_counts(node.layout), slice_counts(layout)
            changes.append(
                NodeChange(
                    node=name,
                    layout=layout,
                    pods=node.pods,
                    gained=dict(sorted((after - before).items())),
                    lost=dict(sorted((before - after).items())),
                )
            )
    changes.sort(key=lambda c: (len(c.pods), c.node))
    return Plan(
        changes=tuple(changes),
        gpus=sum(len(n.layout) for n in nodes),
        gpus_now=gpus_now,
        gpus_planned=gpus_planned,
        unmet_now=unmet_now,
        unmet=unmet,
    )


def _search(
    planner: _Product, group: Sequence[PlanNode], now: _Outcome
) -> tuple[_Outcome, list[PlanNode]]:
    """The best set of nodes to change: each prefix of the changeable nodes in eviction order,
    then every node of the best one dropped that it does not need."""
    candidates = sorted((n for n in group if n.changeable), key=lambda n: (len(n.pods), n.name))
    best, chosen = now, []
    floor = planner.fewest_gpus()
    for size in range(1, len(candidates) + 1):
        if best.key()[:3] == (0, 0, floor):
            break  # nothing does better: a longer prefix only moves more pods
        outcome = planner.evaluate(candidates[:size])
        if outcome.key() < best.key():
            best, chosen = outcome, candidates[:size]
    if best is now:
        return now, []
    for node in reversed(list(chosen)):
        fewer = [n for n in chosen if n is not node]
        outcome = planner.evaluate(fewer)
        if outcome.key()[:3] == best.key()[:3] and outcome.key() <= best.key():
            best, chosen = outcome, fewer
    return best, [n for n in chosen if n.name in best.layouts]
