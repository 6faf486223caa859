"""GPU sampling through NVML: one `GpuSample` per GPU per interval, and XID / ECC events as they happen.

All NVML calls go through the module object given to `GpuSampler` (the real `pynvml`, or
`FakeNvml` for `--simulate` and tests). Every field is read on its own: a field the GPU does not
support, or may not be read without privileges, is null; a GPU that fails is logged once and
the others are still sampled.

On Hopper and newer GPUs the sampler also reads NVML's GPU Performance Monitoring (GPM): two
samples per GPU (`nvmlGpmSampleAlloc`), one `nvmlGpmSampleGet` per tick into the older of the
two, and `nvmlGpmMetricsGet` between the last two ticks gives SM activity, SM occupancy,
tensor-pipe activity and DRAM bandwidth over the interval. `gpu_util_pct` says a kernel was
running; these say how much of the GPU it used, so a collective spinning while it waits (100 %
"utilisation", few SMs, no tensor work) is told apart from compute. GPUs without GPM (before
Hopper, or a driver without it) report them as null.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from producers.errors import NvmlUnavailableError

__all__ = ["GPM_FIELDS", "GpuSampler", "TimedNvml", "XidWatcher", "load_nvml"]

log = logging.getLogger(__name__)

_QUIET_CODES_NAMES = ("NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_NO_PERMISSION", "NVML_ERROR_FUNCTION_NOT_FOUND")

# GpuSample field -> (pynvml constant, its value in nvml.h): the GPM metrics the agent reads.
GPM_FIELDS: dict[str, tuple[str, int]] = {
    "sm_active_pct": ("NVML_GPM_METRIC_SM_UTIL", 2),
    "sm_occupancy_pct": ("NVML_GPM_METRIC_SM_OCCUPANCY", 3),
    "tensor_active_pct": ("NVML_GPM_METRIC_ANY_TENSOR_UTIL", 5),
    "dram_active_pct": ("NVML_GPM_METRIC_DRAM_BW_UTIL", 10),
}
_NO_DRIVER_NAMES = ("NVML_ERROR_LIBRARY_NOT_FOUND", "NVML_ERROR_DRIVER_NOT_LOADED")


def load_nvml() -> Any:
    """The real `pynvml` module (from the `nvidia-ml-py` package)."""
    import pynvml

    return pynvml


class GpuSampler:
    """Reads every GPU of the node through an NVML module; `sample(ts, now)` -> GpuSample records.

    Cost matters: the node's CPUs belong to the training job. Per tick and GPU the sampler makes
    only cheap, non-blocking reads (activity, memory, power, energy, temperature, clocks, clock
    event reasons) plus one `nvmlDeviceGetFieldValues` call for memory temperature and the PCIe
    and NVLink byte *counters* (rates are counter deltas over the tick). It never calls
    `nvmlDeviceGetPcieThroughput` per tick: that function samples a byte counter over a 20 ms
    window, so two calls block 40 ms per GPU (what made the first agent take ~50 ms per GPU on an
    H200); it is only a fallback, every `slow_interval_s`, for GPUs without the PCIe counter
    fields. Slowly changing values (ECC counts, remapped rows, PCIe replays, power limit, the pids
    on the GPU) are read every `slow_interval_s` and repeated in between; static ones (name, UUID,
    maximum SM clock) once. NVLink links that answer NotSupported (a single GPU without NVLink)
    are not asked again.
    """

    def __init__(self, nvml: Any, *, cluster: str, node: str, slow_interval_s: float = 10.0) -> None:
        self.nvml = nvml
        self.cluster = cluster
        self.node = node
        self.slow_interval_s = slow_interval_s
        self._quiet = {getattr(nvml, n) for n in _QUIET_CODES_NAMES if hasattr(nvml, n)}
        no_driver = {getattr(nvml, n) for n in _NO_DRIVER_NAMES if hasattr(nvml, n)}
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            if getattr(exc, "value", None) in no_driver:
                raise NvmlUnavailableError(str(exc)) from None
            raise NvmlUnavailableError(f"initialisation failed: {exc}") from None
        except OSError as exc:  # a broken libnvidia-ml.so can fail to load at the ctypes level
            raise NvmlUnavailableError(str(exc)) from None
        self.count = nvml.nvmlDeviceGetCount()
        self.handles: list[Any] = []
        self.uuids: list[str] = []
        self.names: list[str | None] = []
        for index in range(self.count):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            self.handles.append(handle)
            uuid = self._read_once(index, "uuid", partial(_nvml_text, nvml.nvmlDeviceGetUUID, handle))
            self.uuids.append(uuid or f"GPU-unknown-{self.node}-{index}")
            self.names.append(
                self._read_once(index, "name", partial(_nvml_text, nvml.nvmlDeviceGetName, handle))
            )
        self._failed: set[tuple[int, str]] = set()
        self.errors = 0
        self._ok = getattr(nvml, "NVML_SUCCESS", 0)
        self._mem_temp_id = getattr(nvml, "NVML_FI_DEV_MEMORY_TEMP", 82)
        self._pcie_tx_id = getattr(nvml, "NVML_FI_DEV_PCIE_COUNT_TX_BYTES", 197)
        self._pcie_rx_id = getattr(nvml, "NVML_FI_DEV_PCIE_COUNT_RX_BYTES", 198)
        self._nvlink_tx_id = getattr(nvml, "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", 138)
        self._nvlink_rx_id = getattr(nvml, "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX", 139)
        links = range(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))
        all_links = [(self._nvlink_tx_id, link) for link in links] + [
            (self._nvlink_rx_id, link) for link in links
        ]
        # Per GPU: the field ids still worth asking for (NotSupported ones are dropped after one answer).
        self._field_ids: list[list[Any]] = [
            [self._mem_temp_id, self._pcie_tx_id, self._pcie_rx_id, *all_links] for _ in range(self.count)
        ]
        self._prev_counters: list[dict[str, tuple[int, float]]] = [{} for _ in range(self.count)]
        self._slow: list[dict[str, Any]] = [{} for _ in range(self.count)]
        self._slow_at: list[float | None] = [None] * self.count
        self._static: list[dict[str, Any]] = [{} for _ in range(self.count)]
        self._gpm_ids = [int(getattr(nvml, name, number)) for name, number in GPM_FIELDS.values()]
        # Per GPU: [older sample, newer sample, whether the newer one holds a reading], or None without GPM.
        self._gpm: list[list[Any] | None] = [self._gpm_start(i) for i in range(self.count)]

    def _read_once(self, index: int, field: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except self.nvml.NVMLError as exc:
            if getattr(exc, "value", None) not in self._quiet:
                log.warning("GPU %d: cannot read %s: %s", index, field, exc)
            return None

    def _read(self, index: int, field: str, fn: Callable[[], Any]) -> Any:
        """One NVML read; unsupported -> None silently, other errors -> None, logged once per GPU and field."""
        try:
            return fn()
        except self.nvml.NVMLError as exc:
            if getattr(exc, "value", None) in self._quiet:
                return None
            self.errors += 1
            key = (index, field)
            if key not in self._failed:
                self._failed.add(key)
                log.warning(
                    "GPU %d (%s): reading %s failed: %s; reporting it as null",
                    index,
                    self.uuids[index],
                    field,
                    exc,
                )
            return None
        except AttributeError:
            # An older pynvml without this function: the field is simply not available.
            return None

    def sample(self, ts_ms: int, now_s: float) -> list[dict[str, Any]]:
        """A GpuSample record per GPU (fields it cannot read are null)."""
        return [self.sample_one(index, ts_ms, now_s) for index in range(self.count)]

    def pids(self, index: int) -> list[int]:
        """The pids on a GPU at its last slow read."""
        return list(self._slow[index].get("pids") or [])

    def sample_one(self, index: int, ts_ms: int, now_s: float, xid: int | None = None) -> dict[str, Any]:
        """The GpuSample record of one GPU (an XID/ECC event re-reads the slow fields at once)."""
        nvml, h, read = self.nvml, self.handles[index], self._read
        last = self._slow_at[index]
        if xid is not None or last is None or now_s - last >= self.slow_interval_s or now_s < last:
            self._read_slow(index)
            self._slow_at[index] = now_s
        slow = self._slow[index]
        static = self._static[index]
        if "sm_clock_max" not in static:
            static["sm_clock_max"] = _int(
                read(index, "sm_clock_max", lambda: nvml.nvmlDeviceGetMaxClockInfo(h, nvml.NVML_CLOCK_SM))
            )
        util = read(index, "utilization", lambda: nvml.nvmlDeviceGetUtilizationRates(h))
        mem = read(index, "memory", lambda: nvml.nvmlDeviceGetMemoryInfo(h))
        power_mw = read(index, "power", lambda: nvml.nvmlDeviceGetPowerUsage(h))
        limit_mw = slow.get("power_limit")
        temp_mem, pcie_tx, pcie_rx, nvlink_tx, nvlink_rx = self._field_values(index, now_s)
        if pcie_tx is None and pcie_rx is None and "pcie_tx_kb" in slow:
            # No PCIe counters on this GPU: the 20 ms-window throughput, read at the slow cadence.
            tx_kb, rx_kb = slow["pcie_tx_kb"], slow["pcie_rx_kb"]
            pcie_tx = None if tx_kb is None else int(tx_kb) * 1024
            pcie_rx = None if rx_kb is None else int(rx_kb) * 1024
        remapped = slow.get("remapped_rows")
        gpm = self._gpm_metrics(index)
        return {
            "ts": ts_ms,
            "cluster": self.cluster,
            "node": self.node,
            "gpu_index": index,
            "gpu_uuid": self.uuids[index],
            "gpu_name": self.names[index],
            "gpu_util_pct": None if util is None else float(util.gpu),
            "mem_util_pct": None if util is None else float(util.memory),
            "mem_used_bytes": None if mem is None else int(mem.used),
            "mem_total_bytes": None if mem is None else int(mem.total),
            "power_w": None if power_mw is None else power_mw / 1000.0,
            "power_limit_w": None if limit_mw is None else limit_mw / 1000.0,
            "energy_mj": _int(read(index, "energy", lambda: nvml.nvmlDeviceGetTotalEnergyConsumption(h))),
            "temp_gpu_c": _float(
                read(
                    index, "temperature", lambda: nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU)
                )
            ),
            "temp_mem_c": temp_mem,
            "sm_clock_mhz": _int(
                read(index, "sm_clock", lambda: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM))
            ),
            "mem_clock_mhz": _int(
                read(index, "mem_clock", lambda: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_MEM))
            ),
            "sm_clock_max_mhz": static["sm_clock_max"],
            "clock_event_reasons": _int(read(index, "clock_event_reasons", lambda: self._clock_reasons(h))),
            "ecc_corrected": _int(slow.get("ecc_corrected")),
            "ecc_uncorrected": _int(slow.get("ecc_uncorrected")),
            "remapped_rows_correctable": None if remapped is None else int(remapped[0]),
            "remapped_rows_uncorrectable": None if remapped is None else int(remapped[1]),
            "pcie_tx_bytes_s": pcie_tx,
            "pcie_rx_bytes_s": pcie_rx,
            "pcie_replay_count": _int(slow.get("pcie_replay")),
            "nvlink_tx_bytes_s": nvlink_tx,
            "nvlink_rx_bytes_s": nvlink_rx,
            "pids": list(slow.get("pids") or []),
            "xid": xid,
            "job_id": None,  # stamped by the runner when the GPU is attributed to a job
            "run_id": None,
            **gpm,
        }

    # -- GPM (Hopper and newer) ----------------------------------------------------------------------

    @property
    def gpm_supported(self) -> list[bool]:
        """Per GPU: whether GPM metrics are read."""
        return [g is not None for g in self._gpm]

    def _gpm_start(self, index: int) -> list[Any] | None:
        """Two GPM sample buffers for a GPU that supports GPM, else None (asked once)."""
        nvml, h = self.nvml, self.handles[index]
        query = getattr(nvml, "nvmlGpmQueryDeviceSupport", None)
        if query is None or not hasattr(nvml, "c_nvmlGpmMetricsGet_t"):
            return None  # an nvidia-ml-py without GPM
        try:
            if not int(query(h).isSupportedDevice):
                return None
            return [nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc(), False]
        except nvml.NVMLError as exc:
            if getattr(exc, "value", None) not in self._quiet:
                log.warning("GPU %d: GPM metrics are not available: %s", index, exc)
            return None

    def _gpm_metrics(self, index: int) -> dict[str, float | None]:
        """GPM metrics between the previous tick and this one (null on the first tick and without GPM)."""
        empty: dict[str, float | None] = dict.fromkeys(GPM_FIELDS)
        state = self._gpm[index]
        if state is None:
            return empty
        nvml, h = self.nvml, self.handles[index]
        older, newer, have = state
        # Read into the older buffer: it becomes the newer one.
        try:
            nvml.nvmlGpmSampleGet(h, older)
        except nvml.NVMLError as exc:
            state[2] = False  # no reading this tick: the next one starts a fresh interval
            if getattr(exc, "value", None) in self._quiet:
                self._gpm_stop(index)  # the GPU (or a MIG mode) says no: stop asking
            else:
                self._read(index, "gpm_sample", partial(_raise, exc))  # logged once, counted
            return empty
        state[0], state[1], state[2] = newer, older, True
        if not have:
            return empty
        request = nvml.c_nvmlGpmMetricsGet_t()
        request.version = getattr(nvml, "NVML_GPM_METRICS_GET_VERSION", 1)
        request.numMetrics = len(self._gpm_ids)
        request.sample1 = newer  # the previous tick's reading
        request.sample2 = older  # this tick's
        for slot, metric_id in enumerate(self._gpm_ids):
            request.metrics[slot].metricId = metric_id
        got = self._read(index, "gpm_metrics", lambda: nvml.nvmlGpmMetricsGet(request))
        if got is None:
            return empty
        ok = self._ok
        out: dict[str, float | None] = {}
        for slot, name in enumerate(GPM_FIELDS):
            metric = got.metrics[slot]
            value = float(metric.value)
            out[name] = value if metric.nvmlReturn == ok and 0.0 <= value <= 100.0 else None
        return out

    def _gpm_stop(self, index: int) -> None:
        state, self._gpm[index] = self._gpm[index], None
        for buffer in (state or [])[:2]:
            with contextlib.suppress(self.nvml.NVMLError, AttributeError):
                self.nvml.nvmlGpmSampleFree(buffer)

    def _read_slow(self, index: int) -> None:
        """The fields read every `slow_interval_s`: counts that change rarely, and the pids on the GPU."""
        nvml, h, read = self.nvml, self.handles[index], self._read
        slow = self._slow[index]
        slow["power_limit"] = read(index, "power_limit", lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(h))
        slow["ecc_corrected"] = read(
            index,
            "ecc_corrected",
            lambda: nvml.nvmlDeviceGetTotalEccErrors(
                h, nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, nvml.NVML_VOLATILE_ECC
            ),
        )
        slow["ecc_uncorrected"] = read(
            index,
            "ecc_uncorrected",
            lambda: nvml.nvmlDeviceGetTotalEccErrors(
                h, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
            ),
        )
        slow["remapped_rows"] = read(index, "remapped_rows", lambda: nvml.nvmlDeviceGetRemappedRows(h))
        slow["pcie_replay"] = read(index, "pcie_replay", lambda: nvml.nvmlDeviceGetPcieReplayCounter(h))
        procs = read(index, "processes", lambda: nvml.nvmlDeviceGetComputeRunningProcesses(h))
        slow["pids"] = [int(p.pid) for p in procs] if procs else []
        if slow.get("pcie_counters") is False:
            slow["pcie_tx_kb"] = read(
                index, "pcie_tx", lambda: nvml.nvmlDeviceGetPcieThroughput(h, nvml.NVML_PCIE_UTIL_TX_BYTES)
            )
            slow["pcie_rx_kb"] = read(
                index, "pcie_rx", lambda: nvml.nvmlDeviceGetPcieThroughput(h, nvml.NVML_PCIE_UTIL_RX_BYTES)
            )

    def _clock_reasons(self, handle: Any) -> int:
        fn = getattr(self.nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        if fn is not None:
            try:
                return int(fn(handle))
            except self.nvml.NVMLError as exc:
                if getattr(exc, "value", None) != getattr(self.nvml, "NVML_ERROR_FUNCTION_NOT_FOUND", -1):
                    raise
        return int(self.nvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle))

    def _rate(self, index: int, name: str, value: int | None, now_s: float, scale: int = 1) -> int | None:
        """Bytes/s from a cumulative counter; None on the first reading or after a reset / wrap."""
        prev_all = self._prev_counters[index]
        if value is None:
            prev_all.pop(name, None)
            return None
        prev = prev_all.get(name)
        prev_all[name] = (value, now_s)
        if prev is None or now_s <= prev[1] or value < prev[0]:
            return None
        return int((value - prev[0]) * scale / (now_s - prev[1]))

    def _field_values(
        self, index: int, now_s: float
    ) -> tuple[float | None, int | None, int | None, int | None, int | None]:
        """Memory temperature, PCIe TX/RX and NVLink TX/RX bytes/s, from one field-values call."""
        ids = self._field_ids[index]
        values = self._read(
            index, "field_values", lambda: self.nvml.nvmlDeviceGetFieldValues(self.handles[index], ids)
        )
        if values is None:
            return None, None, None, None, None
        ok = self._ok
        not_supported = getattr(self.nvml, "NVML_ERROR_NOT_SUPPORTED", 3)
        temp_mem: float | None = None
        pcie: dict[int, int] = {}
        nvlink_tx = nvlink_rx = 0
        nvlink_seen = False
        keep: list[Any] = []
        for asked, v in zip(ids, values, strict=False):
            if v.nvmlReturn == not_supported:
                continue  # never ask again: this GPU does not have it
            keep.append(asked)
            if v.nvmlReturn != ok:
                continue
            fid = v.fieldId
            if fid == self._mem_temp_id:
                number = _field_number(v)
                temp_mem = None if number is None else float(number)
            elif fid in (self._pcie_tx_id, self._pcie_rx_id):
                pcie[fid] = int(_field_number(v) or 0)
            elif fid == self._nvlink_tx_id:
                nvlink_seen = True
                nvlink_tx += int(_field_number(v) or 0)
            elif fid == self._nvlink_rx_id:
                nvlink_seen = True
                nvlink_rx += int(_field_number(v) or 0)
        if len(keep) != len(ids):
            self._field_ids[index] = keep
        slow = self._slow[index]
        if "pcie_counters" not in slow:
            slow["pcie_counters"] = bool(pcie)
            if not pcie:
                self._read_slow(index)  # fetch the fallback throughput right away
        tx = self._rate(index, "pcie_tx", pcie.get(self._pcie_tx_id), now_s)
        rx = self._rate(index, "pcie_rx", pcie.get(self._pcie_rx_id), now_s)
        if not nvlink_seen:
            return temp_mem, tx, rx, None, None
        # NVLink counters are KiB.
        return (
            temp_mem,
            tx,
            rx,
            self._rate(index, "nvlink_tx", nvlink_tx, now_s, 1024),
            self._rate(index, "nvlink_rx", nvlink_rx, now_s, 1024),
        )

    def close(self) -> None:
        """Free the GPM buffers and shut NVML down."""
        for index in range(self.count):
            self._gpm_stop(index)
        with contextlib.suppress(self.nvml.NVMLError):
            self.nvml.nvmlShutdown()


class TimedNvml:
    """Wraps an NVML module and measures every `nvml*` call: `costs()` -> {function: (calls, seconds)}."""

    def __init__(self, nvml: Any, clock: Callable[[], float] = time.perf_counter) -> None:
        self._nvml = nvml
        self._clock = clock
        self._costs: dict[str, list[float]] = {}

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._nvml, name)
        if not (name.startswith("nvml") and callable(attr)):
            return attr
        costs = self._costs.setdefault(name, [0, 0.0])
        clock = self._clock

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = clock()
            try:
                return attr(*args, **kwargs)
            finally:
                costs[0] += 1
                costs[1] += clock() - t0

        return timed

    def costs(self) -> dict[str, tuple[int, float]]:
        """Calls and total seconds per NVML function, most expensive first."""
        return {
            name: (int(n), total)
            for name, (n, total) in sorted(self._costs.items(), key=lambda kv: -kv[1][1])
            if n
        }


class XidWatcher:
    """Waits on an NVML event set for XID and ECC events; calls `on_event(gpu_index, xid)` for each."""

    def __init__(
        self, sampler: GpuSampler, on_event: Callable[[int, int | None], None], *, wait_ms: int = 500
    ) -> None:
        self.sampler = sampler
        self.on_event = on_event
        self.wait_ms = wait_ms
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.registered: list[int] = []
        nvml = sampler.nvml
        self._xid_type = nvml.nvmlEventTypeXidCriticalError
        self._event_set = nvml.nvmlEventSetCreate()
        wanted = (
            nvml.nvmlEventTypeXidCriticalError
            | nvml.nvmlEventTypeDoubleBitEccError
            | nvml.nvmlEventTypeSingleBitEccError
        )
        for index, handle in enumerate(sampler.handles):
            # Not every GPU supports every event type: fall back to XID only, then to nothing.
            for types in (wanted, nvml.nvmlEventTypeXidCriticalError):
                try:
                    nvml.nvmlDeviceRegisterEvents(handle, types, self._event_set)
                    self.registered.append(index)
                    break
                except nvml.NVMLError as exc:
                    last = exc
            else:
                log.warning("GPU %d: cannot watch XID/ECC events: %s", index, last)
        self._index_by_uuid = {uuid: i for i, uuid in enumerate(sampler.uuids)}

    def start(self) -> None:
        """Start the watcher thread."""
        self._thread = threading.Thread(target=self._run, name="ranksight-xid", daemon=True)
        self._thread.start()

    def poll_once(self) -> bool:
        """Wait up to `wait_ms` for one event and dispatch it; True if one arrived."""
        nvml = self.sampler.nvml
        try:
            data = nvml.nvmlEventSetWait(self._event_set, self.wait_ms)
        except nvml.NVMLError as exc:
            if getattr(exc, "value", None) != getattr(nvml, "NVML_ERROR_TIMEOUT", 10):
                log.warning("NVML event wait failed: %s", exc)
                self._stop.wait(1.0)
            return False
        index = self._index_of(data.device)
        if index is None:
            return True
        xid = int(data.eventData) if data.eventType & self._xid_type else None
        self.on_event(index, xid)
        return True

    def _index_of(self, device: Any) -> int | None:
        for index, handle in enumerate(self.sampler.handles):
            if handle is device:
                return index
        try:
            uuid = _text(self.sampler.nvml.nvmlDeviceGetUUID(device))
        except self.sampler.nvml.NVMLError:
            return None
        return self._index_by_uuid.get(uuid)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll_once()
            except Exception:  # a watcher bug must not kill the agent
                log.exception("XID watcher error")
                self._stop.wait(1.0)

    def stop(self) -> None:
        """Stop the thread and free the event set."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.wait_ms / 1000 + 2)
        with contextlib.suppress(self.sampler.nvml.NVMLError):
            self.sampler.nvml.nvmlEventSetFree(self._event_set)


def _raise(exc: BaseException) -> Any:
    raise exc


def _nvml_text(fn: Callable[[Any], Any], handle: Any) -> str:
    return _text(fn(handle))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def _field_number(v: Any) -> float | int | None:
    kind = v.valueType
    val = v.value
    return {0: val.dVal, 1: val.uiVal, 2: val.ulVal, 3: val.ullVal, 4: val.sllVal, 5: val.siVal}.get(
        kind, val.uiVal
    )
