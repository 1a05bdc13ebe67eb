"""The CRD in crds/ is generated from the models; these fail when the two drift apart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from gpusizer.api.crd import GPU_PARTITIONING, WORKLOAD_SIZING, Kind, crd, crd_yaml
from gpusizer.api.v1alpha1 import ReplicasSpec

REPO = Path(__file__).parents[2]
CRD_COPIES = [
    (REPO / "crds" / "gpusizer.io_workloadsizings.yaml", WORKLOAD_SIZING),
    (REPO / "deploy" / "crd.yaml", WORKLOAD_SIZING),
    (REPO / "crds" / "gpusizer.io_gpupartitionings.yaml", GPU_PARTITIONING),
    (REPO / "deploy" / "crd-gpupartitionings.yaml", GPU_PARTITIONING),
]


@pytest.mark.parametrize(("path", "kind"), CRD_COPIES, ids=lambda p: str(p))
def test_crd_files_match_models(path: Path, kind: Kind) -> None:
    assert path.read_text() == crd_yaml(kind), f"{path} is stale: run `make crds`"


def _walk(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found = []
    if isinstance(node, dict):
        if "type" in node or "properties" in node:
            found.append((path, node))
        for key, value in node.get("properties", {}).items():
            found.extend(_walk(value, f"{path}.{key}"))
        if "items" in node:
            found.extend(_walk(node["items"], f"{path}[]"))
        if isinstance(node.get("additionalProperties"), dict):
            found.extend(_walk(node["additionalProperties"], f"{path}{{}}"))
    return found


def _version(kind: Kind = WORKLOAD_SIZING) -> dict[str, Any]:
    version: dict[str, Any] = crd(kind)["spec"]["versions"][0]
    return version


@pytest.mark.parametrize("kind", [WORKLOAD_SIZING, GPU_PARTITIONING], ids=lambda k: k.kind)
def test_schema_is_structural_and_documented(kind: Kind) -> None:
    schema = _version(kind)["schema"]["openAPIV3Schema"]
    spec = schema["properties"]["spec"]
    for path, node in _walk(spec, "spec"):
        assert "type" in node, f"{path} has no type"
        assert not {"$ref", "anyOf", "oneOf", "allOf"} & node.keys(), f"{path} is not structural"
        if not path.endswith("[]"):
            assert node.get("description"), f"{path} has no description for kubectl explain"
        for bound in ("exclusiveMinimum", "exclusiveMaximum"):
            assert node.get(bound) in (None, True), f"{path}.{bound} must be a boolean in v3.0"


def test_names_subresource_and_columns() -> None:
    spec = crd()["spec"]
    assert spec["names"]["shortNames"] == ["wls"]
    assert spec["scope"] == "Namespaced"
    version = _version()
    assert version["subresources"] == {"status": {}}
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert columns == [
        "Target",
        "Mode",
        "Current",
        "Desired",
        "GPU%",
        "Queue",
        "Slice",
        "Cost/1kReq",
        "Ready",
        "Age",
    ]


def test_cel_rules_present() -> None:
    spec = _version()["schema"]["openAPIV3Schema"]["properties"]["spec"]
    rules = [r["rule"] for r in spec["properties"]["replicas"]["x-kubernetes-validations"]]
    assert "self.min <= self.max" in rules
    assert any("targetGPUUtilization" in r and "targetQueuePerReplica" in r for r in rules)
    assert spec["x-kubernetes-validations"][0]["fieldPath"] == ".replicas.min"


def test_defaults_fill_omitted_objects() -> None:
    replicas = _version()["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"][
        "replicas"
    ]
    model_default = ReplicasSpec.model_fields["scale_down"].get_default(call_default_factory=True)
    assert replicas["properties"]["scaleDown"]["default"] == model_default.model_dump(by_alias=True)
    assert yaml.safe_load(crd_yaml())["metadata"]["name"] == "workloadsizings.gpusizer.io"


def test_gpu_partitioning_is_cluster_scoped_with_its_rules_and_defaults() -> None:
    spec = crd(GPU_PARTITIONING)["spec"]
    assert spec["scope"] == "Cluster" and spec["names"]["shortNames"] == ["gpup"]
    schema = _version(GPU_PARTITIONING)["schema"]["openAPIV3Schema"]["properties"]["spec"]
    rules = [r["rule"] for r in schema["x-kubernetes-validations"]]
    assert any("allowedProfiles" in r and "spareSlices" in r for r in rules)
    assert schema["properties"]["maxNodesUnavailable"]["default"] == 1
    assert schema["properties"]["mode"]["default"] == "Recommend"
    assert schema["properties"]["drain"]["default"] == {"timeoutSeconds": 1800}
    assert schema["properties"]["nodeSelector"]["minProperties"] == 1
    assert schema["required"] == ["nodeSelector"]
