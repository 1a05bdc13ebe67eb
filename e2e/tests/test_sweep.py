"""The pod list the sweep compares kopf's cache with, on the real API server: every pod of the
namespaces asked, across pages, and nothing of the others."""

from __future__ import annotations

import uuid

import pytest
from gpusizer.sweep import pod_uids

from .conftest import Cluster

pytestmark = pytest.mark.e2e


def pod_manifest(name: str) -> str:
    return (
        f"apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\n"
        "spec: {containers: [{name: server, image: server}]}\n"
    )


def test_the_pods_of_the_namespaces_asked_across_pages(cluster: Cluster) -> None:
    namespaces = [f"sweep-{uuid.uuid4().hex[:6]}" for _ in range(2)]
    for namespace in namespaces:
        cluster.kubectl("create", "namespace", namespace)
    try:
        for n in range(3):
            cluster.kubectl("-n", namespaces[0], "apply", "-f", "-", stdin=pod_manifest(f"p{n}"))
        cluster.kubectl("-n", namespaces[1], "apply", "-f", "-", stdin=pod_manifest("other"))
        created = cluster.kubectl_json("-n", namespaces[0], "get", "pods")["items"]
        uids = {p["metadata"]["uid"] for p in created}
        assert len(uids) == 3
        assert pod_uids(cluster.api_client(), [namespaces[0]], page_size=2) == uids
        both = pod_uids(cluster.api_client(), namespaces, page_size=2)
        assert both > uids and len(both) == 4
        assert pod_uids(cluster.api_client(), []) == set()
    finally:
        for namespace in namespaces:
            cluster.kubectl("delete", "namespace", namespace, "--wait=false")
