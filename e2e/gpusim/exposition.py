"""DCGM-exporter and vLLM series in their real shape, with labels in dcgm-exporter's order.

prometheus_client's own text renderer sorts labels, so `render` writes the text format itself;
scrapers do not care, but tests and humans comparing with a real exporter do.
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from e2e.gpusim.model import WorkloadState
from e2e.gpusim.telemetry import DeviceReading

DRIVER_VERSION = "570.133.20"


@dataclass(frozen=True)
class ExporterOptions:
    hostname_label: str = "Hostname"
    """`Hostname` before dcgm-exporter 4.8.3, `hostname` from it on."""
    exported_labels: bool = False
    """Pod labels as `exported_namespace`/`exported_pod` (ServiceMonitor without honorLabels)."""
    driver_version: str = DRIVER_VERSION


@dataclass(frozen=True)
class PodServerReading:
    """One ready inference server replica."""

    namespace: str
    pod: str
    node: str
    model_name: str
    waiting: float
    running: float
    kv_cache_usage: float
    success_total: float
    generation_tokens_total: float
    prompt_tokens_total: float


@dataclass(frozen=True)
class View:
    """Everything one scrape shows, computed on the last tick."""

    devices: Sequence[DeviceReading]
    energy_mj: dict[tuple[str, int], float]
    servers: Sequence[PodServerReading]
    workloads: dict[tuple[str, str], WorkloadState]

    @functools.cached_property
    def nodes(self) -> dict[str, tuple[list[DeviceReading], list[PodServerReading]]]:
        """Each GPU node's devices and the inference servers on it, in the view's order."""
        grouped: dict[str, tuple[list[DeviceReading], list[PodServerReading]]] = {}
        for reading in self.devices:
            grouped.setdefault(reading.device.node, ([], []))[0].append(reading)
        for server in self.servers:
            if server.node in grouped:
                grouped[server.node][1].append(server)
        return grouped

    def on_node(self, node: str) -> tuple[list[DeviceReading], list[PodServerReading]]:
        return self.nodes.get(node, ([], []))


def device_labels(reading: DeviceReading, options: ExporterOptions) -> dict[str, str]:
    device = reading.device
    labels = {
        "gpu": str(device.gpu),
        "UUID": device.uuid,
        "pci_bus_id": device.pci_bus_id,
        "device": f"nvidia{device.gpu}",
        "modelName": device.product.model_name,
    }
    if device.profile is not None:
        labels["GPU_I_PROFILE"] = device.profile
        labels["GPU_I_ID"] = str(device.instance_id)
    labels[options.hostname_label] = device.node
    labels["DCGM_FI_DRIVER_VERSION"] = options.driver_version
    if reading.pod is not None:
        prefix = "exported_" if options.exported_labels else ""
        labels["container"] = reading.pod.container
        labels[prefix + "namespace"] = reading.pod.namespace
        labels[prefix + "pod"] = reading.pod.name
    return labels


_Value = Callable[[DeviceReading, View], float | None]
# (name, type, help, value; None means "not served on this device")
_DCGM: list[tuple[str, str, str, _Value]] = [
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", lambda r, v: r.sm_clock_mhz),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", lambda r, v: r.temp_c),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", lambda r, v: r.power_w),
    (
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "counter",
        "Total energy consumption since boot (in mJ).",
        lambda r, v: v.energy_mj.get((r.device.node, r.device.gpu), 0.0),
    ),
    (
        "DCGM_FI_DEV_GPU_UTIL",
        "gauge",
        "GPU utilization (in %).",
        lambda r, v: round(100 * r.busy) if r.device.profile is None else None,
    ),
    (
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        "gauge",
        "Memory utilization (in %).",
        lambda r, v: round(100 * r.dram_active) if r.device.profile is None else None,
    ),
    (
        "DCGM_FI_DEV_FB_FREE",
        "gauge",
        "Frame buffer memory free (in MiB).",
        lambda r, v: r.fb_free_mib,
    ),
    (
        "DCGM_FI_DEV_FB_USED",
        "gauge",
        "Frame buffer memory used (in MiB).",
        lambda r, v: r.fb_used_mib,
    ),
    (
        "DCGM_FI_DEV_FB_RESERVED",
        "gauge",
        "Frame buffer memory reserved (in MiB).",
        lambda r, v: r.fb_reserved_mib,
    ),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.", lambda r, v: 0),
    (
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "gauge",
        "Ratio of time the graphics engine is active.",
        lambda r, v: r.busy,
    ),
    (
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "gauge",
        "Ratio of cycles the tensor (HMMA) pipe is active.",
        lambda r, v: r.tensor_active,
    ),
    (
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "gauge",
        "Ratio of cycles the device memory interface is active sending or receiving data.",
        lambda r, v: r.dram_active,
    ),
]


_VLLM: list[tuple[str, str, str, Callable[[PodServerReading], float]]] = [
    (
        "vllm:num_requests_waiting",
        "gauge",
        "Requests waiting to be processed.",
        lambda s: s.waiting,
    ),
    ("vllm:num_requests_running", "gauge", "Requests running on the GPU.", lambda s: s.running),
    (
        "vllm:kv_cache_usage_perc",
        "gauge",
        "KV-cache usage. 1 means 100 percent usage.",
        lambda s: s.kv_cache_usage,
    ),
    (
        "vllm:request_success",
        "counter",
        "Count of successfully processed requests.",
        lambda s: s.success_total,
    ),
    (
        "vllm:prompt_tokens",
        "counter",
        "Number of prefill tokens processed.",
        lambda s: s.prompt_tokens_total,
    ),
    (
        "vllm:generation_tokens",
        "counter",
        "Number of generation tokens processed.",
        lambda s: s.generation_tokens_total,
    ),
]


def render(view: View, options: ExporterOptions) -> bytes:
    """Prometheus text format 0.0.4 of one view, labels in the exporters' order.

    Lines are built straight from the readings, each device's label text once for its 13
    series: through prometheus_client's Metric and Sample objects a scrape of 5,000 GPUs took
    about two seconds.
    """
    lines = _dcgm_lines(view.devices, view, options)
    lines += _vllm_lines(view.servers)
    lines += _gateway_lines(view.workloads)
    return _text(lines)


def render_node(view: View, node: str, options: ExporterOptions) -> bytes:
    """What the exporters of one node serve: its GPUs' DCGM series and the inference servers
    of the pods it runs."""
    devices, servers = view.on_node(node)
    return _text(_dcgm_lines(devices, view, options) + _vllm_lines(servers))


def render_gateway(view: View) -> bytes:
    """What the gateway in front of the workloads serves: the requests it holds."""
    return _text(_gateway_lines(view.workloads))


def _text(lines: list[str]) -> bytes:
    return ("\n".join(lines) + "\n").encode()


def _dcgm_lines(
    readings: Sequence[DeviceReading], view: View, options: ExporterOptions
) -> list[str]:
    lines: list[str] = []
    devices = [(reading, _label_text(device_labels(reading, options))) for reading in readings]
    for name, kind, doc, value in _DCGM:
        lines.append(f"# HELP {name} {doc}")
        lines.append(f"# TYPE {name} {kind}")
        for reading, labels in devices:
            sample = value(reading, view)
            if sample is not None:
                lines.append(f"{name}{{{labels}}} {_number(sample)}")
    return lines


def _vllm_lines(readings: Sequence[PodServerReading]) -> list[str]:
    lines: list[str] = []
    servers = [
        (
            server,
            _label_text(
                {"namespace": server.namespace, "pod": server.pod, "model_name": server.model_name}
            ),
        )
        for server in readings
    ]
    for name, kind, doc, get in _VLLM:
        sample_name = name + "_total" if kind == "counter" else name
        # A counter's HELP and TYPE name its samples' `_total` name, or its own without samples.
        header = sample_name if servers else name
        lines.append(f"# HELP {header} {doc}")
        lines.append(f"# TYPE {header} {kind}")
        for server, labels in servers:
            lines.append(f"{sample_name}{{{labels}}} {_number(get(server))}")
    return lines


def _gateway_lines(workloads: dict[tuple[str, str], WorkloadState]) -> list[str]:
    lines = [
        "# HELP gateway_pending_requests Requests held while the workload has no ready replica.",
        "# TYPE gateway_pending_requests gauge",
    ]
    for (namespace, workload), state in sorted(workloads.items()):
        labels = _label_text({"namespace": namespace, "service": workload})
        lines.append(
            f"gateway_pending_requests{{{labels}}} {_number(round(state.gateway_pending))}"
        )
    return lines


class CachedExposition:
    """The /metrics body of the latest view, rendered once per view (values change on ticks).

    The tick thread renders it right after each step, so a scrape sends bytes that are ready.
    A scrape that comes while a render is running gets the previous tick's body at once rather
    than wait for it (a render of 5,000 GPUs takes a few tenths of a second).
    """

    def __init__(self, view: Callable[[], View], options: ExporterOptions) -> None:
        self._view = view
        self._options = options
        self._rendering = threading.Lock()
        first = view()
        self._latest = (first, render(first, options))

    def body(self) -> bytes:
        rendered, body = self._latest
        if not self._rendering.acquire(blocking=False):
            return body
        try:
            view = self._view()
            rendered, body = self._latest  # another scrape may have rendered it meanwhile
            if rendered is not view:
                body = render(view, self._options)
                self._latest = (view, body)
            return body
        finally:
            self._rendering.release()


def _label_text(labels: dict[str, str]) -> str:
    return ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())


def _escape(value: str) -> str:
    if "\\" not in value and "\n" not in value and '"' not in value:
        return value
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _number(value: float) -> str:
    """Integers as dcgm-exporter prints them (`45`, not `45.0`)."""
    if type(value) is int and abs(value) < 2**53:
        return str(value)  # what the float path prints for it, without the conversions
    value = float(value)
    if value.is_integer() and abs(value) < 2**53:
        return str(int(value))
    return (
        repr(value)
        if math.isfinite(value)
        else {math.inf: "+Inf", -math.inf: "-Inf"}.get(value, "NaN")
    )


class PartExpositions:
    """The bodies of `/metrics/nodes/<node>` and `/metrics/gateway`, each rendered at its first
    scrape after a tick. Prometheus scrapes each node's exporter at a moment of its own, as it
    does a DaemonSet's pods, and rendering one node's 64 GPUs takes milliseconds: a tick need
    not render all 5,000 GPUs (0.25 s, bench/gpusim_exposition.py) for scrapes to come."""

    def __init__(self, view: Callable[[], View], options: ExporterOptions) -> None:
        self._view = view
        self._options = options
        self._lock = threading.Lock()
        self._rendered_view: View | None = None
        self._bodies: dict[str | None, bytes] = {}  # by node; None: the gateway

    def node(self, name: str) -> bytes | None:
        """None when the latest view has no GPU on `name`."""
        view = self._view()
        if name not in view.nodes:
            return None
        return self._body(view, name, lambda: render_node(view, name, self._options))

    def gateway(self) -> bytes:
        view = self._view()
        return self._body(view, None, lambda: render_gateway(view))

    def _body(self, view: View, part: str | None, render_part: Callable[[], bytes]) -> bytes:
        with self._lock:
            if self._rendered_view is not view:
                self._rendered_view, self._bodies = view, {}
            body = self._bodies.get(part)
            if body is None:
                body = self._bodies[part] = render_part()
            return body
