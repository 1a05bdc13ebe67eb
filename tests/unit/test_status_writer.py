"""A status patch the API server refuses is reported in one line, and nothing else escapes."""

from __future__ import annotations

from typing import Any

import pytest
import urllib3
from gpusizer.report.writer import StatusNotWritten, StatusWriter, WorkloadGone
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException


def writer_failing_with(error: Exception) -> StatusWriter:
    writer = StatusWriter(k8s.ApiClient(k8s.Configuration()))

    def patch(*args: Any) -> Any:
        raise error

    writer._api.patch_namespaced_custom_object_status = patch  # type: ignore[method-assign]
    return writer


@pytest.mark.parametrize(
    ("error", "message"),
    [
        (ApiException(status=429, reason="Too Many Requests"), "HTTP 429 Too Many Requests"),
        (ApiException(status=404, reason="Not Found"), "HTTP 404 Not Found"),
        (
            urllib3.exceptions.MaxRetryError(None, "/apis", "connection refused"),
            "connection refused",
        ),
        (ConnectionResetError("reset by peer"), "reset by peer"),
    ],
)
async def test_a_refused_or_unreachable_api_server_is_one_line(
    error: Exception, message: str
) -> None:
    with pytest.raises(StatusNotWritten) as raised:
        await writer_failing_with(error).write("llm", "chat", {"currentReplicas": 2})
    assert message in str(raised.value) and "\n" not in str(raised.value)


async def test_the_status_as_the_api_server_keeps_it_is_returned() -> None:
    writer = StatusWriter(k8s.ApiClient(k8s.Configuration()))
    sent: list[Any] = []

    def patch(*args: Any) -> Any:
        sent.append(args)
        return {"metadata": {"name": "chat"}, "status": {"currentReplicas": 2, "kept": True}}

    writer._api.patch_namespaced_custom_object_status = patch  # type: ignore[method-assign]
    assert await writer.write("llm", "chat", {"currentReplicas": 2}) == {
        "currentReplicas": 2,
        "kept": True,
    }
    assert sent == [
        (
            "gpusizer.io",
            "v1alpha1",
            "llm",
            "workloadsizings",
            "chat",
            {"status": {"currentReplicas": 2}},
        )
    ]


async def test_a_workload_that_is_gone_says_so() -> None:
    """Its deletion was missed (during a watch's outage): its turns end on this."""
    with pytest.raises(WorkloadGone):
        await writer_failing_with(ApiException(status=404, reason="Not Found")).write(
            "llm", "chat", {"currentReplicas": 2}
        )
    with pytest.raises(StatusNotWritten) as raised:
        await writer_failing_with(ApiException(status=409, reason="Conflict")).write(
            "llm", "chat", {"currentReplicas": 2}
        )
    assert not isinstance(raised.value, WorkloadGone)
