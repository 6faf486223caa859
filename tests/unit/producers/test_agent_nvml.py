"""What the agent asks NVML per tick: counters instead of the blocking 20 ms PCIe throughput, slow
fields at their own cadence, NotSupported fields dropped; and the shape a real single H200 returned."""

from __future__ import annotations

import pytest

from producers.agent import FakeDevice, FakeNvml, GpuSampler
from producers.agent.gpu import TimedNvml
from schemas.codec import Codec
from schemas.records import Event


def _ticks(sampler: GpuSampler, seconds: int) -> list[list[dict]]:
    return [sampler.sample(1_700_000_000_000 + t * 1000, float(t)) for t in range(seconds)]


def test_pcie_rates_come_from_counters_and_the_blocking_call_is_never_made() -> None:
    nvml = FakeNvml(gpus=2)
    sampler = GpuSampler(nvml, cluster="c", node="n")
    ticks = _ticks(sampler, 5)
    assert "nvmlDeviceGetPcieThroughput" not in nvml.call_counts
    assert ticks[0][0]["pcie_tx_bytes_s"] is None, "a rate needs two readings"
    assert ticks[3][0]["pcie_tx_bytes_s"] == pytest.approx(500 * 1024**2, rel=0.01)
    assert ticks[3][1]["pcie_rx_bytes_s"] == pytest.approx(500 * 1024**2, rel=0.01)


def test_without_pcie_counters_the_throughput_is_read_only_at_the_slow_cadence() -> None:
    nvml = FakeNvml(devices=[FakeDevice(0, "GPU-old", unsupported={"pcie_counters"})])
    sampler = GpuSampler(nvml, cluster="c", node="n", slow_interval_s=10)
    ticks = _ticks(sampler, 20)
    assert nvml.call_counts["nvmlDeviceGetPcieThroughput"] == 2 * 2, "TX and RX, at t=0 and t=10"
    assert all(t[0]["pcie_tx_bytes_s"] is not None for t in ticks), "the last reading is repeated"


def test_slow_fields_are_read_every_slow_interval_fast_ones_every_tick() -> None:
    nvml = FakeNvml(gpus=1)
    sampler = GpuSampler(nvml, cluster="c", node="n", slow_interval_s=10)
    _ticks(sampler, 30)
    calls = nvml.call_counts
    assert calls["nvmlDeviceGetUtilizationRates"] == 30
    assert calls["nvmlDeviceGetFieldValues"] == 30
    for slow in (
        "nvmlDeviceGetComputeRunningProcesses",
        "nvmlDeviceGetRemappedRows",
        "nvmlDeviceGetEnforcedPowerLimit",
    ):
        assert calls[slow] == 3, slow
    assert calls["nvmlDeviceGetTotalEccErrors"] == 3 * 2
    assert calls["nvmlDeviceGetMaxClockInfo"] == 1, "static: read once"


def test_an_ecc_event_rereads_the_slow_fields_at_once() -> None:
    nvml = FakeNvml(gpus=1)
    sampler = GpuSampler(nvml, cluster="c", node="n", slow_interval_s=60)
    assert sampler.sample(1, 0.0)[0]["ecc_uncorrected"] == 0
    nvml.devices[0].ecc_uncorrected = 2
    assert sampler.sample(2, 1.0)[0]["ecc_uncorrected"] == 0, "between slow reads the last value is repeated"
    assert sampler.sample_one(0, 3, 1.5, xid=48)["ecc_uncorrected"] == 2


@pytest.mark.parametrize("busy", [False, True])
def test_the_h200_shape_no_nvlink_reason_bits_and_pids(busy: bool) -> None:
    nvml = FakeNvml.h200(busy=busy)
    sampler = GpuSampler(nvml, cluster="c", node="n")
    first, second = (t[0] for t in _ticks(sampler, 2))
    codec = Codec()
    for record in (first, second):
        codec.encode(Event("GpuSample", record))
        assert record["nvlink_tx_bytes_s"] is None and record["nvlink_rx_bytes_s"] is None
    assert second["gpu_name"] == "NVIDIA H200"
    assert second["clock_event_reasons"] == (0x4 if busy else 0x1)
    assert second["pids"] == ([4242] if busy else [])
    assert second["pcie_tx_bytes_s"] is not None
    assert sampler.errors == 0, "NotSupported NVLink is the normal answer of a single GPU"
    # After the first answer the NVLink ids are no longer asked for: memory temperature + PCIe TX/RX only.
    assert len(sampler._field_ids[0]) == 3


def test_timed_nvml_reports_the_cost_of_each_function() -> None:
    now = [0.0]

    def clock() -> float:
        now[0] += 0.001  # every clock reading is 1 ms later: each call "costs" 1 ms
        return now[0]

    timed = TimedNvml(FakeNvml(gpus=2), clock=clock)
    sampler = GpuSampler(timed, cluster="c", node="n")
    _ticks(sampler, 3)
    costs = timed.costs()
    calls, seconds = costs["nvmlDeviceGetUtilizationRates"]
    assert calls == 6 and seconds == pytest.approx(0.006)
    assert "nvmlDeviceGetPcieThroughput" not in costs
