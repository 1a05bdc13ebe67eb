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


def valid_layouts(product: GPUProduct) -> list[tuple[str, ...]]:
    """Every layout the product holds, as sorted profile names (a few hundred at most: a layout
    that does not fit fits no larger one, so the search stops there)."""
    profiles = sorted(product.mig.profiles) if product.mig else []
    found: list[tuple[str, ...]] = []

    def grow(layout: tuple[str, ...], start: int) -> None:
        for i in range(start, len(profiles)):
            bigger = (*layout, profiles[i])
            if layout_is_valid(product, list(bigger)):
                found.append(bigger)
                grow(bigger, i)

    grow((), 0)
    return found


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


def _named_gpus(
    product: GPUProduct, layout_name: str, gpus_per_node: int
) -> list[tuple[str, ...] | None]:
    layout = named_layout(product, layout_name)
    if layout is None:
        raise ValueError(f"layout {layout_name!r} does not fit a {product.gfd_label}")
    if gpus_per_node < 0:
        raise ValueError("gpus_per_node must not be negative")
    return [tuple(layout) if layout else None] * gpus_per_node


def resources_for_gpus(layouts: Sequence[Sequence[str] | None]) -> dict[str, int]:
    """Allocatable extended resources (mixed strategy) of a node whose GPUs have these layouts:
    None is a GPU with MIG disabled, a sequence its MIG instances."""
    counts: dict[str, int] = {}
    for layout in layouts:
        names = [GPU_RESOURCE] if layout is None else [f"nvidia.com/mig-{p}" for p in layout]
        for name in names:
            counts[name] = counts.get(name, 0) + 1
    return counts


def labels_for_gpus(product: GPUProduct, layouts: Sequence[Sequence[str] | None]) -> dict[str, str]:
    """GFD's `nvidia.com/mig-<p>.count` and `.memory` node labels for these GPU layouts."""
    labels: dict[str, str] = {}
    mig = product.mig
    for resource, n in resources_for_gpus(layouts).items():
        if resource == GPU_RESOURCE:
            continue
        assert mig is not None  # a MIG instance implies MIG
        profile = resource.removeprefix("nvidia.com/mig-")
        labels[f"nvidia.com/mig-{profile}.count"] = str(n)
        labels[f"nvidia.com/mig-{profile}.memory"] = str(mig.profiles[profile].memory_mib)
    return labels


def resources_for_layout(
    product: GPUProduct, layout_name: str, gpus_per_node: int
) -> dict[str, int]:
    """Allocatable extended resources of a node (mixed strategy) with this layout on every GPU."""
    resources = resources_for_gpus(_named_gpus(product, layout_name, gpus_per_node))
    return resources or {GPU_RESOURCE: 0}


def labels_for_layout(product: GPUProduct, layout_name: str, gpus_per_node: int) -> dict[str, str]:
    """GFD's `nvidia.com/mig-<p>.count` and `.memory` node labels for the layout."""
    return labels_for_gpus(product, _named_gpus(product, layout_name, gpus_per_node))
