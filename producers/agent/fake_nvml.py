"""A fake `pynvml` module (a real class, same function names and error codes) for `--simulate` and tests.

It answers the NVML calls the agent makes with plausible, slowly varying values for an 8-GPU
node, and can be told to misbehave: fields that are not supported on some GPUs, a GPU that
fails on every call, a missing driver at init, XID / ECC events waiting in the event set.

`FakeNvml.h200()` answers the way the real single H200 did: NVLink fields NotSupported, clock
event reasons 0x1 (GPU idle) with no process and 0x4 (software power cap) under load, an empty
pid list at idle. `latency_s` makes chosen functions take time (e.g. the 20 ms window of
`nvmlDeviceGetPcieThroughput`), so benchmarks can show what a blocking call costs.

GPM (GPU Performance Monitoring, Hopper and newer: the device name says H100, H200, GH200, H20,
B100, B200 or GB200, unless `FakeDevice.gpm` says otherwise) works as NVML's does: a sample
buffer (`nvmlGpmSampleAlloc`) takes a reading of cumulative counters (`nvmlGpmSampleGet`), and
`nvmlGpmMetricsGet` divides the counters' growth between two readings by the time between them,
so a metric is the interval's average. A device's `workload` sets the rates: `compute` (dense
training: most SMs active, tensor pipes busy, heavy DRAM traffic), `collective` (a collective
spinning while it waits for a peer: the kernel runs, so utilisation is ~100 %, but only the
NCCL channels' few SMs are active, no tensor work, little DRAM traffic), `hung` (a kernel that
never returns, deadlocked or spin-waiting: its blocks stay resident on every SM, so SM activity is
high, but it issues no tensor work and hardly touches DRAM) or `idle`. Older GPUs answer
NotSupported.
"""

from __future__ import annotations

import math
import queue
import random
import sys
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["FakeDevice", "FakeNvml"]

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999


class NVMLError(Exception):
    """Same shape as pynvml's: the NVML return code in `.value`."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return {
            NVML_ERROR_NOT_SUPPORTED: "Not Supported",
            NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
            NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
            NVML_ERROR_TIMEOUT: "Timeout",
            NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
            NVML_ERROR_GPU_IS_LOST: "GPU is lost",
        }.get(self.value, f"NVML error {self.value}")


class NVMLError_NotSupported(NVMLError):
    """Field not supported on this device."""

    def __init__(self) -> None:
        super().__init__(NVML_ERROR_NOT_SUPPORTED)


class NVMLError_Timeout(NVMLError):
    """Nothing arrived in the event set before the timeout."""

    def __init__(self) -> None:
        super().__init__(NVML_ERROR_TIMEOUT)


@dataclass
class FakeDevice:
    """One simulated GPU: its identity, load profile and the fields it does not support."""

    index: int
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    unsupported: set[str] = field(default_factory=set)
    broken: bool = False  # every call raises GPU_IS_LOST
    pids: list[int] = field(default_factory=list)
    util: float = 95.0
    memory_total: int = 80 * 1024**3
    # Clock event reasons: None = 0 always; "h200" = 0x1 (idle) without pids, 0x4 (SW power cap) with
    clock_reasons: str | None = None
    ecc_corrected: int = 0
    ecc_uncorrected: int = 0
    energy_mj: int = 0
    # What the kernels do: "compute", "collective" (spinning in a collective), "hung" (a kernel that
    # never returns) or "idle" (GPM rates).
    workload: str = "compute"
    gpm: bool | None = None  # GPM support; None: from the name (Hopper and newer)


# GPM metric ids (nvml.h) the fake answers.
_GPM_SM_UTIL, _GPM_SM_OCCUPANCY, _GPM_ANY_TENSOR, _GPM_DRAM_BW = 2, 3, 5, 10
_GPM_GENERATIONS = ("H100", "H200", "H20", "GH200", "B100", "B200", "GB200")

# Per workload, each GPM metric as a fraction of the kernel activity (`util`): measured shapes of
# dense bf16 training (SMs nearly all busy, tensor pipes about 60 %, DRAM about half) and of an
# NCCL all-reduce blocked on a peer (its ~16-24 channel blocks keep a few SMs spinning: ~15 % SM
# activity, ~3 % occupancy, no tensor work, a trickle of DRAM polling). A hung kernel's shape is
# reasoned, not measured (check it on a real GPU): a grid waiting forever on a flag or a peer keeps a
# block resident on every SM (~95 % SM activity at low occupancy), no tensor work, its polling
# served mostly from L2.
_GPM_SHAPES: dict[str, dict[int, float]] = {
    "compute": {_GPM_SM_UTIL: 0.93, _GPM_SM_OCCUPANCY: 0.42, _GPM_ANY_TENSOR: 0.62, _GPM_DRAM_BW: 0.48},
    "collective": {_GPM_SM_UTIL: 0.15, _GPM_SM_OCCUPANCY: 0.03, _GPM_ANY_TENSOR: 0.0, _GPM_DRAM_BW: 0.02},
    "hung": {_GPM_SM_UTIL: 0.95, _GPM_SM_OCCUPANCY: 0.25, _GPM_ANY_TENSOR: 0.0, _GPM_DRAM_BW: 0.03},
    "idle": {_GPM_SM_UTIL: 0.0, _GPM_SM_OCCUPANCY: 0.0, _GPM_ANY_TENSOR: 0.0, _GPM_DRAM_BW: 0.0},
}


def gpm_supported(device: FakeDevice) -> bool:
    """Whether a fake device answers GPM: its `gpm` flag, else Hopper or newer by name."""
    if device.gpm is not None:
        return device.gpm
    return any(gen in device.name for gen in _GPM_GENERATIONS)


class _GpmSample:
    """A GPM sample buffer: the device it was last read from, when, and its counters then."""

    def __init__(self) -> None:
        self.device: int | None = None
        self.t = 0.0
        self.counters: dict[int, float] = {}
        self.freed = False


@dataclass
class _GpmMetricInfo:
    shortName: bytes = b""
    longName: bytes = b""
    unit: bytes = b""


@dataclass
class _GpmMetric:
    metricId: int = 0
    nvmlReturn: int = 0
    value: float = 0.0
    metricInfo: _GpmMetricInfo = field(default_factory=_GpmMetricInfo)


class _GpmSupport:
    def __init__(self, supported: bool) -> None:
        self.version = 1
        self.isSupportedDevice = int(supported)


class _GpmMetricsGet:
    """pynvml's request/answer structure of `nvmlGpmMetricsGet`: two samples in, metrics out."""

    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1: Any = None
        self.sample2: Any = None
        self.metrics = [_GpmMetric() for _ in range(210)]


@dataclass
class _Memory:
    total: int
    used: int
    free: int


@dataclass
class _Util:
    gpu: int
    memory: int


@dataclass
class _Process:
    pid: int
    usedGpuMemory: int


@dataclass
class _FieldValue:
    fieldId: int
    scopeId: int
    nvmlReturn: int
    valueType: int
    value: Any


@dataclass
class _Value:
    dVal: float = 0.0
    uiVal: int = 0
    ulVal: int = 0
    ullVal: int = 0
    sllVal: int = 0
    siVal: int = 0
    usVal: int = 0


@dataclass
class _EventData:
    device: Any
    eventType: int
    eventData: int
    gpuInstanceId: int = 0
    computeInstanceId: int = 0


class FakeNvml:
    """Stands in for the `pynvml` module: `FakeNvml(gpus=8).nvmlDeviceGetPowerUsage(handle)` etc."""

    NVMLError = NVMLError
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_Timeout = NVMLError_Timeout
    NVML_ERROR_NOT_SUPPORTED = NVML_ERROR_NOT_SUPPORTED
    NVML_ERROR_NO_PERMISSION = NVML_ERROR_NO_PERMISSION
    NVML_ERROR_DRIVER_NOT_LOADED = NVML_ERROR_DRIVER_NOT_LOADED
    NVML_ERROR_LIBRARY_NOT_FOUND = NVML_ERROR_LIBRARY_NOT_FOUND
    NVML_ERROR_FUNCTION_NOT_FOUND = NVML_ERROR_FUNCTION_NOT_FOUND
    NVML_ERROR_TIMEOUT = NVML_ERROR_TIMEOUT
    NVML_ERROR_GPU_IS_LOST = NVML_ERROR_GPU_IS_LOST
    NVML_SUCCESS = NVML_SUCCESS
    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    NVML_PCIE_UTIL_TX_BYTES = 0
    NVML_PCIE_UTIL_RX_BYTES = 1
    NVML_FI_DEV_MEMORY_TEMP = 82
    NVML_FI_DEV_PCIE_COUNT_TX_BYTES = 197
    NVML_FI_DEV_PCIE_COUNT_RX_BYTES = 198
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX = 138
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = 139
    NVML_NVLINK_MAX_LINKS = 18
    NVML_VALUE_TYPE_DOUBLE = 0
    NVML_VALUE_TYPE_UNSIGNED_INT = 1
    NVML_VALUE_TYPE_UNSIGNED_LONG = 2
    NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3
    NVML_VALUE_TYPE_SIGNED_LONG_LONG = 4
    NVML_VALUE_TYPE_SIGNED_INT = 5
    NVML_ERROR_INVALID_ARGUMENT = NVML_ERROR_INVALID_ARGUMENT
    NVML_GPM_METRICS_GET_VERSION = 1
    NVML_GPM_METRIC_SM_UTIL = _GPM_SM_UTIL
    NVML_GPM_METRIC_SM_OCCUPANCY = _GPM_SM_OCCUPANCY
    NVML_GPM_METRIC_ANY_TENSOR_UTIL = _GPM_ANY_TENSOR
    NVML_GPM_METRIC_DRAM_BW_UTIL = _GPM_DRAM_BW
    c_nvmlGpmMetricsGet_t = _GpmMetricsGet  # pynvml's structure name
    nvmlEventTypeSingleBitEccError = 0x1
    nvmlEventTypeDoubleBitEccError = 0x2
    nvmlEventTypeXidCriticalError = 0x8

    def __init__(
        self,
        gpus: int = 8,
        *,
        init_error: int | None = None,
        seed: int = 0,
        devices: list[FakeDevice] | None = None,
        clock: Any = time.monotonic,
        latency_s: dict[str, float] | None = None,
    ) -> None:
        self._init_error = init_error
        self.latency_s = dict(latency_s or {})
        self.call_counts: dict[str, int] = {}
        self._rng = random.Random(seed)
        self._clock = clock
        self._t0 = clock()
        self.devices = devices or [
            FakeDevice(index=i, uuid=f"GPU-{seed:04x}{i:04x}-fake-0000-0000-{i:012d}") for i in range(gpus)
        ]
        self.initialized = False
        self.calls = 0
        self._events: queue.Queue[_EventData] = queue.Queue()
        self._registered: dict[int, int] = {}
        self._nvlink_kib = [0] * len(self.devices)
        self._pcie_bytes = [0] * len(self.devices)
        self._pcie_replays = [0] * len(self.devices)
        # GPM: per device, cumulative metric counters (percent x seconds) and when they were advanced.
        self._gpm_counters: list[dict[int, float]] = [
            dict.fromkeys(_GPM_SHAPES["idle"], 0.0) for _ in self.devices
        ]
        self._gpm_at: list[float | None] = [None] * len(self.devices)

    @classmethod
    def h200(cls, *, busy: bool = False, **kw: Any) -> FakeNvml:
        """One H200 as the real one answered: no NVLink, reasons 0x1 idle / 0x4 busy, no pids at idle."""
        device = FakeDevice(
            index=0,
            uuid="GPU-3f1e9c2a-6b7d-4e0f-9a51-2c8d7e6f1a20",
            name="NVIDIA H200",
            unsupported={"nvlink"},
            pids=[4242] if busy else [],
            util=97.0 if busy else 0.0,
            memory_total=143771 * 1024**2,
            clock_reasons="h200",
        )
        return cls(devices=[device], **kw)

    # -- misbehaviour switches for tests ------------------------------------------------------

    def inject_xid(self, index: int, xid: int) -> None:
        """Put an XID critical error of GPU `index` into the event set."""
        self._events.put(_EventData(self.devices[index], self.nvmlEventTypeXidCriticalError, xid))

    def inject_double_bit_ecc(self, index: int) -> None:
        """Count an uncorrectable ECC error on GPU `index` and signal it through the event set."""
        self.devices[index].ecc_uncorrected += 1
        self._events.put(_EventData(self.devices[index], self.nvmlEventTypeDoubleBitEccError, 0))

    # -- helpers --------------------------------------------------------------------------------

    def _dev(self, handle: Any, field_name: str) -> FakeDevice:
        self.calls += 1
        caller = sys._getframe(1).f_code.co_name
        self.call_counts[caller] = self.call_counts.get(caller, 0) + 1
        delay = self.latency_s.get(caller)
        if delay:
            time.sleep(delay)
        if not self.initialized:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        dev: FakeDevice = handle
        if dev.broken:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        if field_name in dev.unsupported:
            raise NVMLError_NotSupported()
        return dev

    def _wave(self, dev: FakeDevice, period: float, amplitude: float) -> float:
        t = self._clock() - self._t0
        return amplitude * math.sin(2 * math.pi * t / period + dev.index) + self._rng.uniform(-1, 1)

    # -- the pynvml surface the agent uses ------------------------------------------------------

    def nvmlInit(self) -> None:
        """Initialise, or raise the configured init error (e.g. LIBRARY_NOT_FOUND)."""
        if self._init_error is not None:
            raise NVMLError(self._init_error)
        self.initialized = True

    def nvmlShutdown(self) -> None:
        """Shut down."""
        self.initialized = False

    def nvmlSystemGetDriverVersion(self) -> str:
        """A plausible driver version."""
        return "550.90.07-fake"

    def nvmlDeviceGetCount(self) -> int:
        """Number of devices."""
        if not self.initialized:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeDevice:
        """The device itself is the handle."""
        if not self.initialized:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        return self.devices[index]

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> FakeDevice:
        """The device with this UUID."""
        if not self.initialized:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        for dev in self.devices:
            if dev.uuid == uuid:
                return dev
        raise NVMLError(6)  # NVML_ERROR_NOT_FOUND

    def nvmlDeviceGetIndex(self, handle: Any) -> int:
        """The device index."""
        return self._dev(handle, "index").index

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        """The device UUID."""
        return self._dev(handle, "uuid").uuid

    def nvmlDeviceGetName(self, handle: Any) -> str:
        """The product name."""
        return self._dev(handle, "name").name

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> _Util:
        """GPU and memory activity, percent."""
        dev = self._dev(handle, "utilization")
        gpu = max(0.0, min(100.0, dev.util + self._wave(dev, 60, 3)))
        return _Util(gpu=int(gpu), memory=int(gpu * 0.6))

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> _Memory:
        """Framebuffer memory in bytes."""
        dev = self._dev(handle, "memory")
        total = dev.memory_total
        used = int(total * (0.7 + 0.001 * self._wave(dev, 300, 5))) if dev.util > 0 else 512 * 1024**2
        return _Memory(total=total, used=used, free=total - used)

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        """Power draw, milliwatts."""
        dev = self._dev(handle, "power")
        return int((200 + 4.5 * dev.util + self._wave(dev, 45, 15)) * 1000)

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        """Power limit, milliwatts."""
        self._dev(handle, "power_limit")
        return 700_000

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        """Energy since driver load, millijoules."""
        dev = self._dev(handle, "energy")
        dev.energy_mj += 650_000
        return dev.energy_mj

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        """Core temperature, Celsius."""
        dev = self._dev(handle, "temperature")
        return int(60 + 0.15 * dev.util + self._wave(dev, 120, 2))

    def nvmlDeviceGetClockInfo(self, handle: Any, clock_type: int) -> int:
        """Current SM or memory clock, MHz."""
        self._dev(handle, "clocks")
        return 1980 if clock_type == self.NVML_CLOCK_SM else 2619

    def nvmlDeviceGetMaxClockInfo(self, handle: Any, clock_type: int) -> int:
        """Maximum SM or memory clock, MHz."""
        self._dev(handle, "max_clocks")
        return 1980 if clock_type == self.NVML_CLOCK_SM else 2619

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        """Bit mask of clock event (throttle) reasons; 0 when none."""
        dev = self._dev(handle, "clock_event_reasons")
        if dev.clock_reasons == "h200":
            return 0x4 if dev.pids else 0x1  # SW power cap under load; GPU idle without processes
        return 0

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int:
        """Older name of the clock event reasons."""
        return self.nvmlDeviceGetCurrentClocksEventReasons(handle)

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: int, counter_type: int) -> int:
        """Volatile ECC error counts."""
        dev = self._dev(handle, "ecc")
        return (
            dev.ecc_corrected if error_type == self.NVML_MEMORY_ERROR_TYPE_CORRECTED else dev.ecc_uncorrected
        )

    def nvmlDeviceGetRemappedRows(self, handle: Any) -> tuple[int, int, int, int]:
        """(correctable, uncorrectable, pending, failure)."""
        self._dev(handle, "remapped_rows")
        return (0, 0, 0, 0)

    def nvmlDeviceGetPcieThroughput(self, handle: Any, counter: int) -> int:
        """PCIe throughput over the last 20 ms, KB/s."""
        dev = self._dev(handle, "pcie")
        return int(max(0.0, 500_000 + 20_000 * self._wave(dev, 30, 5)))

    def nvmlDeviceGetPcieReplayCounter(self, handle: Any) -> int:
        """PCIe replay count."""
        dev = self._dev(handle, "pcie_replay")
        return self._pcie_replays[dev.index]

    def nvmlDeviceGetFieldValues(self, handle: Any, field_ids: list[Any]) -> list[_FieldValue]:
        """Field values; NVLink throughput counters (KiB) and memory temperature."""
        dev = self._dev(handle, "field_values")
        self._nvlink_kib[dev.index] += 40 * 1024 * 1024  # about 40 GiB/s when sampled each second
        self._pcie_bytes[dev.index] += 500 * 1024 * 1024  # about 500 MiB/s when sampled each second
        out = []
        for item in field_ids:
            fid, scope = item if isinstance(item, tuple) else (item, 0)
            if fid in (self.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, self.NVML_FI_DEV_PCIE_COUNT_RX_BYTES):
                ok = "pcie_counters" not in dev.unsupported
                out.append(
                    _FieldValue(
                        fid,
                        scope,
                        NVML_SUCCESS if ok else NVML_ERROR_NOT_SUPPORTED,
                        self.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG,
                        _Value(ullVal=self._pcie_bytes[dev.index]),
                    )
                )
            elif fid == self.NVML_FI_DEV_MEMORY_TEMP:
                ret = NVML_ERROR_NOT_SUPPORTED if "temp_mem" in dev.unsupported else NVML_SUCCESS
                out.append(_FieldValue(fid, scope, ret, self.NVML_VALUE_TYPE_UNSIGNED_INT, _Value(uiVal=70)))
            elif fid in (
                self.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
                self.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
            ):
                ok = "nvlink" not in dev.unsupported and scope < 18
                per_link = self._nvlink_kib[dev.index] // 18
                out.append(
                    _FieldValue(
                        fid,
                        scope,
                        NVML_SUCCESS if ok else NVML_ERROR_NOT_SUPPORTED,
                        self.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG,
                        _Value(ullVal=per_link),
                    )
                )
            else:
                out.append(_FieldValue(fid, scope, NVML_ERROR_NOT_SUPPORTED, 0, _Value()))
        return out

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[_Process]:
        """Processes with a compute context on the GPU."""
        dev = self._dev(handle, "processes")
        return [_Process(pid=p, usedGpuMemory=1 << 30) for p in dev.pids]

    # -- GPM ------------------------------------------------------------------------------------

    def _gpm_advance(self, dev: FakeDevice) -> float:
        """Grow the device's GPM counters at its current rates up to now; returns now."""
        now = self._clock()
        last = self._gpm_at[dev.index]
        if last is not None and now > last:
            shape = _GPM_SHAPES.get(dev.workload, _GPM_SHAPES["compute"])
            activity = max(0.0, min(100.0, dev.util + self._wave(dev, 60, 2)))
            counters = self._gpm_counters[dev.index]
            for metric, share in shape.items():
                counters[metric] += activity * share * (now - last)
        self._gpm_at[dev.index] = now
        return now

    def nvmlGpmQueryDeviceSupport(self, handle: Any) -> _GpmSupport:
        """Whether the device has GPM (Hopper and newer)."""
        dev = self._dev(handle, "gpm_query")
        return _GpmSupport(gpm_supported(dev))

    def nvmlGpmSampleAlloc(self) -> _GpmSample:
        """A sample buffer."""
        if not self.initialized:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        return _GpmSample()

    def nvmlGpmSampleFree(self, sample: _GpmSample) -> None:
        """Release a sample buffer."""
        sample.freed = True

    def nvmlGpmSampleGet(self, handle: Any, sample: _GpmSample) -> _GpmSample:
        """Read the device's GPM counters into `sample`."""
        dev = self._dev(handle, "gpm")
        if not gpm_supported(dev):
            raise NVMLError_NotSupported()
        if sample.freed:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        sample.t = self._gpm_advance(dev)
        sample.device = dev.index
        sample.counters = dict(self._gpm_counters[dev.index])
        return sample

    def nvmlGpmMetricsGet(self, request: _GpmMetricsGet) -> _GpmMetricsGet:
        """Each requested metric averaged between `sample1` and `sample2` (of one device, in time order)."""
        self.calls += 1
        self.call_counts["nvmlGpmMetricsGet"] = self.call_counts.get("nvmlGpmMetricsGet", 0) + 1
        delay = self.latency_s.get("nvmlGpmMetricsGet")
        if delay:
            time.sleep(delay)
        s1, s2 = request.sample1, request.sample2
        if (
            request.version != self.NVML_GPM_METRICS_GET_VERSION
            or not isinstance(s1, _GpmSample)
            or not isinstance(s2, _GpmSample)
            or s1.device is None
            or s1.device != s2.device
            or s2.t <= s1.t
        ):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        span = s2.t - s1.t
        for slot in range(request.numMetrics):
            metric = request.metrics[slot]
            if metric.metricId in s2.counters:
                metric.nvmlReturn = NVML_SUCCESS
                metric.value = (s2.counters[metric.metricId] - s1.counters[metric.metricId]) / span
            else:
                metric.nvmlReturn, metric.value = NVML_ERROR_NOT_SUPPORTED, 0.0
        return request

    def nvmlEventSetCreate(self) -> object:
        """A new event set (the fake has one queue)."""
        if not self.initialized:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        return object()

    def nvmlDeviceRegisterEvents(self, handle: Any, event_types: int, event_set: Any) -> None:
        """Register a device for events."""
        dev = self._dev(handle, "events")
        self._registered[dev.index] = event_types

    def nvmlEventSetWait(self, event_set: Any, timeout_ms: int) -> _EventData:
        """The next event, or `NVMLError_Timeout` after `timeout_ms`."""
        try:
            return self._events.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            raise NVMLError_Timeout() from None

    def nvmlEventSetFree(self, event_set: Any) -> None:
        """Release the event set."""
