"""The PromQL the operator sends: one query per signal for every pod at once.

Pure: these build query text and name the signals; nothing here talks to Prometheus.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterable, Set
from typing import NamedTuple

from gpusizer.api.v1alpha1 import Server


class PodQuery(NamedTuple):
    """A query that returns each pod's value, and how to read it."""

    promql: str
    scale: float  # multiplies every value (GR_ENGINE_ACTIVE is 0-1, shown as percent)
    combine: str  # how a pod's series combine: mean, max or sum


GPU_UTIL = "gpu_util"
MIG_UTIL = "mig_util"
MEMORY = "memory"
KV_CACHE = "kv_cache"

# dcgm-exporter labels a GPU or MIG instance with the pod holding it, and an unallocated one
# with no pod: asking only for held ones spares Prometheus every idle GPU's series. Behind a
# ServiceMonitor without honorLabels `pod` names the exporter, so the matcher keeps every series
# and the idle ones are dropped when parsed (`parse.pod_key`).
HELD = 'pod!=""'

# signal: (selector, scale, how a pod's GPUs combine)
BATCHED_SIGNALS: dict[str, tuple[str, float, str]] = {
    GPU_UTIL: (f"DCGM_FI_DEV_GPU_UTIL{{{HELD}}}", 1.0, "mean"),
    MIG_UTIL: (f'DCGM_FI_PROF_GR_ENGINE_ACTIVE{{GPU_I_ID!="", {HELD}}}', 100.0, "mean"),
    MEMORY: (f"DCGM_FI_DEV_FB_USED{{{HELD}}}", 1.0, "max"),
}

# vLLM's share (0-1) of its KV cache in use: an LLM server saturates here before its GPU shows it
KV_CACHE_SERIES = "vllm:kv_cache_usage_perc"
# Signals a read asks for only while a workload in the fleet decides on them (`fleet.Member.
# optional_reads`): only replicas.targetKVCacheUsage reads the KV cache, whose query was the
# costliest of a full read at 10,000 workloads, and whose moves select every vLLM pod's series
# twice at every moved read (bench/README.md, "Issue 29").
OPTIONAL_SIGNALS = frozenset({KV_CACHE})
# the window of the served-request rate: long enough to hold two scrapes
REQUEST_RATE_WINDOW = "1m"

QUEUE_SERIES: dict[Server, str] = {
    Server.VLLM: "vllm:num_requests_waiting",
    Server.TRITON: "nv_inference_pending_request_count",
    Server.TGI: "tgi_queue_size",
    Server.SGLANG: "sglang:num_queue_reqs",
}

# What each inference server counts, as counters: requests served, output tokens and prompt
# tokens (None: it exports none). A pod runs one server, so each is read for every server at
# once, and whichever a pod exports is its count.
REQUESTS = "requests"
OUTPUT_TOKENS = "output_tokens"
PROMPT_TOKENS = "prompt_tokens"
SERVER_COUNTERS: dict[str, dict[Server, str | None]] = {
    REQUESTS: {
        Server.VLLM: "vllm:request_success_total",
        Server.TRITON: "nv_inference_request_success",
        Server.TGI: "tgi_request_success",
        Server.SGLANG: "sglang:num_requests_total",
    },
    OUTPUT_TOKENS: {
        Server.VLLM: "vllm:generation_tokens_total",
        Server.TRITON: None,
        Server.TGI: "tgi_request_generated_tokens_sum",
        Server.SGLANG: "sglang:generation_tokens_total",
    },
    PROMPT_TOKENS: {
        Server.VLLM: "vllm:prompt_tokens_total",
        Server.TRITON: None,
        Server.TGI: "tgi_request_input_length_sum",
        Server.SGLANG: "sglang:prompt_tokens_total",
    },
}

# the servers whose served-request rate the replica policy reads at every full read
SERVED_COUNTERS: dict[Server, str] = {
    server: counter
    for server, counter in SERVER_COUNTERS[REQUESTS].items()
    if server in (Server.VLLM, Server.TRITON) and counter is not None
}

# Whole GPUs: a pod's own energy and power. On a MIG instance both are the parent GPU's,
# repeated on every instance, so they are read per instance (`instance_queries`) and split.
ENERGY = "energy"  # mJ over the window
POWER = "power"  # W, mean over the window
ACTIVE = "active"  # a MIG instance's mean GR_ENGINE_ACTIVE (0-1) over the window
WHOLE_GPU = 'GPU_I_ID=""'
MIG_INSTANCE = 'GPU_I_ID!=""'

TIMESTAMP_LABEL = "gpusizer_sample_ts"
"""Marks the timestamp() half of a combined query (see `pod_query`)."""

POD_LABELS = "namespace, pod, exported_namespace, exported_pod"
# a MIG instance as dcgm-exporter labels it: its GPU, its place and profile, and its pod if any
INSTANCE_LABELS = f"UUID, GPU_I_ID, GPU_I_PROFILE, modelName, {POD_LABELS}"
_AGGREGATIONS = {"mean": "avg", "max": "max", "sum": "sum"}

# a reading moved when it changed by more than this share of the larger value (and of at least 1)
MOVE_FRACTION = 0.05


def move_floor(signal: str, scale: float) -> float:
    """The value a reading under it counts as when moves are told (`moved_pod_query`): one
    percent of a GPU (1 in DCGM's percent, 0.01 of GR_ENGINE_ACTIVE's share) or of the KV cache
    (vLLM's share), one waiting request. Taken as 1 / scale, a KV cache share was always under
    it, and its moves waited for the next full read."""
    return 0.01 if signal == KV_CACHE else 1 / scale


# A sample is stored when its scrape ends but stamped when it began: a read compares each pod's
# value now with its value this long before the previous read, so that a scrape which began
# before that read and landed after it still shows as a move. One that took longer waits for
# the next full read.
MOVE_MARGIN_SECONDS = 2.0

PEAK_QUANTILE = 0.99


def queue_signal(server: Server) -> str:
    return f"queue:{server.value}"


def request_rate_signal(server: Server) -> str:
    return f"requests:{server.value}"


# the signals replicas are sized on: a move in one of them is worth deciding on at once
REPLICA_SIGNALS = frozenset(
    {GPU_UTIL, MIG_UTIL, KV_CACHE, *(queue_signal(s) for s in QUEUE_SERIES)}
)
# the batched signals that size slices, not replicas: read less often than a sync period
SLOW_SIGNALS = frozenset({MEMORY})
# signals taken over a window rather than read off a sample: `timestamp()` of one is the
# instant Prometheus evaluated it at, so a timestamp twin would say nothing of its age and
# cost Prometheus a second range selection of every pod's counter (`pod_query`)
WINDOWED_SIGNALS = frozenset(request_rate_signal(s) for s in SERVED_COUNTERS)


def batched_signals(
    servers: Iterable[Server], optional: Set[str] = OPTIONAL_SIGNALS
) -> dict[str, tuple[str, float, str]]:
    """signal -> (selector, scale, how a pod's series combine) for one cycle's reads, of
    OPTIONAL_SIGNALS only those in `optional`."""
    wanted: dict[str, tuple[str, float, str]] = dict(BATCHED_SIGNALS)
    for server in sorted(set(servers)):
        if server in QUEUE_SERIES:
            wanted[queue_signal(server)] = (QUEUE_SERIES[server], 1.0, "sum")
        if server in SERVED_COUNTERS:
            rate = f"rate({SERVED_COUNTERS[server]}[{REQUEST_RATE_WINDOW}])"
            wanted[request_rate_signal(server)] = (rate, 1.0, "sum")
        if server == Server.VLLM and KV_CACHE in optional:
            wanted[KV_CACHE] = (KV_CACHE_SERIES, 1.0, "mean")
    return wanted


def pod_query(selector: str, combine: str, dated: bool = True) -> str:
    """One query that returns each pod's value (its GPUs combined) and, when `dated`, as a
    twin series, the time of its oldest sample.

    Prometheus combines a pod's GPUs, so a series carries the four pod labels rather than each
    GPU's dozen: decoding and matching every GPU's labels was the largest part of the
    operator's CPU (bench/README.md). A NaN on any GPU makes the pod's value NaN, so an
    invalid series still makes the whole pod unknown. `timestamp()` keeps the labels minus the
    name, so `or` would drop the twin as a duplicate; an extra label keeps both, and the number
    of queries stays one per signal. Prometheus evaluates the selector once for each half: the
    twin is half the query's work, spared where it cannot tell an age (WINDOWED_SIGNALS).
    """
    by = f"by ({POD_LABELS})"
    value = f"{_AGGREGATIONS[combine]} {by} ({selector})"
    if not dated:
        return value
    oldest = f"min {by} (timestamp({selector}))"
    return f'({value}) or label_replace({oldest}, "{TIMESTAMP_LABEL}", "1", "", "")'


def full_read_queries(
    servers: Iterable[Server], optional: Set[str] = OPTIONAL_SIGNALS
) -> dict[str, PodQuery]:
    """Every signal for every pod (of OPTIONAL_SIGNALS, those in `optional`): the queries of a
    full read."""
    return {
        name: PodQuery(pod_query(selector, combine, name not in WINDOWED_SIGNALS), scale, combine)
        for name, (selector, scale, combine) in batched_signals(servers, optional).items()
    }


def moves_query(selector: str, combine: str, floor: float, since_seconds: float) -> str:
    """Which pods' values (their series combined) moved by more than MOVE_FRACTION since
    `since_seconds` ago: |1 - now / then| of each such pod, not its value (`moved_values_query`
    reads that). Values under `floor` (`move_floor`) count as `floor`, so a pod idling between
    0 and 1 % does not move.

    Prometheus does the filtering, so a read between two full snapshots costs the operator the
    pods that moved, not every pod. It selects every pod's series twice for it, now and then;
    returning the values as well (`now and on (...) (moved)`) selected them a third time, and
    that was a third of a moved read's work for Prometheus (bench/README.md)."""
    by = f"by ({POD_LABELS})"
    aggregate = _AGGREGATIONS[combine]
    now = f"{aggregate} {by} ({selector})"
    then = f"{aggregate} {by} ({selector} offset {round(since_seconds * 1000)}ms)"
    ratio = f"clamp_min({now}, {floor:g}) / clamp_min({then}, {floor:g})"
    return f"abs(1 - {ratio}) > {MOVE_FRACTION}"


MAX_NAMED_PODS = 100
"""A moved read names the pods whose values it fetches when this many moved or fewer: more
(a fleet-wide shift) and it reads every pod's value, as a full read's query does, since a
regular expression of thousands of names makes a URL that proxies in front of Prometheus
refuse."""


# what RE2 reads as other than itself outside a character class
_REGEX_SPECIAL = re.compile(r"[\\.+*?()|\[\]{}^$]")


def moved_values_query(selector: str, combine: str, pods: Collection[str] | None) -> str:
    """The value of each pod named in `pods` (None: of every pod), its series combined. A pod
    is named by its `pod` label or, behind a ServiceMonitor without honorLabels, by its
    `exported_pod` (`parse.pod_key`), so the names are matched on either. No timestamp twin: a
    pod whose value moved has a sample from the last `since_seconds` (`moves_query`), which
    bounds its age."""
    if pods is None:
        return pod_query(selector, combine, dated=False)
    alternatives = "|".join(_REGEX_SPECIAL.sub(r"\\\g<0>", pod) for pod in sorted(pods))
    names = promql_string(alternatives)
    either = " or ".join(
        _with_matcher(selector, f"{label}=~{names}") for label in ("pod", "exported_pod")
    )
    return pod_query(either, combine, dated=False)


def _with_matcher(selector: str, matcher: str) -> str:
    """A plain selector (`name` or `name{...}`, as every batched signal's) with `matcher`
    added."""
    if selector.endswith("}"):
        return f"{selector[:-1]}, {matcher}}}"
    return f"{selector}{{{matcher}}}"


def promql_string(value: str) -> str:
    """`value` as a PromQL string literal: JSON's string escapes are a subset of PromQL's
    (Go's) double-quoted ones."""
    return json.dumps(value, ensure_ascii=False)


def custom_queue_query(promql: str) -> PodQuery:
    """A user's queueQuery (already confined to its namespace), summed per pod."""
    return PodQuery(pod_query(promql, "sum"), 1.0, "sum")


def history_queries(window_seconds: int) -> dict[str, PodQuery]:
    """Measured use over a window, for right-sizing: range functions over every pod at once."""
    w = f"[{window_seconds}s]"
    by = f"by ({POD_LABELS})"
    queries = {
        "peak_memory": PodQuery(
            f"max {by} (quantile_over_time({PEAK_QUANTILE}, DCGM_FI_DEV_FB_USED{{{HELD}}}{w}))",
            1.0,
            "max",
        ),
        "utilization": PodQuery(
            f"avg {by} (avg_over_time(DCGM_FI_DEV_GPU_UTIL{{{HELD}}}{w}))", 1.0, "mean"
        ),
        "mig_utilization": PodQuery(
            f'avg {by} (avg_over_time(DCGM_FI_PROF_GR_ENGINE_ACTIVE{{GPU_I_ID!="", {HELD}}}{w}))',
            100.0,
            "mean",
        ),
    }
    for signal, counters in SERVER_COUNTERS.items():
        increases = " or ".join(f"increase({c}{w})" for c in counters.values() if c is not None)
        queries[signal] = PodQuery(f"sum {by} ({increases})", 1.0, "sum")
    queries[ENERGY] = PodQuery(
        f"sum {by} (increase(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{WHOLE_GPU}, {HELD}}}{w}))",
        1.0,
        "sum",
    )
    queries[POWER] = PodQuery(
        f"sum {by} (avg_over_time(DCGM_FI_DEV_POWER_USAGE{{{WHOLE_GPU}, {HELD}}}{w}))", 1.0, "sum"
    )
    return queries


def instance_queries(window_seconds: int) -> dict[str, str]:
    """Each MIG instance's share of what its parent GPU did over a window: the GPU's energy and
    mean power (the same on every instance of a GPU), and the instance's own activity; every
    instance, held or not, so that its GPU's energy can be split among all of them."""
    w = f"[{window_seconds}s]"
    by = f"by ({INSTANCE_LABELS})"
    return {
        ENERGY: f"sum {by} (increase(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{MIG_INSTANCE}}}{w}))",
        POWER: f"sum {by} (avg_over_time(DCGM_FI_DEV_POWER_USAGE{{{MIG_INSTANCE}}}{w}))",
        ACTIVE: f"sum {by} (avg_over_time(DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{MIG_INSTANCE}}}{w}))",
    }


def draw_queries(window_seconds: int) -> tuple[dict[str, PodQuery], dict[str, str]]:
    """The pods' GPU draw over a short window, for the savings ledger's energy: the power
    queries of `history_queries` and `instance_queries` alone, and the instances' activity
    that splits a MIG GPU's draw. The window's other queries are most of what its read costs
    Prometheus (bench/README.md, "Issue 29: what an hour's history costs Prometheus")."""
    pods = history_queries(window_seconds)
    instances = instance_queries(window_seconds)
    return {POWER: pods[POWER]}, {name: instances[name] for name in (POWER, ACTIVE)}


# The operator's own series the savings ledger is read from (`gpusizer.ledger`): counters of
# what each workload's pods held (their names without the `_total` a scrape shows), and gauges
# of what they hold now.
HELD_GPU_SECONDS = "gpusizer_held_gpu_seconds"
HELD_COST = "gpusizer_held_cost"
HELD_IDLE_JOULES = "gpusizer_held_idle_joules"
ENERGY_JOULES = "gpusizer_energy_joules"
TRACKED_SECONDS = "gpusizer_tracked_seconds"
HELD_GPUS = "gpusizer_held_gpus"
HELD_COST_PER_HOUR = "gpusizer_held_cost_per_hour"
HELD_IDLE_WATTS = "gpusizer_held_idle_power_watts"


def ledger_queries(window_seconds: int) -> dict[str, str]:
    """Each workload's ledger over a window, from the operator's own series: what it used, and
    what holding its peak for as long as it was followed would have (`ledger.ledger_rows`).
    Summed over the operator's replicas and restarts, each of which is a series of its own."""
    w = f"[{window_seconds}s]"
    by = "by (namespace, name)"

    def used(counter: str) -> str:
        return f"sum {by} (increase({counter}_total{w}))"

    def peak(gauge: str) -> str:
        return f"max {by} (max_over_time({gauge}{w}))"

    followed = used(TRACKED_SECONDS)
    return {
        "gpu_seconds_used": used(HELD_GPU_SECONDS),
        "gpu_seconds_static": f"{peak(HELD_GPUS)} * {followed}",
        "cost_used": used(HELD_COST),
        "cost_static": f"{peak(HELD_COST_PER_HOUR)} * {followed} / 3600",
        "joules_used": used(ENERGY_JOULES),
        "idle_joules_extra": f"{peak(HELD_IDLE_WATTS)} * {followed} - {used(HELD_IDLE_JOULES)}",
    }
