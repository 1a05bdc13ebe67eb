"""The Prometheus client: instant queries off the event loop, every failure a Problem.

prometheus-api-client is blocking; its calls run in worker threads of their own so the
operator's event loop keeps serving the API watches while Prometheus is slow. This is the
operator's one implementation of `gpusizer.ports.MetricsSource`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import requests
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from urllib3.util.retry import Retry

from gpusizer.report import metrics
from gpusizer.settings import PrometheusSettings
from gpusizer.signals.parse import (
    LabelledValue,
    PodSamples,
    Problem,
    labelled_values,
    per_pod,
    scalar,
)
from gpusizer.signals.queries import PodQuery
from gpusizer.vocabulary import Reason

log = logging.getLogger(__name__)

QUERY_THREADS = 8  # a full read's queries run at once, plus room for user queries
# The reads over a window (right-sizing's history, the efficiency figures, the ledger) are a
# few dozen range queries every right-sizing period, each of them costlier than a whole full
# read. They run on a source of their own with this many threads: on the readers' threads the
# ledger's twelve took all eight and the replica reads queued behind them; and they were in
# a window at 10,000 workloads whose replica reads timed out (not shown to be the cause:
# bench/README.md, "Issue 29: window reads in a lane of their own").
WINDOW_QUERY_THREADS = 2
# A refused connection or a 502-504 is asked once more; a query that timed out is not. Sent
# again, it would load a Prometheus that is already slow, and the read would wait a second
# timeout. And urllib3 keeps the timeout with its traceback on the retry's response: every
# frame of the thread then stayed alive, the decoded answer in them, until a full collection
# (bench/README.md, "Issue 29: the operator's own /metrics").


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
    def __init__(self, settings: PrometheusSettings, threads: int = QUERY_THREADS) -> None:
        self._settings = settings
        session = requests.Session()
        # PrometheusConnect ignores disable_ssl when given a session: verification is set here.
        session.verify = settings.ca_file or not settings.insecure_skip_verify
        if settings.bearer_token_file:
            session.auth = BearerTokenFile(settings.bearer_token_file)
        session.hooks["response"].append(_reject_unauthorized)
        self._client = PrometheusConnect(
            url=settings.url,
            retry=Retry(total=1, read=False, backoff_factor=0.2, status_forcelist=[502, 503, 504]),
            auth=settings.basic_auth,
            session=session,
            timeout=int(max(1, settings.timeout_seconds)),
        )
        # Queries get threads of their own: in the shared pool a read waited behind every
        # workload's target read (bench/README.md).
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="prometheus")

    async def query(
        self, promql: str, signal: str, at: float | None = None
    ) -> tuple[Any, Problem | None]:
        """Run one instant query off the event loop, at `at` (Unix seconds) or Prometheus's
        now; failures become a Problem."""
        started = time.monotonic()
        params = None if at is None else {"time": f"{at:.3f}"}
        try:
            result = await asyncio.get_running_loop().run_in_executor(
                self._executor, self._client.custom_query, promql, params
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

    async def _per_pod(self, signal: str, query: PodQuery) -> PodSamples | Problem:
        result, problem = await self.query(query.promql, signal)
        if problem is not None:
            return problem
        return per_pod(result, scale=query.scale, combine=query.combine, now=time.time())

    async def per_pod_batch(
        self, wanted: Mapping[str, PodQuery]
    ) -> tuple[dict[str, PodSamples], dict[str, Problem]]:
        """Several per-pod signals at once; a signal whose query fails is in the second dict
        with the reason."""
        results = await asyncio.gather(*(self._per_pod(n, q) for n, q in wanted.items()))
        samples: dict[str, PodSamples] = {}
        errors: dict[str, Problem] = {}
        for name, outcome in zip(wanted, results, strict=True):
            if isinstance(outcome, Problem):
                errors[name] = outcome
            else:
                samples[name] = outcome
        return samples, errors

    async def series_batch(
        self, wanted: Mapping[str, str]
    ) -> tuple[dict[str, list[LabelledValue]], dict[str, Problem]]:
        at = time.time()
        results = await asyncio.gather(*(self.query(q, n, at) for n, q in wanted.items()))
        found: dict[str, list[LabelledValue]] = {}
        errors: dict[str, Problem] = {}
        for name, (result, problem) in zip(wanted, results, strict=True):
            if problem is not None:
                errors[name] = problem
                continue
            found[name], dropped = labelled_values(result)
            if dropped:
                log.warning("%s: %d series without a finite value were left out", name, dropped)
        return found, errors

    async def scalar(self, promql: str) -> tuple[float | None, Problem | None]:
        result, problem = await self.query(promql, "wake")
        if problem is not None:
            return None, problem
        return scalar(result)


def _cause(exc: requests.exceptions.RequestException) -> str:
    """The root cause first: urllib3's retry wrapper names the URL-encoded query before the
    reason, which pushed "Read timed out" or "too many 503 error responses" out of the
    condition message."""
    inner = exc.args[0] if exc.args else None
    reason = getattr(inner, "reason", None)
    if isinstance(reason, BaseException):
        return f"{type(reason).__name__}: {reason}"
    return str(exc)
