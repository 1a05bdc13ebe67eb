"""GPU products, MIG profiles, prices and relative throughput, overridable by configuration."""

from gpusizer.catalog.loader import load_catalog
from gpusizer.catalog.models import Catalog, GPUProduct, MigProfile, Slice
from gpusizer.catalog.placement import (
    labels_for_layout,
    layout_is_valid,
    named_layout,
    resources_for_layout,
    valid_layouts,
)

__all__ = [
    "Catalog",
    "GPUProduct",
    "MigProfile",
    "Slice",
    "labels_for_layout",
    "layout_is_valid",
    "load_catalog",
    "named_layout",
    "resources_for_layout",
    "valid_layouts",
]
