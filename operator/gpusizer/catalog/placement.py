"""MIG placement rules and the standard mig-parted layouts (`all-disabled`, `all-<p>`, ...)."""

from __future__ import annotations

from collections.abc import Sequence

from gpusizer.catalog.models import GPU_RESOURCE, GPUProduct, MigProfile

DISABLED = "all-disabled"
BALANCED = "all-balanced"


def layout_is_valid(product: GPUProduct, profiles: Sequence[str]) -> bool:
    """True when the profiles fit on one GPU without overlapping memory slots or compute."""
    mig = product.mig
    if mig is None:
        return not profiles
    try:
        chosen = [mig.profiles[name] for name in profiles]
    except KeyError:
        return False
    if sum(p.compute_slices for p in chosen) > mig.compute_slices:
        return False
    for profile in chosen:
        if chosen.count(profile) > profile.max_instances:
            return False
    # Largest first: they have the fewest placements, so the search prunes early.
    chosen.sort(key=lambda p: (-p.memory_slots, -p.compute_slices))
    return _place(chosen, [False] * mig.memory_slots)


def _place(remaining: list[MigProfile], used: list[bool]) -> bool:
    if not remaining:
        return True
    profile, rest = remaining[0], remaining[1:]
    for start in profile.placements:
        span = range(start, start + profile.memory_slots)
        if any(used[i] for i in span):
            continue
        for i in span:
            used[i] = True
        fits = _place(rest, used)
        for i in span:
            used[i] = False
        if fits:
            return True
    return False


def named_layout(product: GPUProduct, name: str) -> list[str] | None:
    """Profiles per GPU for a standard layout name; [] is the whole GPU; None if it cannot hold."""
    if name == DISABLED:
        return []
    mig = product.mig
    if mig is None:
        return None
    if name == BALANCED:
        layout = list(mig.balanced)
    elif name.startswith("all-") and name[4:] in mig.profiles:
        profile = mig.profiles[name[4:]]
        layout = [profile.name] * profile.max_instances
    else:
        return None
    return layout if layout and layout_is_valid(product, layout) else None


def _counts(product: GPUProduct, layout_name: str, gpus_per_node: int) -> dict[str, int]:
    layout = named_layout(product, layout_name)
    if layout is None:
        raise ValueError(f"layout {layout_name!r} does not fit a {product.gfd_label}")
    if gpus_per_node < 0:
        raise ValueError("gpus_per_node must not be negative")
    counts: dict[str, int] = {}
    for profile in layout:
        counts[profile] = counts.get(profile, 0) + gpus_per_node
    return counts


def resources_for_layout(
    product: GPUProduct, layout_name: str, gpus_per_node: int
) -> dict[str, int]:
    """Allocatable extended resources of a node (mixed strategy) with this layout on every GPU."""
    counts = _counts(product, layout_name, gpus_per_node)
    if not counts:
        return {GPU_RESOURCE: gpus_per_node}
    return {f"nvidia.com/mig-{profile}": n for profile, n in counts.items()}


def labels_for_layout(product: GPUProduct, layout_name: str, gpus_per_node: int) -> dict[str, str]:
    """GFD's `nvidia.com/mig-<p>.count` and `.memory` node labels for the layout."""
    labels: dict[str, str] = {}
    mig = product.mig
    for profile, n in _counts(product, layout_name, gpus_per_node).items():
        assert mig is not None  # a non-empty layout implies MIG
        labels[f"nvidia.com/mig-{profile}.count"] = str(n)
        labels[f"nvidia.com/mig-{profile}.memory"] = str(mig.profiles[profile].memory_mib)
    return labels
