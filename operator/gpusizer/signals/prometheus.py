"""The Prometheus client: instant queries off the event loop, every failure a Problem.

Queries are blocking HTTP calls (requests); they run in worker threads of their own so the
operator's event loop keeps serving the API watches while Prometheus is slow. This is the
operator's one implementation of `gpusizer.ports.MetricsSource`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import requests
from requests.adapters import HTTPAdapter
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

T = TypeVar("T")

log = logging.getLogger(__name__)

QUERY_THREADS = 8  # a full read's queries run at once, plus room for user queries
# The reads over a window (right-sizing's history, the efficiency figures, the ledger) are a
# few dozen range queries (the ledger's once every ten minutes, the others every right-sizing
# period), each of them costlier than a whole full read. They run on a source of their own
# with this many threads: on the readers' threads the ledger's twelve took all eight and the
# replica reads queued behind them; and they were in a window at 10,000 workloads whose
# replica reads timed out (not shown to be the cause: bench/README.md, "Issue 29: window
# reads in a lane of their own").
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
    # Checked before any other status, so that credentials are reported as such.
    if response.status_code in (401, 403):
        raise AuthRejected(f"HTTP {response.status_code} {response.reason}")


class QueryRefused(Exception):
    """Prometheus answered, but not with a result: the message says what it said."""


def _refusal(response: requests.Response) -> str:
    """Prometheus' own `errorType: error` when the body is its JSON error, else the body."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        said = f"{body.get('errorType') or 'error'}: {body['error']}"
    else:
        said = response.text
    return f"HTTP {response.status_code}: {said}"[:500]


def _result(response: requests.Response) -> Any:
    if response.status_code != 200:
        raise QueryRefused(_refusal(response))
    body = response.json()
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, dict) or "result" not in data:
        raise QueryRefused(f"an answer without data.result: {response.text[:200]}")
    return data["result"]


class PrometheusSource:
    def __init__(self, settings: PrometheusSettings, threads: int = QUERY_THREADS) -> None:
        self._settings = settings
        self._url = f"{settings.url}/api/v1/query"
        self._timeout = max(1.0, settings.timeout_seconds)
        self._session = requests.Session()
        self._session.verify = settings.ca_file or not settings.insecure_skip_verify
        bearer = BearerTokenFile(settings.bearer_token_file) if settings.bearer_token_file else None
        self._session.auth = settings.basic_auth or bearer
        self._session.hooks["response"].append(_reject_unauthorized)
        retry = Retry(total=1, read=False, backoff_factor=0.2, status_forcelist=[502, 503, 504])
        self._session.mount(settings.url, HTTPAdapter(max_retries=retry))
        # Queries get threads of their own: in the shared pool a read waited behind every
        # workload's target read (bench/README.md).
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="prometheus")
        # The answers are fetched together but decoded and read one at a time: a decoded
        # answer is several times the samples read from it, and the seven of a full read,
        # alive together, were the most the operator's heap held at a read (bench/README.md,
        # "Issue 29: one answer decoded at a time"). Read on the event loop, as before: the run
        # that read them in the worker threads had its turns late (same section).
        self._decoding: tuple[asyncio.AbstractEventLoop, asyncio.Lock] | None = None

    def _decoding_lock(self, loop: asyncio.AbstractEventLoop) -> asyncio.Lock:
        """One lock for each event loop in turn: an asyncio lock serves only the loop it first
        waited in, and `gpusizer recommend` runs two loops, one after the other, on a source."""
        if self._decoding is None or self._decoding[0] is not loop:
            self._decoding = (loop, asyncio.Lock())
        return self._decoding[1]

    def _fetch(self, promql: str, at: float | None) -> requests.Response:
        params = {"query": promql} if at is None else {"query": promql, "time": f"{at:.3f}"}
        # verify given again: requests lets REQUESTS_CA_BUNDLE override the session's own
        return self._session.get(
            self._url, params=params, timeout=self._timeout, verify=self._session.verify
        )

    async def query(
        self,
        promql: str,
        signal: str,
        read: Callable[[Any], T],
        at: float | None = None,
    ) -> T | Problem:
        """Run one instant query off the event loop, at `at` (Unix seconds) or Prometheus's
        now, and `read` its result; a failure is a Problem."""
        loop = asyncio.get_running_loop()
        started = time.monotonic()
        try:
            response = await loop.run_in_executor(self._executor, self._fetch, promql, at)
            async with self._decoding_lock(loop):
                found = read(await loop.run_in_executor(self._executor, _result, response))
        except AuthRejected as exc:
            return self._failed(
                signal,
                Reason.PROMETHEUS_UNAUTHORIZED,
                f"{self._settings.url} refused the credentials ({exc}): check the bearer token "
                "or basic auth settings",
            )
        except requests.exceptions.JSONDecodeError as exc:  # a RequestException, yet answered
            return self._failed(signal, Reason.QUERY_ERROR, f"unreadable response: {exc}")
        except requests.exceptions.Timeout as exc:
            return self._failed(signal, Reason.PROMETHEUS_UNREACHABLE, f"timed out: {_cause(exc)}")
        except requests.exceptions.SSLError as exc:
            return self._failed(
                signal,
                Reason.PROMETHEUS_UNREACHABLE,
                f"TLS with {self._settings.url} failed (is --prometheus-ca-file the CA that "
                f"signed its certificate?): {exc}",
            )
        except requests.exceptions.RequestException as exc:
            return self._failed(
                signal, Reason.PROMETHEUS_UNREACHABLE, f"{self._settings.url}: {_cause(exc)}"
            )
        except OSError as exc:  # the token file (RequestException, caught above, is one too)
            return self._failed(
                signal, Reason.PROMETHEUS_UNAUTHORIZED, f"cannot read the bearer token: {exc}"
            )
        except QueryRefused as exc:
            return self._failed(signal, Reason.QUERY_ERROR, str(exc))
        except ValueError as exc:  # a body that is not JSON
            return self._failed(signal, Reason.QUERY_ERROR, f"unreadable response: {exc}")
        finally:
            metrics.QUERY_SECONDS.labels(signal=signal).observe(time.monotonic() - started)
        return found

    def _failed(self, signal: str, reason: Reason, message: str) -> Problem:
        metrics.QUERY_ERRORS.labels(signal=signal, reason=reason.value).inc()
        log.warning("prometheus query for %s failed (%s): %s", signal, reason.value, message)
        return Problem(reason, message)

    async def _per_pod(self, signal: str, query: PodQuery) -> PodSamples | Problem:
        def read(result: Any) -> PodSamples:
            return per_pod(result, scale=query.scale, combine=query.combine, now=time.time())

        return await self.query(query.promql, signal, read)

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
        results = await asyncio.gather(
            *(self.query(q, n, labelled_values, at) for n, q in wanted.items())
        )
        found: dict[str, list[LabelledValue]] = {}
        errors: dict[str, Problem] = {}
        for name, values in zip(wanted, results, strict=True):
            if isinstance(values, Problem):
                errors[name] = values
                continue
            found[name], dropped = values
            if dropped:
                log.warning("%s: %d series without a finite value were left out", name, dropped)
        return found, errors

    async def scalar(self, promql: str) -> tuple[float | None, Problem | None]:
        value = await self.query(promql, "wake", scalar)
        return (None, value) if isinstance(value, Problem) else value


def _cause(exc: requests.exceptions.RequestException) -> str:
    """The root cause first: urllib3's retry wrapper names the URL-encoded query before the
    reason, which pushed "Read timed out" or "too many 503 error responses" out of the
    condition message."""
    inner = exc.args[0] if exc.args else None
    reason = getattr(inner, "reason", None)
    if isinstance(reason, BaseException):
        return f"{type(reason).__name__}: {reason}"
    return str(exc)
