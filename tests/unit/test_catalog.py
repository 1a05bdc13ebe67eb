"""The GPU catalog against gpu-facts.md: profiles, placements, prices, throughput, overrides."""

from __future__ import annotations

from pathlib import Path

import pytest
from gpusizer.catalog import (
    Catalog,
    labels_for_layout,
    layout_is_valid,
    load_catalog,
    named_layout,
    resources_for_layout,
    valid_layouts,
)


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog()


# gpu-facts.md section 2: product -> {profile: count per GPU}
MIG_TABLE = {
    "a100-40gb": {
        "1g.5gb": 7,
        "1g.10gb": 4,
        "2g.10gb": 3,
        "3g.20gb": 2,
        "4g.20gb": 1,
        "7g.40gb": 1,
    },
    "a100-80gb": {
        "1g.10gb": 7,
        "1g.20gb": 4,
        "2g.20gb": 3,
        "3g.40gb": 2,
        "4g.40gb": 1,
        "7g.80gb": 1,
    },
    "h100-80gb": {
        "1g.10gb": 7,
        "1g.20gb": 4,
        "2g.20gb": 3,
        "3g.40gb": 2,
        "4g.40gb": 1,
        "7g.80gb": 1,
    },
    "h100-nvl-94gb": {
        "1g.12gb": 7,
        "1g.24gb": 4,
        "2g.24gb": 3,
        "3g.47gb": 2,
        "4g.47gb": 1,
        "7g.94gb": 1,
    },
    "h200-141gb": {
        "1g.18gb": 7,
        "1g.35gb": 4,
        "2g.35gb": 3,
        "3g.71gb": 2,
        "4g.71gb": 1,
        "7g.141gb": 1,
    },
    "b200-180gb": {
        "1g.23gb": 7,
        "1g.45gb": 4,
        "2g.45gb": 3,
        "3g.90gb": 2,
        "4g.90gb": 1,
        "7g.180gb": 1,
    },
    "a30-24gb": {"1g.6gb": 4, "2g.12gb": 2, "4g.24gb": 1},
}

LABELS = {
    "l4": ("NVIDIA-L4", "NVIDIA L4", "gpu-l4", "ada-lovelace"),
    "l40s": ("NVIDIA-L40S", "NVIDIA L40S", "gpu-l40s", "ada-lovelace"),
    "a100-40gb": ("NVIDIA-A100-SXM4-40GB", "NVIDIA A100-SXM4-40GB", "gpu-a100", "ampere"),
    "a100-80gb": ("NVIDIA-A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB", "gpu-a100", "ampere"),
    "h100-80gb": ("NVIDIA-H100-80GB-HBM3", "NVIDIA H100 80GB HBM3", "gpu-h100", "hopper"),
    "h100-nvl-94gb": ("NVIDIA-H100-NVL", "NVIDIA H100 NVL", "gpu-h100-nvl", "hopper"),
    "h200-141gb": ("NVIDIA-H200", "NVIDIA H200", "gpu-h200", "hopper"),
    "b200-180gb": ("NVIDIA-B200", "NVIDIA B200", "gpu-b200", "blackwell"),
    "a30-24gb": ("NVIDIA-A30", "NVIDIA A30", "gpu-a30", "ampere"),
}


def test_products_and_labels(catalog: Catalog) -> None:
    assert set(catalog.products) == set(LABELS)
    for key, (label, model, slice_name, family) in LABELS.items():
        product = catalog.products[key]
        assert (product.gfd_label, product.model_name, product.slice_name, product.family) == (
            label,
            model,
            slice_name,
            family,
        )
        assert catalog.product_by_label(label) is product
    assert catalog.products["h100-80gb"].memory_mib == 81559
    assert (
        catalog.product_by_label("NVIDIA-H100-80GB-HBM3-MIG-1g.10gb")
        is catalog.products["h100-80gb"]
    )
    assert catalog.product_by_label("NVIDIA-T4") is None
    assert catalog.products["l4"].mig is None
    assert catalog.products["l40s"].mig is None


@pytest.mark.parametrize(
    ("product", "profile", "count"),
    [(p, name, n) for p, profiles in MIG_TABLE.items() for name, n in profiles.items()],
)
def test_every_profile_count_and_memory(
    catalog: Catalog, product: str, profile: str, count: int
) -> None:
    gpu = catalog.products[product]
    assert gpu.mig is not None
    spec = gpu.mig.profiles[profile]
    assert spec.max_instances == count
    # the count is exactly what the placement rules allow
    assert layout_is_valid(gpu, [profile] * count)
    assert not layout_is_valid(gpu, [profile] * (count + 1))
    assert named_layout(gpu, f"all-{profile}") == [profile] * count
    # usable memory is a little below the name (at most 7 % below, never above)
    nominal_mib = int(profile.split(".")[1].removesuffix("gb")) * 1024
    assert 0.9 * nominal_mib <= spec.memory_mib < nominal_mib
    assert spec.compute_slices == int(profile.split("g.")[0])


def test_profiles_are_exactly_the_table(catalog: Catalog) -> None:
    for key, profiles in MIG_TABLE.items():
        mig = catalog.products[key].mig
        assert mig is not None
        assert set(mig.profiles) == set(profiles)


def test_h100_measured_memory(catalog: Catalog) -> None:
    mig = catalog.products["h100-80gb"].mig
    assert mig is not None
    assert mig.profiles["3g.40gb"].memory_mib == int(39.5 * 1024)
    assert mig.profiles["7g.80gb"].memory_mib == int(79.25 * 1024)


VALID = [
    ["7g.80gb"],
    ["4g.40gb", "3g.40gb"],
    ["4g.40gb", "2g.20gb", "1g.10gb"],
    ["3g.40gb", "3g.40gb"],
    ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"],
    ["2g.20gb", "2g.20gb", "2g.20gb", "1g.10gb"],
    ["1g.10gb"] * 7,
]
INVALID = [
    ["4g.40gb", "4g.40gb"],
    ["3g.40gb"] * 3,
    ["2g.20gb"] * 4,
    ["1g.10gb"] * 8,
    ["7g.80gb", "1g.10gb"],
    ["no-such-profile"],
]


@pytest.mark.parametrize("product", ["a100-80gb", "h100-80gb"])
@pytest.mark.parametrize("layout", VALID)
def test_valid_layouts(catalog: Catalog, product: str, layout: list[str]) -> None:
    assert layout_is_valid(catalog.products[product], layout)
    assert layout_is_valid(catalog.products[product], list(reversed(layout)))


@pytest.mark.parametrize("product", ["a100-80gb", "h100-80gb"])
@pytest.mark.parametrize("layout", INVALID)
def test_invalid_layouts(catalog: Catalog, product: str, layout: list[str]) -> None:
    assert not layout_is_valid(catalog.products[product], layout)


def test_a30_layouts(catalog: Catalog) -> None:
    a30 = catalog.products["a30-24gb"]
    assert layout_is_valid(a30, ["2g.12gb", "1g.6gb", "1g.6gb"])
    assert layout_is_valid(a30, ["2g.12gb", "2g.12gb"])
    assert not layout_is_valid(a30, ["4g.24gb", "1g.6gb"])
    assert named_layout(a30, "all-balanced") == ["1g.6gb", "1g.6gb", "2g.12gb"]


def test_non_mig_gpu_layouts(catalog: Catalog) -> None:
    l4 = catalog.products["l4"]
    assert layout_is_valid(l4, [])
    assert not layout_is_valid(l4, ["1g.10gb"])
    assert named_layout(l4, "all-disabled") == []
    assert named_layout(l4, "all-balanced") is None
    assert resources_for_layout(l4, "all-disabled", 2) == {"nvidia.com/gpu": 2}


def test_named_layouts(catalog: Catalog) -> None:
    h100 = catalog.products["h100-80gb"]
    assert named_layout(h100, "all-disabled") == []
    assert named_layout(h100, "all-balanced") == ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"]
    assert named_layout(h100, "all-3g.40gb") == ["3g.40gb", "3g.40gb"]
    assert named_layout(h100, "all-1g.5gb") is None  # an A100-40GB profile
    assert named_layout(h100, "custom-thing") is None


def test_resources_and_labels_for_layout(catalog: Catalog) -> None:
    h100 = catalog.products["h100-80gb"]
    assert resources_for_layout(h100, "all-1g.10gb", 8) == {"nvidia.com/mig-1g.10gb": 56}
    assert resources_for_layout(h100, "all-balanced", 8) == {
        "nvidia.com/mig-1g.10gb": 16,
        "nvidia.com/mig-2g.20gb": 8,
        "nvidia.com/mig-3g.40gb": 8,
    }
    assert resources_for_layout(h100, "all-disabled", 8) == {"nvidia.com/gpu": 8}
    assert labels_for_layout(h100, "all-3g.40gb", 2) == {
        "nvidia.com/mig-3g.40gb.count": "4",
        "nvidia.com/mig-3g.40gb.memory": "40448",
    }
    assert labels_for_layout(h100, "all-disabled", 2) == {}
    with pytest.raises(ValueError, match=r"all-6g\.70gb"):
        resources_for_layout(h100, "all-6g.70gb", 2)


def test_prices_from_the_table(catalog: Catalog) -> None:
    prices = {"l4": 0.70, "l40s": 1.40, "a100-80gb": 1.80, "h100-80gb": 3.00, "h200-141gb": 4.50}
    for key, price in prices.items():
        whole = catalog.slice(catalog.products[key].slice_name, key)
        assert whole is not None
        assert whole.price_per_hour == pytest.approx(price)
        assert whole.resource == "nvidia.com/gpu"


def test_slice_share_pricing(catalog: Catalog) -> None:
    label = "NVIDIA-H100-80GB-HBM3"
    three = catalog.slice_for("nvidia.com/mig-3g.40gb", label)
    assert three is not None
    assert three.name == "mig-3g.40gb"
    assert three.price_per_hour == pytest.approx(3.00 * 4 / 8)  # memory share dominates 3/7
    assert three.power_watts == pytest.approx(700 * 4 / 8)
    assert three.node_selector == {"nvidia.com/gpu.product": label}
    one = catalog.slice_for("nvidia.com/mig-1g.10gb", label)
    assert one is not None
    assert one.price_per_hour == pytest.approx(3.00 / 7)  # compute share dominates 1/8
    assert one.memory_mib == 9984
    # the same slice name on another product is a different slice
    a100 = catalog.slice_for("nvidia.com/mig-3g.40gb", "NVIDIA-A100-SXM4-80GB")
    assert a100 is not None and a100 != three and a100.name == three.name
    assert catalog.slice_for("nvidia.com/mig-3g.40gb", "NVIDIA-L4") is None
    assert catalog.slice_for("nvidia.com/gpu", "NVIDIA-T4") is None


def test_relative_throughput_ordering(catalog: Catalog) -> None:
    def tput(name: str, product: str) -> float:
        found = catalog.slice(name, product)
        assert found is not None
        return found.relative_throughput

    assert tput("gpu-h100", "h100-80gb") == pytest.approx(1.0)
    assert tput("mig-7g.80gb", "h100-80gb") == pytest.approx(1.0)
    chain = ["mig-1g.10gb", "mig-2g.20gb", "mig-3g.40gb", "mig-7g.80gb"]
    values = [tput(name, "h100-80gb") for name in chain]
    assert values == sorted(values) and len(set(values)) == len(values)
    assert tput("gpu-l4", "l4") < tput("gpu-a100", "a100-80gb") < tput("gpu-h100", "h100-80gb")
    # a MIG slice is its parent's ratios times g/7 and m/8
    expected = (3300 / 3300 * 4 / 8) ** 0.7 * (3 / 7) ** 0.3
    assert tput("mig-3g.40gb", "h100-80gb") == pytest.approx(expected)


def test_slices_cover_every_profile(catalog: Catalog) -> None:
    names = {(s.name, s.product.key) for s in catalog.slices()}
    for key, profiles in MIG_TABLE.items():
        for profile in profiles:
            assert (f"mig-{profile}", key) in names
    assert ("gpu-l40s", "l40s") in names


def test_override_merges(tmp_path: Path) -> None:
    override = tmp_path / "catalog.yaml"
    override.write_text(
        """
bandwidth_weight: 0.5
products:
  h100-80gb:
    price_per_hour: 2.5
  l4: null
  t4:
    gfd_label: NVIDIA-Tesla-T4
    model_name: Tesla T4
    slice_name: gpu-t4
    family: turing
    memory_mib: 15360
    fp16_tflops: 65
    hbm_bandwidth_gbps: 320
    board_power_watts: 70
    price_per_hour: 0.35
"""
    )
    merged = load_catalog(override)
    h100 = merged.products["h100-80gb"]
    assert h100.price_per_hour == 2.5
    assert h100.memory_mib == 81559  # untouched fields survive
    assert h100.mig is not None and len(h100.mig.profiles) == 6
    assert "l4" not in merged.products
    t4 = merged.slice_for("nvidia.com/gpu", "NVIDIA-Tesla-T4")
    assert t4 is not None and t4.price_per_hour == 0.35
    assert t4.relative_throughput == pytest.approx((320 / 3300) ** 0.5 * (65 / 1979) ** 0.5)
    three = merged.slice_for("nvidia.com/mig-3g.40gb", "NVIDIA-H100-80GB-HBM3")
    assert three is not None and three.price_per_hour == pytest.approx(1.25)


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("products: {h100-80gb: {price_per_hour: -1}}", "products.h100-80gb.price_per_hour"),
        ("products: {h100-80gb: {prize_per_hour: 2}}", "products.h100-80gb.prize_per_hour"),
        ("bandwidth_weight: 2", "bandwidth_weight"),
        ("reference_product: t4", "reference_product"),
        (
            "products: {a30-24gb: {mig: {profiles: {2g.12gb: {placements: [3, 0]}}}}}",
            "placement 3",
        ),
        ("products: [1, 2]", "products"),
        ("- a list", "top level"),
        ("products: {h100-80gb: {price_per_hour: [}", "not valid YAML"),
    ],
)
def test_malformed_override_names_the_field(tmp_path: Path, text: str, field: str) -> None:
    override = tmp_path / "bad.yaml"
    override.write_text(text)
    with pytest.raises(ValueError, match=r"bad\.yaml") as info:
        load_catalog(override)
    assert field in str(info.value)


def test_valid_layouts_are_every_layout_the_gpu_holds_and_no_other() -> None:
    h100 = load_catalog().products["h100-80gb"]
    layouts = valid_layouts(h100)
    assert len(layouts) == len(set(layouts))
    assert ("1g.10gb",) * 7 in layouts and ("2g.20gb", "2g.20gb", "2g.20gb") in layouts
    assert ("1g.10gb",) * 8 not in layouts and ("4g.40gb", "4g.40gb") not in layouts
    assert all(layout_is_valid(h100, list(layout)) for layout in layouts)
    assert valid_layouts(load_catalog().products["l4"]) == []


def test_every_slice_is_found_by_its_resource_and_by_its_key() -> None:
    catalog = load_catalog()
    for slice_ in catalog.slices():
        label = slice_.product.gfd_label
        found = catalog.slice_for(slice_.resource, label)
        assert found is not None and found.product.key == slice_.product.key
        assert found.resource == slice_.resource
        assert catalog.slice_for(slice_.resource, f"{label}-MIG-1g.10gb") is found
        assert catalog.slice(*slice_.key) is slice_
    assert catalog.slice_for("nvidia.com/mig-7g.80gb", "no-such-product") is None
