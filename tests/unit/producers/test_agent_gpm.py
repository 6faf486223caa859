"""GPM metrics (Hopper and newer): the agent reads SM activity, occupancy, tensor-pipe activity and DRAM
bandwidth between two ticks; older GPUs report them as null; a spinning collective is told apart from
compute. Driven through the fake NVML, which averages cumulative counters over the interval as NVML does."""

from __future__ import annotations

import pytest

from producers.agent import FakeDevice, FakeNvml, GpuSampler
from producers.agent.gpu import GPM_FIELDS, TimedNvml
from schemas.codec import Codec
from schemas.records import Event


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _node(clock: Clock) -> FakeNvml:
    return FakeNvml(
        devices=[
            FakeDevice(0, "GPU-h100-compute", name="NVIDIA H100 80GB HBM3", util=97.0),
            FakeDevice(1, "GPU-h100-spin", name="NVIDIA H100 80GB HBM3", util=100.0, workload="collective"),
            FakeDevice(2, "GPU-a100", name="NVIDIA A100-SXM4-80GB", util=97.0),
        ],
        clock=clock,
    )


def _tick(sampler: GpuSampler, clock: Clock, k: int) -> list[dict]:
    clock.t += 1.0
    return sampler.sample(1_700_000_000_000 + k * 1000, clock.t)


def test_gpm_needs_two_readings_then_tells_compute_from_a_spinning_collective() -> None:
    clock = Clock()
    sampler = GpuSampler(_node(clock), cluster="c", node="n")
    assert sampler.gpm_supported == [True, True, False]
    first = _tick(sampler, clock, 0)
    assert all(first[g][f] is None for g in range(3) for f in GPM_FIELDS), "an interval needs two readings"
    compute, spin, older = _tick(sampler, clock, 1)
    # Both run a kernel all the time: activity alone cannot tell them apart.
    assert compute["gpu_util_pct"] > 90 and spin["gpu_util_pct"] > 90
    assert compute["sm_active_pct"] == pytest.approx(0.93 * 97, abs=3)
    assert compute["tensor_active_pct"] == pytest.approx(0.62 * 97, abs=3)
    assert compute["dram_active_pct"] == pytest.approx(0.48 * 97, abs=3)
    assert spin["sm_active_pct"] < 20 and spin["tensor_active_pct"] == 0.0 and spin["sm_occupancy_pct"] < 5
    assert all(older[f] is None for f in GPM_FIELDS), "an A100 has no GPM"
    for record in (compute, spin, older):
        Codec().encode(Event("GpuSample", record))


def test_a_gpm_metric_is_the_average_over_the_interval() -> None:
    clock = Clock()
    nvml = _node(clock)
    sampler = GpuSampler(nvml, cluster="c", node="n")
    _tick(sampler, clock, 0)
    # Half the interval computing, then the GPU blocks in a collective for the other half.
    clock.t += 0.5
    nvml._gpm_advance(nvml.devices[0])
    nvml.devices[0].workload = "collective"
    clock.t += 0.5
    got = sampler.sample(1, clock.t)[0]
    assert got["tensor_active_pct"] == pytest.approx(0.5 * 0.62 * 97, abs=3)


def test_gpm_not_supported_is_asked_once_and_stays_null() -> None:
    clock = Clock()
    nvml = FakeNvml(devices=[FakeDevice(0, "GPU-x", name="NVIDIA H100 80GB HBM3", gpm=False)], clock=clock)
    sampler = GpuSampler(nvml, cluster="c", node="n")
    for k in range(5):
        assert _tick(sampler, clock, k)[0]["sm_active_pct"] is None
    assert nvml.call_counts.get("nvmlGpmSampleGet", 0) == 0
    assert nvml.call_counts["nvmlGpmQueryDeviceSupport"] == 1


def test_a_failing_gpm_read_leaves_the_metrics_null_and_the_rest_of_the_sample_intact() -> None:
    clock = Clock()
    nvml = _node(clock)
    sampler = GpuSampler(nvml, cluster="c", node="n")
    _tick(sampler, clock, 0)
    nvml.devices[0].unsupported.add("gpm")  # e.g. MIG enabled since: NotSupported from now on
    got = _tick(sampler, clock, 1)[0]
    assert got["sm_active_pct"] is None and got["gpu_util_pct"] is not None
    assert sampler.gpm_supported[0] is False, "NotSupported stops the GPM reads of that GPU"
    sampler.close()


def test_the_h200_shape_has_gpm_and_timed_nvml_measures_the_gpm_calls() -> None:
    clock = Clock()
    timed = TimedNvml(FakeNvml.h200(busy=True, clock=clock))
    sampler = GpuSampler(timed, cluster="c", node="n")
    for k in range(3):
        _tick(sampler, clock, k)
    costs = timed.costs()
    assert costs["nvmlGpmSampleGet"][0] == 3 and costs["nvmlGpmMetricsGet"][0] == 2
    assert _tick(sampler, clock, 3)[0]["sm_active_pct"] is not None


def test_a_hung_kernel_reads_busy_sms_without_tensor_work_unlike_a_spinning_collective() -> None:
    """The three states the hang rule tells apart on Hopper: compute, a hung kernel, a collective's spin."""
    clock = Clock()
    nvml = FakeNvml(
        devices=[
            FakeDevice(0, "GPU-compute", name="NVIDIA H200", util=97.0),
            FakeDevice(1, "GPU-hung", name="NVIDIA H200", util=100.0, workload="hung"),
            FakeDevice(2, "GPU-spin", name="NVIDIA H200", util=100.0, workload="collective"),
            FakeDevice(3, "GPU-idle", name="NVIDIA H200", util=0.0, workload="idle"),
        ],
        clock=clock,
    )
    sampler = GpuSampler(nvml, cluster="c", node="n")
    _tick(sampler, clock, 0)
    compute, hung, spin, idle = _tick(sampler, clock, 1)
    assert hung["gpu_util_pct"] > 90 and spin["gpu_util_pct"] > 90  # activity cannot tell them apart
    assert hung["sm_active_pct"] > 80 and spin["sm_active_pct"] < 20  # SM activity can
    assert hung["tensor_active_pct"] == 0.0 and compute["tensor_active_pct"] > 50  # so can tensor work
    assert idle["sm_active_pct"] == 0.0 and idle["tensor_active_pct"] == 0.0
