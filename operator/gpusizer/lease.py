"""The operator's coordination.k8s.io Lease: read and written through the Kubernetes API, and
the loop that keeps this replica in charge while kopf's peering lets it lead (`charge`)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from pydantic import TypeAdapter, ValidationError

from gpusizer.api.annotations import PROMETHEUS_OUTAGES_ANNOTATION
from gpusizer.charge import (
    LEASE_SECONDS,
    RETRY_SECONDS,
    Charge,
    LeaseRecord,
    OutageSpans,
    Step,
)
from gpusizer.kube import SaidOnce
from gpusizer.ports import LeaseStore
from gpusizer.report import metrics

log = logging.getLogger(__name__)

# Where a pod finds its own namespace: the default Lease lives beside the operator.
SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


class LeaseConflict(Exception):
    """Another replica wrote the Lease since we read it (409), or created it first."""


def replica_identity() -> str:
    """Unique per process: a restarted replica is a new holder, never the one it replaces."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


def pod_namespace(path: str = SERVICE_ACCOUNT_NAMESPACE) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip() or None
    except OSError:
        return None


OUTAGE_SPANS: TypeAdapter[OutageSpans] = TypeAdapter(OutageSpans)


def lease_record(obj: Mapping[str, Any]) -> tuple[LeaseRecord, list[str]]:
    """A Lease as the API server returned it, and what in it was not as written (someone
    edited it): each such field is read as unset, said in the second list by its name."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    problems = []
    holder = spec.get("holderIdentity") or ""
    if not isinstance(holder, str):
        problems.append(f"spec.holderIdentity is not a string: {holder!r}")
        holder = ""
    duration = spec.get("leaseDurationSeconds", LEASE_SECONDS)
    if isinstance(duration, bool) or not isinstance(duration, int) or duration <= 0:
        problems.append(f"spec.leaseDurationSeconds is not a positive integer: {duration!r}")
        duration = LEASE_SECONDS
    transitions = spec.get("leaseTransitions") or 0
    if isinstance(transitions, bool) or not isinstance(transitions, int):
        problems.append(f"spec.leaseTransitions is not an integer: {transitions!r}")
        transitions = 0
    outages: OutageSpans = ()
    annotated = (meta.get("annotations") or {}).get(PROMETHEUS_OUTAGES_ANNOTATION)
    if annotated is not None:
        try:
            outages = OUTAGE_SPANS.validate_json(annotated)
        except ValidationError:
            problems.append(
                f"metadata.annotations[{PROMETHEUS_OUTAGES_ANNOTATION}] is not a list of "
                f"[since, until or null] pairs: {annotated!r}"
            )
    record = LeaseRecord(
        holder=holder,
        renewed=str(spec.get("renewTime") or ""),
        duration_seconds=duration,
        transitions=transitions,
        version=str(meta.get("resourceVersion") or ""),
        prometheus_outages=outages,
    )
    return record, problems


def lease_body(namespace: str, name: str, record: LeaseRecord) -> dict[str, Any]:
    outages = record.prometheus_outages
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": name,
            "namespace": namespace,
            **({"resourceVersion": record.version} if record.version else {}),
            "annotations": {PROMETHEUS_OUTAGES_ANNOTATION: json.dumps(outages)} if outages else {},
        },
        "spec": {
            "holderIdentity": record.holder or None,
            "leaseDurationSeconds": record.duration_seconds,
            "renewTime": record.renewed or None,
            "leaseTransitions": record.transitions,
        },
    }


class KubeLease:
    """A LeaseStore on the API server. Blocking: `keep_charge` calls it from its own thread."""

    def __init__(self, client: k8s.ApiClient, namespace: str, name: str) -> None:
        self._api = k8s.CoordinationV1Api(client)
        self.namespace, self.name = namespace, name
        self._said: list[str] = []

    def read(self) -> LeaseRecord | None:
        try:
            response = self._api.read_namespaced_lease(
                self.name, self.namespace, _preload_content=False
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        record, problems = lease_record(json.loads(response.data))
        if problems != self._said:  # once per change, not at every read
            for problem in problems:
                log.warning("Lease %s/%s: %s", self.namespace, self.name, problem)
            self._said = problems
        return record

    def write(self, record: LeaseRecord) -> LeaseRecord:
        body = lease_body(self.namespace, self.name, record)
        try:
            if record.version:
                response = self._api.replace_namespaced_lease(
                    self.name, self.namespace, body, _preload_content=False
                )
            else:
                response = self._api.create_namespaced_lease(
                    self.namespace, body, _preload_content=False
                )
        except ApiException as exc:
            if exc.status in (409, 422) and (exc.status == 409 or not record.version):
                raise LeaseConflict(f"{exc.status} {exc.reason}") from exc
            raise
        return lease_record(json.loads(response.data))[0]


async def keep_charge(
    charge: Charge,
    store: LeaseStore,
    leads: Callable[[], bool],
    prometheus_outages: Callable[[], OutageSpans],
    took_over: Callable[[LeaseRecord | None], None],
    monotonic: Callable[[], float] = time.monotonic,
    wall: Callable[[], float] = time.time,
) -> None:
    """Every RETRY_SECONDS: ask `leads` (blocking: kopf's peering) whether this replica may
    lead, read the Lease, then take it, renew it or free it (`Charge.step`), until cancelled,
    when a Lease held is freed for the peer at once. Its own thread: a renewal queued behind
    thousands of status writes for the shared worker threads would lose the Lease. `took_over`
    gets the record this replica replaced when it comes into charge."""
    thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpusizer-lease")
    loop = asyncio.get_running_loop()
    in_charge, requests = False, SaidOnce(log, "reading or writing the operator's Lease")
    try:
        while True:
            started = monotonic()
            try:
                wants = await loop.run_in_executor(thread, leads)
                record = await loop.run_in_executor(thread, store.read)
                step = charge.step(record, wants, started)
                if step in (Step.ACQUIRE, Step.RENEW):
                    claim = charge.claim(record, wall(), prometheus_outages())
                    await loop.run_in_executor(thread, store.write, claim)
                    if charge.wrote(started):
                        took_over(record if step is Step.ACQUIRE else None)
                elif step is Step.RELEASE and record is not None:
                    await loop.run_in_executor(thread, store.write, charge.released(record))
                requests.succeeded()
            except LeaseConflict:
                pass  # another replica wrote it first: the next read says who holds it
            except Exception as exc:  # the API server is down: held() runs out by itself
                requests.failed(exc)
            now_in_charge = charge.held(monotonic())
            if now_in_charge != in_charge:
                in_charge = now_in_charge
                metrics.IN_CHARGE.set(int(in_charge))
                if in_charge:
                    log.info("in charge: this replica holds the operator's Lease")
                else:
                    log.warning("not in charge: this replica no longer holds the operator's Lease")
            await asyncio.sleep(RETRY_SECONDS)
    finally:
        if charge.held(monotonic()):
            freeing = loop.run_in_executor(thread, release, charge, store)
            try:
                await asyncio.wait_for(asyncio.shield(freeing), RELEASE_SECONDS)
            except Exception as exc:  # exiting anyway: the peer waits the Lease out
                log.warning("freeing the operator's Lease failed: %s", exc)
        thread.shutdown(wait=False, cancel_futures=True)


RELEASE_SECONDS = 5.0  # of an exit's grace (startup.EXIT_GRACE_SECONDS)


def release(charge: Charge, store: LeaseStore) -> None:
    """Frees the Lease if this replica still holds it (blocking)."""
    record = store.read()
    if record is not None and record.holder == charge.identity:
        store.write(charge.released(record))
