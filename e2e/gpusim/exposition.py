"""DCGM-exporter and vLLM series in their real shape, with labels in dcgm-exporter's order.

prometheus_client's own text renderer sorts labels, so `render` writes the text format itself
from the collector's metric families; scrapers do not care, but tests and humans comparing
with a real exporter do.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

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
    model_name: str
    waiting: float
    running: float
    kv_cache_usage: float
    success_total: float


@dataclass(frozen=True)
class View:
    """Everything one scrape shows, computed on the last tick."""

    devices: Sequence[DeviceReading]
    energy_mj: dict[tuple[str, int], float]
    servers: Sequence[PodServerReading]
    workloads: dict[tuple[str, str], WorkloadState]


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


def metrics(view: View, options: ExporterOptions) -> list[Metric]:
    families: list[Metric] = []
    for name, kind, doc, value in _DCGM:
        family = Metric(name, doc, kind)
        for reading in view.devices:
            sample = value(reading, view)
            if sample is not None:
                labels = device_labels(reading, options)
                family.samples.append(Sample(name, labels, float(sample)))
        families.append(family)
    vllm: list[tuple[str, str, str, Callable[[PodServerReading], float]]] = [
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
    ]
    for name, kind, doc, get in vllm:
        family = Metric(name, doc, kind)
        sample_name = name + "_total" if kind == "counter" else name
        for server in view.servers:
            labels = {
                "namespace": server.namespace,
                "pod": server.pod,
                "model_name": server.model_name,
            }
            family.samples.append(Sample(sample_name, labels, float(get(server))))
        families.append(family)
    gateway = Metric(
        "gateway_pending_requests",
        "Requests held while the workload has no ready replica.",
        "gauge",
    )
    for (namespace, workload), state in sorted(view.workloads.items()):
        labels = {"namespace": namespace, "service": workload}
        gateway.samples.append(Sample(gateway.name, labels, float(round(state.gateway_pending))))
    families.append(gateway)
    return families


class ViewCollector(Collector):
    """A custom collector over the simulator's latest view."""

    def __init__(self, view: Callable[[], View], options: ExporterOptions) -> None:
        self._view = view
        self._options = options

    def collect(self) -> Iterable[Metric]:
        return metrics(self._view(), self._options)


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _number(value: float) -> str:
    """Integers as dcgm-exporter prints them (`45`, not `45.0`)."""
    if value.is_integer() and abs(value) < 2**53:
        return str(int(value))
    return (
        repr(value)
        if math.isfinite(value)
        else {math.inf: "+Inf", -math.inf: "-Inf"}.get(value, "NaN")
    )


def render(families: Iterable[Metric]) -> bytes:
    """Prometheus text format 0.0.4, keeping each sample's label order."""
    lines: list[str] = []
    for family in families:
        total = family.type == "counter" and any(s.name.endswith("_total") for s in family.samples)
        name = family.name + "_total" if total else family.name
        lines.append(f"# HELP {name} {family.documentation}")
        lines.append(f"# TYPE {name} {family.type}")
        for sample in family.samples:
            labels = ",".join(f'{k}="{_escape(v)}"' for k, v in sample.labels.items())
            lines.append(f"{sample.name}{{{labels}}} {_number(sample.value)}")
    return ("\n".join(lines) + "\n").encode()
