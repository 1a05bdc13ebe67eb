"""Load the packaged catalog and deep-merge an operator-supplied override file into it."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from gpusizer.catalog.models import Catalog, CatalogData


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Merge-patch semantics: mappings merge recursively, null deletes, anything else replaces."""
    merged = dict(base)
    for key, value in override.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _read_yaml(text: str, source: str) -> dict[str, Any]:
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ValueError(f"{source}: not valid YAML: {err}") from err
    if document is None:
        return {}
    if not isinstance(document, dict):
        raise ValueError(f"{source}: the top level must be a mapping")
    return document


def _describe(err: ValidationError) -> str:
    first = err.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "(top level)"
    return f"{where}: {first['msg']}"


def load_catalog(overrides: Path | None = None) -> Catalog:
    """The default catalog, with `overrides` (e.g. a mounted ConfigMap file) merged on top."""
    default = resources.files("gpusizer.catalog").joinpath("default.yaml").read_text()
    data = _read_yaml(default, "default.yaml")
    source = "default.yaml"
    if overrides is not None:
        source = str(overrides)
        data = deep_merge(data, _read_yaml(overrides.read_text(), source))
    try:
        return Catalog(CatalogData.model_validate(data))
    except ValidationError as err:
        raise ValueError(f"invalid GPU catalog {source}: {_describe(err)}") from err
