"""The lists compared with kopf's cache, on the real API server: every pod, or every
WorkloadSizing, of the namespaces asked, across pages, and nothing of the others."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest
from gpusizer.sweep import pod_uids, workload_uids

from .conftest import Cluster
from .operator_support import install_manifests

pytestmark = pytest.mark.e2e


def pod_manifest(name: str) -> str:
    return (
        f"apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\n"
        "spec: {containers: [{name: server, image: server}]}\n"
    )


def workload_manifest(name: str) -> str:
    return (
        f"apiVersion: gpusizer.io/v1alpha1\nkind: WorkloadSizing\nmetadata: {{name: {name}}}\n"
        "spec: {targetRef: {name: absent}, mode: 'Off',"
        " replicas: {min: 1, max: 2, targetGPUUtilization: 70}}\n"
    )


# pods for the pod sweep; WorkloadSizings for a replica taking over, which drops those
# deleted while it was paused (startup.Runtime.confirm_fleet)
@pytest.mark.parametrize(
    ("resource", "manifest", "listed"),
    [("pods", pod_manifest, pod_uids), ("workloadsizings", workload_manifest, workload_uids)],
)
def test_the_objects_of_the_namespaces_asked_across_pages(
    cluster: Cluster,
    resource: str,
    manifest: Callable[[str], str],
    listed: Callable[..., set[str]],
) -> None:
    install_manifests(cluster)
    # the third holds none: the API server lists its items as null, not []
    namespaces = [f"sweep-{uuid.uuid4().hex[:6]}" for _ in range(3)]
    for namespace in namespaces:
        cluster.kubectl("create", "namespace", namespace)
    try:
        for n in range(3):
            cluster.kubectl("-n", namespaces[0], "apply", "-f", "-", stdin=manifest(f"o{n}"))
        cluster.kubectl("-n", namespaces[1], "apply", "-f", "-", stdin=manifest("other"))
        created = cluster.kubectl_json("-n", namespaces[0], "get", resource)["items"]
        uids = {o["metadata"]["uid"] for o in created}
        assert len(uids) == 3
        assert listed(cluster.api_client(), [namespaces[0]], page_size=2) == uids
        every = listed(cluster.api_client(), namespaces, page_size=2)
        assert every > uids and len(every) == 4
        assert listed(cluster.api_client(), [namespaces[2]]) == set()
        assert listed(cluster.api_client(), []) == set()
    finally:
        for namespace in namespaces:
            cluster.kubectl("delete", "namespace", namespace, "--wait=false")
