"""Writes a WorkloadSizing's status: the decision task runs outside kopf's handlers, so it
patches the status subresource itself."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import urllib3
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from gpusizer.api.v1alpha1 import GROUP, PLURAL, VERSION


class StatusNotWritten(Exception):
    """The API server refused the status patch or could not be reached; the message is one
    line (an ApiException's text carries every response header)."""


class StatusWriter:
    def __init__(self, client: k8s.ApiClient) -> None:
        self._api = k8s.CustomObjectsApi(client)

    async def write(self, namespace: str, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        """A JSON merge patch of the status; returns the status as the API server keeps it."""
        try:
            written = await asyncio.to_thread(
                self._api.patch_namespaced_custom_object_status,
                GROUP,
                VERSION,
                namespace,
                PLURAL,
                name,
                {"status": dict(patch)},
            )
        except ApiException as exc:
            raise StatusNotWritten(f"HTTP {exc.status} {exc.reason}") from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise StatusNotWritten(str(exc)) from exc
        status = written.get("status") if isinstance(written, Mapping) else None
        return dict(status) if isinstance(status, Mapping) else {}
