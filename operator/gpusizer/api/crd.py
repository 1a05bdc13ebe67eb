"""The CustomResourceDefinition, generated from the pydantic models.

Kubernetes wants a structural schema: no $ref, no anyOf for optional fields, a type on every
node. pydantic's JSON schema is close; this turns one into the other.
"""

from __future__ import annotations

import copy
from typing import Any

import yaml
from pydantic import BaseModel

from gpusizer.api.v1alpha1 import (
    GROUP,
    KIND,
    PLURAL,
    SHORT_NAMES,
    SINGULAR,
    VERSION,
    WorkloadSizingSpec,
    WorkloadSizingStatus,
)

_DROPPED_KEYS = {"title", "$defs"}

PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Target", "type": "string", "jsonPath": ".spec.targetRef.name"},
    {"name": "Mode", "type": "string", "jsonPath": ".spec.mode"},
    {"name": "Current", "type": "integer", "jsonPath": ".status.currentReplicas"},
    {"name": "Desired", "type": "integer", "jsonPath": ".status.desiredReplicas"},
    {"name": "GPU%", "type": "number", "jsonPath": ".status.observation.gpuUtilization"},
    {"name": "Queue", "type": "number", "jsonPath": ".status.observation.queuePerReplica"},
    {"name": "Slice", "type": "string", "jsonPath": ".status.recommendation.slice"},
    {
        "name": "Ready",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def _structural(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_structural(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = copy.deepcopy(defs[node["$ref"].rsplit("/", 1)[-1]])
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _structural(merged, defs)
    if "anyOf" in node:
        options = [o for o in node["anyOf"] if o.get("type") != "null"]
        nullable = len(options) < len(node["anyOf"])
        rest = {k: v for k, v in node.items() if k != "anyOf"}
        if len(options) != 1:
            raise ValueError(f"cannot express anyOf {node['anyOf']} structurally")
        merged = {**_structural(options[0], defs), **_structural(rest, defs)}
        if nullable:
            merged["nullable"] = True
            if merged.get("default", "") is None:
                del merged["default"]
        return merged
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROPPED_KEYS:
            continue
        if key == "properties":
            out[key] = {name: _structural(sub, defs) for name, sub in value.items()}
        else:
            out[key] = _structural(value, defs)
    if out.get("type") == "object" and "additionalProperties" in out:
        extra = out["additionalProperties"]
        if extra is False:
            del out["additionalProperties"]
    if out.get("default", "") is None:
        del out["default"]
    for exclusive, inclusive in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        bound = out.get(exclusive)
        if bound is not None and not isinstance(bound, bool):
            out[inclusive] = bound
            out[exclusive] = True
    return out


def openapi_schema(model: type[Any]) -> dict[str, Any]:
    """A structural OpenAPI v3 schema for one pydantic model."""
    raw = model.model_json_schema(by_alias=True, mode="serialization")
    schema: dict[str, Any] = _structural(raw, raw.get("$defs", {}))
    return schema


def _apply_factory_defaults(schema: dict[str, Any], model: type[BaseModel]) -> None:
    """pydantic leaves default_factory values out of its schema; the API server needs them to
    fill in omitted objects such as scaleUp, so they are added here from the models."""
    for name, field in model.model_fields.items():
        prop = schema.get("properties", {}).get(field.alias or name)
        if prop is None:
            continue
        if field.default_factory is not None:
            value = field.get_default(call_default_factory=True)
            prop["default"] = (
                value.model_dump(mode="json", by_alias=True, exclude_none=True)
                if isinstance(value, BaseModel)
                else value
            )
        nested = field.annotation
        if isinstance(nested, type) and issubclass(nested, BaseModel):
            _apply_factory_defaults(prop, nested)


def crd() -> dict[str, Any]:
    spec_schema = openapi_schema(WorkloadSizingSpec)
    spec_schema["description"] = "What to size and how: targets, bounds, rates, scale to zero."
    _apply_factory_defaults(spec_schema, WorkloadSizingSpec)
    status_schema = openapi_schema(WorkloadSizingStatus)
    status_schema["description"] = "What the operator observed, decided and recommends."
    _apply_factory_defaults(status_schema, WorkloadSizingStatus)
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": SHORT_NAMES,
                "categories": ["gpusizer"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": (
                                "Sizes a GPU inference workload: replicas from measured GPU "
                                "utilisation and queue depth, scale to zero and back, and the "
                                "MIG slice or GPU type it should run on."
                            ),
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec_schema,
                                "status": status_schema,
                            },
                        }
                    },
                }
            ],
        },
    }


def crd_yaml() -> str:
    header = "# Generated by `gpusizer crds` from gpusizer.api.v1alpha1: do not edit.\n"
    return header + yaml.safe_dump(crd(), sort_keys=False, width=100)
