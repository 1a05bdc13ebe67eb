"""The operator process: the kopf handlers registered, and kopf run until it is stopped."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import kopf

from gpusizer import handlers, indexing_gate
from gpusizer.settings import OperatorSettings


def run_operator(
    settings: OperatorSettings, namespaces: Sequence[str], health_address: str
) -> None:
    """Watches `namespaces`, or the whole cluster when there are none."""
    indexing_gate.wake_only_on_change()
    indexing_gate.index_only_kinds_pass()
    handlers.register(settings)
    asyncio.run(
        kopf.operator(
            clusterwide=not namespaces,
            namespaces=namespaces,
            standalone=settings.peering is None,
            peering_name=settings.peering,
            liveness_endpoint=f"http://{health_address}/healthz",
            memo=kopf.Memo(config=settings),
        )
    )
