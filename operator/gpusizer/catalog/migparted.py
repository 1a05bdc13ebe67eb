"""Per-GPU MIG layouts as NVIDIA's mig-parted config file (`version: v1`, `mig-configs`, per
entry `devices` / `mig-enabled` / `mig-devices`), read back, and named by their content.

gpusizer's configs are named `gpusizer-<digest of the entries>`: a new layout is a new name, so
setting `nvidia.com/mig.config` to it is a label change mig-manager acts on, the previous name
still restores the previous layout, and an entry edited by hand no longer matches its name.
Pure.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import yaml

from gpusizer.catalog.models import GPUProduct
from gpusizer.catalog.placement import layout_is_valid, named_layout

GpuLayout = tuple[str, ...] | None
"""One GPU: None with MIG disabled (a whole GPU), else its MIG instances' profiles, sorted."""
NodeLayout = tuple[GpuLayout, ...]
"""Every GPU of a node, by index."""
Entries = list[dict[str, Any]]
"""One config of the file: its list of entries."""

CONFIG_KEY = "config.yaml"
"""The ConfigMap key mig-manager reads."""
CONFIG_PREFIX = "gpusizer-"
ALL_DISABLED = "all-disabled"
ALL_ENABLED = "all-enabled"


def gpu_layout(profiles: Sequence[str] | None) -> GpuLayout:
    return None if profiles is None else tuple(sorted(profiles))


def standard_layout(product: GPUProduct, name: str, gpus: int) -> NodeLayout | None:
    """A standard layout name (`all-disabled`, `all-enabled`, `all-balanced`, `all-<profile>`)
    on every GPU; None for another name, or one the product cannot hold."""
    if name == ALL_DISABLED:
        return (None,) * gpus
    if product.mig is None:
        return None
    if name == ALL_ENABLED:
        return ((),) * gpus
    profiles = named_layout(product, name)
    if not profiles:
        return None
    return (gpu_layout(profiles),) * gpus


def entries_for(layout: NodeLayout) -> Entries:
    """The mig-parted entries of a node layout: one per distinct GPU layout, in GPU order."""
    groups: dict[GpuLayout, list[int]] = {}
    for index, gpu in enumerate(layout):
        groups.setdefault(gpu, []).append(index)
    entries: Entries = []
    for gpu, devices in groups.items():
        if gpu is None:
            entries.append({"devices": devices, "mig-enabled": False})
            continue
        counts: dict[str, int] = {}
        for profile in gpu:
            counts[profile] = counts.get(profile, 0) + 1
        entries.append({"devices": devices, "mig-enabled": True, "mig-devices": counts})
    return entries


def _digest(entries: Entries) -> str:
    canonical = json.dumps(entries, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:12]


def config_name(layout: NodeLayout) -> str:
    """A valid label value (at most 63 characters) that changes with the layout."""
    return CONFIG_PREFIX + _digest(entries_for(layout))


def is_ours(name: str) -> bool:
    return name.startswith(CONFIG_PREFIX)


def parse_config(text: str | None) -> dict[str, Entries]:
    """The configs of a mig-parted file by name; ValueError saying what is wrong with it."""
    if not text or not text.strip():
        return {}
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"{CONFIG_KEY} is not valid YAML: {exc}") from exc
    if not isinstance(document, Mapping):
        raise ValueError(f"{CONFIG_KEY}: the top level must be a mapping")
    if str(document.get("version")) != "v1":
        raise ValueError(f"{CONFIG_KEY}: version must be v1, not {document.get('version')!r}")
    configs = document.get("mig-configs") or {}
    if not isinstance(configs, Mapping):
        raise ValueError(f"{CONFIG_KEY}: mig-configs must be a mapping of config names")
    parsed: dict[str, Entries] = {}
    for name, entries in configs.items():
        if not isinstance(entries, list) or not all(isinstance(e, Mapping) for e in entries):
            raise ValueError(f"{CONFIG_KEY}: mig-configs.{name} must be a list of entries")
        parsed[str(name)] = [_checked_entry(str(name), dict(e)) for e in entries]
    return parsed


def _checked_entry(name: str, entry: dict[str, Any]) -> dict[str, Any]:
    where = f"{CONFIG_KEY}: mig-configs.{name}"
    devices = entry.get("devices")
    if devices != "all" and not (
        isinstance(devices, list) and all(isinstance(d, int) and d >= 0 for d in devices)
    ):
        raise ValueError(f"{where}: devices must be `all` or a list of GPU indices")
    if not isinstance(entry.get("mig-enabled"), bool):
        raise ValueError(f"{where}: mig-enabled must be true or false")
    counts = entry.get("mig-devices", {}) or {}
    if not isinstance(counts, Mapping) or not all(
        isinstance(v, int) and v >= 0 for v in counts.values()
    ):
        raise ValueError(f"{where}: mig-devices must map profiles to instance counts")
    if counts and not entry["mig-enabled"]:
        raise ValueError(f"{where}: mig-devices given with mig-enabled: false")
    return entry


def node_layout(entries: Entries, product: GPUProduct, gpus: int, name: str) -> NodeLayout:
    """What a config does to a node with `gpus` GPUs of `product`; ValueError if it names a GPU
    the node does not have, leaves one out, or asks for a layout the product cannot hold.

    Entries with a `device-filter` (PCI device ids, which the catalog does not know) apply when
    the product has every profile they name: NVIDIA's default file keeps one entry per product
    under a filter, and its profile names are the product's own."""
    layouts: list[GpuLayout | str] = ["?"] * gpus
    for entry in entries:
        counts: Mapping[str, int] = entry.get("mig-devices") or {}
        if "device-filter" in entry and any(
            product.mig is None or p not in product.mig.profiles for p in counts
        ):
            continue
        devices = range(gpus) if entry["devices"] == "all" else entry["devices"]
        profiles = [p for p, n in counts.items() for _ in range(n)]
        for device in devices:
            if device >= gpus:
                raise ValueError(f"config {name} names GPU {device}; the node has {gpus}")
            layouts[device] = gpu_layout(profiles) if entry["mig-enabled"] else None
    missing = [i for i, gpu in enumerate(layouts) if gpu == "?"]
    if missing:
        raise ValueError(f"config {name} does not say what GPU {missing[0]} is")
    result: list[GpuLayout] = [g for g in layouts if not isinstance(g, str)]
    for index, gpu in enumerate(result):
        if gpu is not None and (product.mig is None or not layout_is_valid(product, list(gpu))):
            raise ValueError(
                f"config {name}: a {product.gfd_label} cannot hold {describe(gpu)} on GPU {index}"
            )
    return tuple(result)


def edited(configs: Mapping[str, Entries]) -> list[str]:
    """gpusizer's configs whose entries no longer match their names: edited by hand."""
    return sorted(
        name
        for name, entries in configs.items()
        if is_ours(name) and name != CONFIG_PREFIX + _digest(entries)
    )


def with_configs(text: str | None, keep: Collection[str], add: Mapping[str, NodeLayout]) -> str:
    """The file with gpusizer's configs reduced to those named in `keep` or `add`, the ones in
    `add` written when missing; every other config stays as it was."""
    document: dict[str, Any] = {"version": "v1", "mig-configs": {}}
    if text and text.strip():
        loaded = yaml.safe_load(text)
        if isinstance(loaded, Mapping):
            document = dict(loaded)
    configs = {
        name: entries
        for name, entries in (document.get("mig-configs") or {}).items()
        if not is_ours(str(name)) or name in keep or name in add
    }
    for name, layout in sorted(add.items()):
        configs.setdefault(name, entries_for(layout))
    document["mig-configs"] = configs
    return yaml.safe_dump(document, sort_keys=False, width=100)


def describe(gpu: GpuLayout) -> str:
    """A GPU's layout in a status line: `whole`, `none` (MIG on, no instance), or its profiles."""
    if gpu is None:
        return "whole"
    return "+".join(gpu) if gpu else "none"


def read_described(text: str) -> GpuLayout:
    """A GPU's layout back from `describe`; ValueError for text it did not write."""
    if text == "whole":
        return None
    if text == "none":
        return ()
    profiles = text.split("+")
    if not all(profiles):
        raise ValueError(f"not a GPU layout: {text!r}")
    return gpu_layout(profiles)
