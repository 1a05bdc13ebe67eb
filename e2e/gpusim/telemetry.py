"""What each emulated device reads, from the load model's replica states (pure)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from e2e.gpusim.cluster import PodInfo
from e2e.gpusim.devices import Device, DeviceKey
from e2e.gpusim.model import ReplicaState

SM_CLOCK_IDLE_MHZ = 345
SM_CLOCK_BUSY_MHZ = 1980
TEMP_IDLE_C = 32
TEMP_RISE_C = 40


@dataclass(frozen=True)
class DeviceReading:
    device: Device
    pod: PodInfo | None
    busy: float
    """0-1, relative to the device itself (a MIG instance's own compute)."""
    fb_used_mib: int
    fb_free_mib: int
    fb_reserved_mib: int
    power_w: float
    """The parent GPU's power, repeated on each of its instances."""
    own_power_w: float
    """This device's part of its GPU's power (ground truth, not served): the GPU's idle power
    split by compute share among its instances, plus the power of its own work."""
    sm_clock_mhz: int
    temp_c: int

    @property
    def tensor_active(self) -> float:
        return 0.4 * self.busy

    @property
    def dram_active(self) -> float:
        # Decode streams the weights for every token: DRAM is the busiest unit.
        return 0.8 * self.busy


def device_readings(
    devices: Sequence[Device],
    assignment: Mapping[str, Sequence[Device]],
    pods: Mapping[str, PodInfo],
    replicas: Mapping[str, ReplicaState],
    previous: Mapping[DeviceKey, DeviceReading] | None = None,
) -> dict[DeviceKey, DeviceReading]:
    """Each device's reading, by key. A reading that would say what `previous` says of the
    same device and pod is that object: a tick over thousands of idle GPUs makes no new ones."""
    last_readings = previous or {}
    owner = {d.key: uid for uid, held in assignment.items() for d in held}
    partial: list[tuple[DeviceKey, Device, PodInfo | None, float, int]] = []
    gpu_busy: dict[tuple[str, int], float] = {}
    gpu_compute: dict[tuple[str, int], float] = {}
    for device in devices:
        key = device.key
        uid = owner.get(key)
        pod = pods.get(uid) if uid else None
        state = replicas.get(uid) if uid else None
        busy = state.utilisation if state and state.ready else 0.0
        used = 0
        if pod is not None and state is not None and pod.running_since is not None:
            used = min(state.memory_need_mib // max(1, pod.count), _total(device))
        partial.append((key, device, pod, busy, used))
        compute = _compute_share(device)
        gpu_key = (device.node, device.gpu)
        gpu_busy[gpu_key] = gpu_busy.get(gpu_key, 0.0) + busy * compute
        gpu_compute[gpu_key] = gpu_compute.get(gpu_key, 0.0) + compute
    readings: dict[DeviceKey, DeviceReading] = {}
    for key, device, pod, busy, used in partial:
        gpu_key = (device.node, device.gpu)
        load = min(1.0, gpu_busy[gpu_key])
        board, idle = device.product.board_power_watts, device.product.idle_watts
        compute = _compute_share(device)
        power = idle + (board - idle) * load
        own_power = idle * compute / gpu_compute[gpu_key] + (board - idle) * busy * compute
        sm_clock = SM_CLOCK_BUSY_MHZ if load > 0 else SM_CLOCK_IDLE_MHZ
        temp = round(TEMP_IDLE_C + TEMP_RISE_C * load)
        last = last_readings.get(key)
        if (
            last is not None
            and last.device is device
            and last.pod is pod
            and last.busy == busy
            and last.fb_used_mib == used
            and last.power_w == power
            and last.own_power_w == own_power
            and last.sm_clock_mhz == sm_clock
            and last.temp_c == temp
        ):
            readings[key] = last
            continue
        total = _total(device)
        reserved = round(device.product.memory_mib * 0.005) if device.profile is None else 0
        readings[key] = DeviceReading(
            device=device,
            pod=pod,
            busy=busy,
            fb_used_mib=used,
            fb_free_mib=max(0, total - reserved - used),
            fb_reserved_mib=reserved,
            power_w=power,
            own_power_w=own_power,
            sm_clock_mhz=sm_clock,
            temp_c=temp,
        )
    return readings


def _compute_share(device: Device) -> float:
    """A MIG instance's share of its GPU's compute slices; 1 for a whole GPU."""
    mig = device.product.mig
    if device.profile is None or mig is None:
        return 1.0
    return mig.profiles[device.profile].compute_slices / mig.compute_slices


def _total(device: Device) -> int:
    mig = device.product.mig
    if device.profile is None or mig is None:
        return device.product.memory_mib
    return mig.profiles[device.profile].memory_mib
