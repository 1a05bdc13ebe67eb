"""Validated catalog data: GPU products, their MIG profiles, and the slices built from them."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

GPU_RESOURCE = "nvidia.com/gpu"
PRODUCT_LABEL = "nvidia.com/gpu.product"
DEFAULT_IDLE_POWER_SHARE = 0.1
_PROFILE_NAME = re.compile(r"^(\d+)g\.\d+gb$")


class MigProfile(BaseModel):
    """One MIG instance profile (e.g. 3g.40gb) and where it may sit on the GPU."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    compute_slices: int = Field(gt=0)
    memory_slots: int = Field(gt=0)
    memory_mib: int = Field(gt=0)
    max_instances: int = Field(gt=0)
    placements: tuple[int, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _check_name(self) -> MigProfile:
        match = _PROFILE_NAME.match(self.name)
        if match is None:
            raise ValueError(f"profile name {self.name!r} is not of the form <N>g.<M>gb")
        if int(match.group(1)) != self.compute_slices:
            raise ValueError(
                f"compute_slices {self.compute_slices} does not match the profile name "
                f"{self.name!r}"
            )
        if self.max_instances > len(self.placements):
            raise ValueError("max_instances exceeds the number of placements")
        return self


class MigConfig(BaseModel):
    """The MIG geometry of a product: slot counts, profiles, and its balanced layout."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    compute_slices: int = Field(gt=0)
    memory_slots: int = Field(gt=0)
    profiles: dict[str, MigProfile] = Field(min_length=1)
    balanced: tuple[str, ...] = ()

    @model_validator(mode="before")
    @classmethod
    def _inject_names(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("profiles"), dict):
            data = dict(data)
            data["profiles"] = {
                name: {**body, "name": name} if isinstance(body, dict) else body
                for name, body in data["profiles"].items()
            }
        return data

    @model_validator(mode="after")
    def _check_geometry(self) -> MigConfig:
        for profile in self.profiles.values():
            if profile.compute_slices > self.compute_slices:
                raise ValueError(f"profile {profile.name}: more compute slices than the GPU")
            for start in profile.placements:
                if start < 0 or start + profile.memory_slots > self.memory_slots:
                    raise ValueError(f"profile {profile.name}: placement {start} out of range")
        unknown = [p for p in self.balanced if p not in self.profiles]
        if unknown:
            raise ValueError(f"balanced names unknown profiles {unknown}")
        return self


class GPUProduct(BaseModel):
    """A GPU product as GPU Feature Discovery and NVML name it, with its economics."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: str
    gfd_label: str = Field(min_length=1)
    model_name: str = Field(min_length=1)
    slice_name: str = Field(pattern=r"^gpu-[a-z0-9-]+$")
    family: str = Field(min_length=1)
    memory_mib: int = Field(gt=0)
    fp16_tflops: float = Field(gt=0)
    hbm_bandwidth_gbps: float = Field(gt=0)
    board_power_watts: float = Field(gt=0)
    idle_power_watts: float | None = Field(None, ge=0)
    price_per_hour: float = Field(ge=0)
    mig: MigConfig | None = None

    @property
    def idle_watts(self) -> float:
        """What the GPU draws with no work: the catalog's figure, else a tenth of board power
        (an estimate either way: see default.yaml)."""
        if self.idle_power_watts is None:
            return self.board_power_watts * DEFAULT_IDLE_POWER_SHARE
        return min(self.idle_power_watts, self.board_power_watts)

    @property
    def node_selector(self) -> dict[str, str]:
        """The node selector that lands a pod on this product."""
        return {PRODUCT_LABEL: self.gfd_label}


class CatalogData(BaseModel):
    """The whole catalog document, as loaded from YAML."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    currency: str = Field("USD", min_length=1, max_length=8)
    reference_product: str
    bandwidth_weight: float = Field(ge=0, le=1)
    products: dict[str, GPUProduct] = Field(min_length=1)

    @model_validator(mode="before")
    @classmethod
    def _inject_keys(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("products"), dict):
            data = dict(data)
            data["products"] = {
                key: {**body, "key": key} if isinstance(body, dict) else body
                for key, body in data["products"].items()
            }
        return data

    @model_validator(mode="after")
    def _check_reference(self) -> CatalogData:
        if self.reference_product not in self.products:
            raise ValueError(f"reference_product {self.reference_product!r} is not a product")
        labels = [p.gfd_label for p in self.products.values()]
        if len(set(labels)) != len(labels):
            raise ValueError("two products share a gfd_label")
        return self


@dataclass(frozen=True, eq=False)
class Slice:
    """The unit a workload runs on: a MIG instance or a whole GPU of one product."""

    name: str
    product: GPUProduct
    profile: MigProfile | None
    memory_mib: int
    share: float
    price_per_hour: float
    relative_throughput: float
    power_watts: float
    compute_share: float = 1.0  # of its GPU's compute slices: how its GPU's power is split

    @property
    def resource(self) -> str:
        """The extended resource a pod requests under limits."""
        return GPU_RESOURCE if self.profile is None else f"nvidia.com/mig-{self.profile.name}"

    @property
    def node_selector(self) -> dict[str, str]:
        return self.product.node_selector

    @property
    def key(self) -> tuple[str, str]:
        """Slice names repeat across products (mig-3g.40gb), so identity includes the product."""
        return (self.name, self.product.key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Slice) and self.key == other.key

    def __hash__(self) -> int:
        return hash(self.key)


class Catalog:
    """Products plus the derived slices, with prices and throughput relative to the reference."""

    def __init__(self, data: CatalogData) -> None:
        self.data = data
        self.products: Mapping[str, GPUProduct] = data.products
        self.reference = data.products[data.reference_product]
        self._by_label = {p.gfd_label: p for p in data.products.values()}
        self._by_model_name = {p.model_name: p for p in data.products.values()}
        self._slices = [s for p in data.products.values() for s in self._product_slices(p)]
        # asked for every pod at every turn (and every emulator tick): a lookup, not a scan;
        # the first slice of a key wins, as the scan's did
        self._by_resource: dict[tuple[str, str], Slice] = {}
        self._by_key: dict[tuple[str, str], Slice] = {}
        for slice_ in self._slices:
            self._by_resource.setdefault((slice_.product.key, slice_.resource), slice_)
            self._by_key.setdefault(slice_.key, slice_)

    def product_by_label(self, gfd_label: str) -> GPUProduct | None:
        """Product for a `nvidia.com/gpu.product` value, including single-strategy `-MIG-` ones."""
        product = self._by_label.get(gfd_label)
        if product is None and "-MIG-" in gfd_label:
            product = self._by_label.get(gfd_label.split("-MIG-", 1)[0])
        return product

    def slices(self) -> list[Slice]:
        return list(self._slices)

    def slice_for(self, resource: str, product_label: str) -> Slice | None:
        """The slice a pod gets from a resource name on a node with this product label."""
        product = self.product_by_label(product_label)
        return None if product is None else self._by_resource.get((product.key, resource))

    def product_by_model_name(self, model_name: str) -> GPUProduct | None:
        """Product for dcgm-exporter's `modelName` label (the NVML name)."""
        return self._by_model_name.get(model_name)

    def slice(self, name: str, product_key: str) -> Slice | None:
        return self._by_key.get((name, product_key))

    def relative_throughput(self, product: GPUProduct, compute: float, bandwidth: float) -> float:
        """Estimated throughput against the reference GPU; compute/bandwidth are the shares."""
        ref = self.reference
        bw_ratio = product.hbm_bandwidth_gbps / ref.hbm_bandwidth_gbps * bandwidth
        compute_ratio = product.fp16_tflops / ref.fp16_tflops * compute
        weight = self.data.bandwidth_weight
        return float(bw_ratio**weight * compute_ratio ** (1 - weight))

    def _product_slices(self, product: GPUProduct) -> list[Slice]:
        whole = Slice(
            name=product.slice_name,
            product=product,
            profile=None,
            memory_mib=product.memory_mib,
            share=1.0,
            price_per_hour=product.price_per_hour,
            relative_throughput=self.relative_throughput(product, 1.0, 1.0),
            power_watts=product.board_power_watts,
        )
        result = [whole]
        if product.mig is None:
            return result
        for profile in product.mig.profiles.values():
            compute = profile.compute_slices / product.mig.compute_slices
            memory = profile.memory_slots / product.mig.memory_slots
            share = max(compute, memory)
            result.append(
                Slice(
                    name=f"mig-{profile.name}",
                    product=product,
                    profile=profile,
                    memory_mib=profile.memory_mib,
                    share=share,
                    price_per_hour=product.price_per_hour * share,
                    relative_throughput=self.relative_throughput(product, compute, memory),
                    power_watts=product.board_power_watts * share,
                    compute_share=compute,
                )
            )
        return result
