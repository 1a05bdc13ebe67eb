"""Reads from Prometheus: one query per signal per cycle, for every workload at once.

prometheus-api-client is blocking; its calls run in worker threads so the operator's event
loop keeps serving the API watches while Prometheus is slow.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import requests
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from urllib3.util.retry import Retry

from gpusizer.api.v1alpha1 import Server
from gpusizer.report import metrics
from gpusizer.signals.parse import (
    PodSamples,
    Problem,
    Sample,
    moved_pod_query,
    per_pod,
    pod_query,
    scalar,
)
from gpusizer.vocabulary import Reason

log = logging.getLogger(__name__)

QUERY_THREADS = 8  # a cycle's batched queries run at once (7), plus room for user queries

GPU_UTIL = "gpu_util"
MIG_UTIL = "mig_util"
MEMORY = "memory"

BATCHED_SIGNALS: dict[str, tuple[str, float, str]] = {
    # signal: (selector, scale, how a pod's GPUs combine)
    GPU_UTIL: ("DCGM_FI_DEV_GPU_UTIL", 1.0, "mean"),
    MIG_UTIL: ('DCGM_FI_PROF_GR_ENGINE_ACTIVE{GPU_I_ID!=""}', 100.0, "mean"),
    MEMORY: ("DCGM_FI_DEV_FB_USED", 1.0, "max"),
}

QUEUE_SERIES: dict[Server, str] = {
    Server.VLLM: "vllm:num_requests_waiting",
    Server.TRITON: "nv_inference_pending_request_count",
    Server.TGI: "tgi_queue_size",
    Server.SGLANG: "sglang:num_queue_reqs",
}


# A sample is stored when its scrape ends but stamped when it began: a read compares each pod's
# value now with its value this long before the previous read, so that a scrape which began
# before that read and landed after it still shows as a move. One that took longer waits for
# the next full read.
MOVE_MARGIN_SECONDS = 2.0


def queue_signal(server: Server) -> str:
    return f"queue:{server.value}"


# the signals replicas are sized on: a move in one of them is worth deciding on at once
REPLICA_SIGNALS = frozenset({GPU_UTIL, MIG_UTIL, *(queue_signal(s) for s in QUEUE_SERIES)})


def batched_signals(servers: Iterable[Server]) -> dict[str, tuple[str, float, str]]:
    """signal -> (selector, scale, how a pod's series combine) for one cycle's reads."""
    wanted: dict[str, tuple[str, float, str]] = dict(BATCHED_SIGNALS)
    for server in sorted(set(servers)):
        if server in QUEUE_SERIES:
            wanted[queue_signal(server)] = (QUEUE_SERIES[server], 1.0, "sum")
    return wanted


@dataclass
class Snapshot:
    """Everything the batched queries of one cycle returned: a full read, or a full read with
    the pods that moved since merged in (`SnapshotReader`)."""

    time: float
    signals: dict[str, PodSamples] = field(default_factory=dict)
    errors: dict[str, Problem] = field(default_factory=dict)
    full: bool = True  # whether every signal was read for every pod at `time`


@dataclass(frozen=True)
class PrometheusSettings:
    url: str
    timeout_seconds: float = 10.0
    bearer_token_file: str | None = None
    ca_file: str | None = None
    insecure_skip_verify: bool = False
    basic_auth: tuple[str, str] | None = None


class BearerTokenFile(requests.auth.AuthBase):
    """Reads the token at every request, so a rotated token (a projected service account
    token, a mounted Secret) is used without a restart."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __call__(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
        with open(self.path, encoding="utf-8") as f:
            request.headers["Authorization"] = f"Bearer {f.read().strip()}"
        return request


class AuthRejected(Exception):
    """Prometheus (or the proxy in front of it) answered 401 or 403."""


def _reject_unauthorized(response: requests.Response, *args: Any, **kwargs: Any) -> None:
    # prometheus-api-client turns every non-200 into one exception type; the status is
    # checked here so that credentials are reported as such.
    if response.status_code in (401, 403):
        raise AuthRejected(f"HTTP {response.status_code} {response.reason}")


class PrometheusSource:
    def __init__(self, settings: PrometheusSettings) -> None:
        self._settings = settings
        session = requests.Session()
        # PrometheusConnect ignores disable_ssl when given a session: verification is set here.
        session.verify = settings.ca_file or not settings.insecure_skip_verify
        if settings.bearer_token_file:
            session.auth = BearerTokenFile(settings.bearer_token_file)
        session.hooks["response"].append(_reject_unauthorized)
        self._client = PrometheusConnect(
            url=settings.url,
            retry=Retry(total=1, backoff_factor=0.2, status_forcelist=[502, 503, 504]),
            auth=settings.basic_auth,
            session=session,
            timeout=int(max(1, settings.timeout_seconds)),
        )
        # Queries get threads of their own: in the shared pool a cycle's snapshot waited behind
        # every workload's target read (2.8 s of a 5 s period at 1,000 workloads).
        self._executor = ThreadPoolExecutor(
            max_workers=QUERY_THREADS, thread_name_prefix="prometheus"
        )

    async def query(self, promql: str, signal: str) -> tuple[Any, Problem | None]:
        """Run one instant query off the event loop; failures become a Problem."""
        started = time.monotonic()
        try:
            result = await asyncio.get_running_loop().run_in_executor(
                self._executor, self._client.custom_query, promql
            )
        except AuthRejected as exc:
            return None, self._failed(
                signal,
                Reason.PROMETHEUS_UNAUTHORIZED,
                f"{self._settings.url} refused the credentials ({exc}): check the bearer token "
                "or basic auth settings",
            )
        except requests.exceptions.JSONDecodeError as exc:  # a RequestException, yet answered
            return None, self._failed(signal, Reason.QUERY_ERROR, f"unreadable response: {exc}")
        except requests.exceptions.Timeout as exc:
            return None, self._failed(
                signal, Reason.PROMETHEUS_UNREACHABLE, f"timed out: {_cause(exc)}"
            )
        except requests.exceptions.SSLError as exc:
            return None, self._failed(
                signal,
                Reason.PROMETHEUS_UNREACHABLE,
                f"TLS with {self._settings.url} failed (is --prometheus-ca-file the CA that "
                f"signed its certificate?): {exc}",
            )
        except requests.exceptions.RequestException as exc:
            return None, self._failed(
                signal, Reason.PROMETHEUS_UNREACHABLE, f"{self._settings.url}: {_cause(exc)}"
            )
        except OSError as exc:  # the token file (RequestException, caught above, is one too)
            return None, self._failed(
                signal, Reason.PROMETHEUS_UNAUTHORIZED, f"cannot read the bearer token: {exc}"
            )
        except PrometheusApiClientException as exc:
            return None, self._failed(signal, Reason.QUERY_ERROR, str(exc)[:500])
        except ValueError as exc:  # a body that is not JSON
            return None, self._failed(signal, Reason.QUERY_ERROR, f"unreadable response: {exc}")
        finally:
            metrics.QUERY_SECONDS.labels(signal=signal).observe(time.monotonic() - started)
        return result, None

    def _failed(self, signal: str, reason: Reason, message: str) -> Problem:
        metrics.QUERY_ERRORS.labels(signal=signal, reason=reason.value).inc()
        log.warning("prometheus query for %s failed (%s): %s", signal, reason.value, message)
        return Problem(reason, message)

    async def per_pod(self, promql: str, signal: str, scale: float, combine: str) -> PodSamples:
        """Samples per pod of a query that returns them per pod (see `pod_query`)."""
        result, problem = await self.query(promql, signal)
        if problem is not None:
            raise SignalFailed(problem)
        return per_pod(result, scale=scale, combine=combine, now=time.time())

    async def per_pod_batch(
        self, wanted: Mapping[str, tuple[str, float, str]]
    ) -> tuple[dict[str, PodSamples], dict[str, Problem]]:
        """Several per-pod signals at once (signal -> (PromQL, scale, combine)); a signal
        whose query fails is in the second dict with the reason."""
        names = list(wanted)
        results = await asyncio.gather(
            *(
                self.per_pod(query, name, scale, combine)
                for name, (query, scale, combine) in wanted.items()
            ),
            return_exceptions=True,
        )
        samples: dict[str, PodSamples] = {}
        errors: dict[str, Problem] = {}
        for name, outcome in zip(names, results, strict=True):
            if isinstance(outcome, SignalFailed):
                errors[name] = outcome.problem
            elif isinstance(outcome, BaseException):
                raise outcome
            else:
                samples[name] = outcome
        return samples, errors

    async def snapshot(self, servers: Iterable[Server]) -> Snapshot:
        """The batched queries of one cycle: a constant number, whatever the workload count."""
        snap = Snapshot(time=time.time())
        snap.signals, snap.errors = await self.per_pod_batch(
            {
                name: (pod_query(selector, combine), scale, combine)
                for name, (selector, scale, combine) in batched_signals(servers).items()
            }
        )
        return snap

    async def moved(self, base: Snapshot, since_seconds: float) -> Snapshot:
        """`base` with the replica signals' pods whose value moved in the last `since_seconds`
        merged in: one query per signal that `base` has samples of, whatever the workload count
        (a signal it failed to read, or that no pod has, waits for the next full snapshot). A
        signal whose query fails keeps `base`'s samples: the next full snapshot says whether
        Prometheus is failing. A moved pod's age is taken as `since_seconds`, the most it can
        be."""
        wanted = {
            name: (moved_pod_query(selector, combine, 1 / scale, since_seconds), scale, combine)
            for name, (selector, scale, combine) in batched_signals(Server).items()
            if name in REPLICA_SIGNALS and name in base.signals and base.signals[name].samples
        }
        snap = Snapshot(time.time(), dict(base.signals), base.errors, full=False)
        read, _ = await self.per_pod_batch({f"moved:{n}": q for n, q in wanted.items()})
        for name in wanted:
            update = read.get(f"moved:{name}")
            if update is not None and (update.samples or update.problems):
                update.samples = {
                    key: Sample(sample.value, since_seconds)
                    for key, sample in update.samples.items()
                }
                snap.signals[name] = merged(snap.signals[name], update)
        return snap

    async def custom_per_pod(self, promql: str) -> PodSamples | Problem:
        """A user's queueQuery, summed per pod."""
        try:
            return await self.per_pod(pod_query(promql, "sum"), "queue:custom", 1.0, "sum")
        except SignalFailed as failed:
            return failed.problem

    async def scalar(self, promql: str) -> tuple[float | None, Problem | None]:
        result, problem = await self.query(promql, "wake")
        if problem is not None:
            return None, problem
        return scalar(result)


def merged(base: PodSamples, update: PodSamples) -> PodSamples:
    """`base` with `update`'s pods replaced: a pod is either a sample or a problem."""
    samples = {k: v for k, v in base.samples.items() if k not in update.problems}
    samples.update(update.samples)
    problems = {k: v for k, v in base.problems.items() if k not in update.samples}
    problems.update(update.problems)
    return PodSamples(samples=samples, problems=problems, read_at=base.read_at)


class SnapshotReader:
    """What each read of the cycle clock asks Prometheus: every signal for every pod once per
    `full_every_seconds` (a sync period), and in between only the pods whose utilisation or
    queue moved since the read before, merged into the latest read.

    A full read at 5,000 workloads returns about 30,000 series (a pod's value and its
    timestamp twin for utilisation, memory and the queue) and took 0.7-1.1 s (bench/README.md);
    the moves are a few series, so a load change is seen within a read period of its scrape
    for about the Prometheus work of one query of a full read."""

    def __init__(
        self,
        source: PrometheusSource,
        servers: Iterable[Server],
        full_every_seconds: float,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._source = source
        self._servers = tuple(servers)
        self._full_every = full_every_seconds
        self._monotonic = monotonic
        self._latest: Snapshot | None = None
        self._full_at = self._read_at = 0.0

    async def read(self) -> Snapshot:
        latest, now = self._latest, self._monotonic()
        since = now - self._read_at + MOVE_MARGIN_SECONDS
        self._read_at = now
        if latest is None or now - self._full_at >= self._full_every:
            self._full_at = now
            latest = await self._source.snapshot(self._servers)
        else:
            latest = await self._source.moved(latest, since)
        self._latest = latest
        return latest


def _cause(exc: requests.exceptions.RequestException) -> str:
    """The root cause first: urllib3's retry wrapper names the URL-encoded query before the
    reason, which pushed "Read timed out" or "too many 503 error responses" out of the
    condition message."""
    inner = exc.args[0] if exc.args else None
    reason = getattr(inner, "reason", None)
    if isinstance(reason, BaseException):
        return f"{type(reason).__name__}: {reason}"
    return str(exc)


class SignalFailed(Exception):
    def __init__(self, problem: Problem) -> None:
        super().__init__(problem.message)
        self.problem = problem
