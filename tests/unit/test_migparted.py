"""Per-GPU layouts as mig-parted config files: written, read back, named by content."""

from __future__ import annotations

import pytest
import yaml
from gpusizer.catalog import load_catalog
from gpusizer.catalog.migparted import (
    config_name,
    describe,
    edited,
    entries_for,
    node_layout,
    parse_config,
    standard_layout,
    with_configs,
)

CATALOG = load_catalog()
H100 = CATALOG.products["h100-80gb"]
L4 = CATALOG.products["l4"]
LAYOUT = (None, None, ("1g.20gb", "1g.20gb", "1g.20gb"), ("3g.40gb", "3g.40gb"))

# NVIDIA's examples/config.yaml shape, plus a per-product entry behind a device filter as the
# GPU Operator's default file has them
NVIDIA_STYLE = """
version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false
  custom-config:
    - devices: [0, 1]
      mig-enabled: false
    - devices: [2]
      mig-enabled: true
      mig-devices: {"1g.10gb": 7}
    - devices: [3]
      mig-enabled: true
      mig-devices: {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}
  filtered:
    - device-filter: ["0x20B010DE"]
      devices: all
      mig-enabled: true
      mig-devices: {"1g.5gb": 7}
    - device-filter: ["0x233010DE"]
      devices: all
      mig-enabled: true
      mig-devices: {"3g.40gb": 2}
"""


def test_entries_group_gpus_of_the_same_layout_as_mig_parted_writes_them() -> None:
    assert entries_for(LAYOUT) == [
        {"devices": [0, 1], "mig-enabled": False},
        {"devices": [2], "mig-enabled": True, "mig-devices": {"1g.20gb": 3}},
        {"devices": [3], "mig-enabled": True, "mig-devices": {"3g.40gb": 2}},
    ]


def test_a_config_name_is_a_label_value_that_changes_with_the_layout() -> None:
    name = config_name(LAYOUT)
    assert name.startswith("gpusizer-") and len(name) <= 63 and name == config_name(LAYOUT)
    assert config_name((None, *LAYOUT[1:])) == name
    assert config_name(LAYOUT[::-1]) != name


def test_what_is_written_reads_back_as_the_same_layout() -> None:
    text = with_configs(None, (), {config_name(LAYOUT): LAYOUT})
    configs = parse_config(text)
    assert node_layout(configs[config_name(LAYOUT)], H100, 4, "x") == LAYOUT
    assert edited(configs) == []


def test_nvidia_style_configs_read_as_layouts() -> None:
    configs = parse_config(NVIDIA_STYLE)
    layout = node_layout(configs["custom-config"], H100, 4, "custom-config")
    assert layout == (
        None,
        None,
        ("1g.10gb",) * 7,
        ("1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"),
    )
    # the A100-40GB entry's profile is not an H100's: its device filter is someone else's
    assert node_layout(configs["filtered"], H100, 2, "filtered") == (("3g.40gb", "3g.40gb"),) * 2


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("version: v1\nmig-configs: [a]\n", "mig-configs must be a mapping"),
        ("version: v2\nmig-configs: {}\n", "version must be v1"),
        ("{not yaml", "not valid YAML"),
        ("version: v1\nmig-configs: {a: {devices: all}}\n", "must be a list of entries"),
        ("version: v1\nmig-configs: {a: [{devices: x, mig-enabled: true}]}\n", "devices must"),
        ("version: v1\nmig-configs: {a: [{devices: all}]}\n", "mig-enabled must"),
        (
            "version: v1\nmig-configs: {a: [{devices: all, mig-enabled: false, "
            "mig-devices: {1g.10gb: 1}}]}\n",
            "mig-enabled: false",
        ),
    ],
)
def test_a_file_mig_parted_would_refuse_says_why(text: str, complaint: str) -> None:
    with pytest.raises(ValueError, match=complaint):
        parse_config(text)


@pytest.mark.parametrize(
    ("entries", "complaint"),
    [
        ([{"devices": [9], "mig-enabled": False}], "names GPU 9"),
        ([{"devices": [0], "mig-enabled": False}], "does not say what GPU 1"),
        (
            [{"devices": "all", "mig-enabled": True, "mig-devices": {"4g.40gb": 2}}],
            "cannot hold 4g.40gb\\+4g.40gb",
        ),
        ([{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.5gb": 1}}], "cannot hold"),
    ],
)
def test_a_config_the_node_cannot_hold_says_why(
    entries: list[dict[str, object]], complaint: str
) -> None:
    with pytest.raises(ValueError, match=complaint):
        node_layout(entries, H100, 2, "x")


def test_a_hand_edited_config_no_longer_matches_its_name() -> None:
    name = config_name(LAYOUT)
    document = yaml.safe_load(with_configs(None, (), {name: LAYOUT}))
    document["mig-configs"][name][1]["mig-devices"] = {"1g.20gb": 4}
    assert edited(parse_config(yaml.safe_dump(document))) == [name]


def test_writing_keeps_others_configs_and_drops_ours_nothing_names() -> None:
    old, new = config_name(LAYOUT), config_name((None,) * 4)
    text = with_configs(NVIDIA_STYLE, (), {old: LAYOUT})
    text = with_configs(text, ("all-disabled",), {new: (None,) * 4})
    configs = parse_config(text)
    assert set(configs) == {"all-disabled", "custom-config", "filtered", new}
    assert configs["custom-config"] == parse_config(NVIDIA_STYLE)["custom-config"]
    kept = parse_config(with_configs(text, (new,), {}))
    assert new in kept


def test_standard_layouts() -> None:
    assert standard_layout(H100, "all-disabled", 2) == (None, None)
    assert standard_layout(H100, "all-enabled", 1) == ((),)
    assert standard_layout(H100, "all-3g.40gb", 1) == (("3g.40gb", "3g.40gb"),)
    assert standard_layout(H100, "all-1g.5gb", 1) is None
    assert standard_layout(H100, "custom-config", 1) is None
    assert standard_layout(L4, "all-enabled", 1) is None


def test_describe() -> None:
    assert [describe(g) for g in (None, (), ("1g.10gb", "3g.40gb"))] == [
        "whole",
        "none",
        "1g.10gb+3g.40gb",
    ]
