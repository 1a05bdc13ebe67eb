"""The CustomResourceDefinition, generated from the pydantic models.

Kubernetes wants a structural schema: no $ref, no anyOf for optional fields, a type on every
node. pydantic's JSON schema is close; this turns one into the other.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import yaml
from pydantic import BaseModel

from gpusizer.api import partitioning
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
    {"name": "Cost/1kReq", "type": "number", "jsonPath": ".status.efficiency.costPer1kRequests"},
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


@dataclass(frozen=True)
class Kind:
    """One custom resource of the group, and the models its schema comes from."""

    kind: str
    plural: str
    singular: str
    short_names: list[str]
    namespaced: bool
    spec: type[BaseModel]
    status: type[BaseModel]
    description: str
    spec_description: str
    status_description: str
    printer_columns: list[dict[str, Any]]
    source: str

    @property
    def file_name(self) -> str:
        """Where `make crds` writes it: crds/<group>_<plural>.yaml."""
        return f"{GROUP}_{self.plural}.yaml"


WORKLOAD_SIZING = Kind(
    kind=KIND,
    plural=PLURAL,
    singular=SINGULAR,
    short_names=SHORT_NAMES,
    namespaced=True,
    spec=WorkloadSizingSpec,
    status=WorkloadSizingStatus,
    description=(
        "Sizes a GPU inference workload: replicas from measured GPU utilisation and queue "
        "depth, scale to zero and back, and the MIG slice or GPU type it should run on."
    ),
    spec_description="What to size and how: targets, bounds, rates, scale to zero.",
    status_description="What the operator observed, decided and recommends.",
    printer_columns=PRINTER_COLUMNS,
    source="gpusizer.api.v1alpha1",
)

GPU_PARTITIONING = Kind(
    kind=partitioning.KIND,
    plural=partitioning.PLURAL,
    singular=partitioning.SINGULAR,
    short_names=partitioning.SHORT_NAMES,
    namespaced=False,
    spec=partitioning.GPUPartitioningSpec,
    status=partitioning.GPUPartitioningStatus,
    description=(
        "Re-partitions the MIG layouts of the GPU nodes it selects so the slices the fleet "
        "needs exist, on the fewest GPUs and moving the fewest pods, through NVIDIA's "
        "mig-manager protocol (a mig-parted config, cordon and drain, nvidia.com/mig.config)."
    ),
    spec_description="Which nodes, how far to act, which profiles, and how to drain.",
    status_description="The plan per node, and where each re-partition is.",
    printer_columns=[
        {"name": "Mode", "type": "string", "jsonPath": ".spec.mode"},
        {"name": "Nodes", "type": "integer", "jsonPath": ".status.summary.nodes"},
        {"name": "GPUs", "type": "integer", "jsonPath": ".status.summary.gpus"},
        {"name": "Needed", "type": "integer", "jsonPath": ".status.summary.gpusNeededNow"},
        {"name": "Planned", "type": "integer", "jsonPath": ".status.summary.gpusNeededPlanned"},
        {
            "name": "Partitioned",
            "type": "string",
            "jsonPath": '.status.conditions[?(@.type=="Partitioned")].status',
        },
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ],
    source="gpusizer.api.partitioning",
)

KINDS = (WORKLOAD_SIZING, GPU_PARTITIONING)


def crd(kind: Kind = WORKLOAD_SIZING) -> dict[str, Any]:
    spec_schema = openapi_schema(kind.spec)
    spec_schema["description"] = kind.spec_description
    _apply_factory_defaults(spec_schema, kind.spec)
    status_schema = openapi_schema(kind.status)
    status_schema["description"] = kind.status_description
    _apply_factory_defaults(status_schema, kind.status)
    names: dict[str, Any] = {
        "kind": kind.kind,
        "listKind": f"{kind.kind}List",
        "plural": kind.plural,
        "singular": kind.singular,
        "shortNames": kind.short_names,
        "categories": ["gpusizer"],
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{kind.plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced" if kind.namespaced else "Cluster",
            "names": names,
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": kind.printer_columns,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": kind.description,
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


def crd_yaml(kind: Kind = WORKLOAD_SIZING) -> str:
    header = f"# Generated by `gpusizer crds` from {kind.source}: do not edit.\n"
    return header + yaml.safe_dump(crd(kind), sort_keys=False, width=100)
