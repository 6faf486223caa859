"""The infrastructure rules: XID, ECC, throttling, GPU and host memory pressure, missing telemetry (one class each)."""

from __future__ import annotations

from schemas.records import Event
from streams.detectors.base import Detector, Finding, Topology
from streams.detectors.ecc_uncorrectable import EccUncorrectableDetector
from streams.detectors.gpu_memory_pressure import GpuMemoryPressureDetector
from streams.detectors.gpu_throttling import GpuThrottlingDetector
from streams.detectors.host_memory_pressure import HostMemoryPressureDetector
from streams.detectors.telemetry_missing import TelemetryMissingDetector
from streams.detectors.xid_error import XidErrorDetector
from tests.unit.streams.builders import T0, gpu_sample, host_sample, job_started, rank_bound

JOB = "job-1"
GIB = 2**30


def drive(det: Detector, events: list[Event]) -> list[Finding]:
    out: list[Finding] = []
    for ev in events:
        det.topology.observe(ev)
        out += det.observe(ev)
        out += det.advance(ev.record["ts"])
    return out


def rule(findings: list[Finding], name: str) -> list[Finding]:
    return [f for f in findings if f.rule == name]


def job_on_two_nodes() -> list[Event]:
    # 16 ranks: 0-7 on node-01, 8-15 on node-02.
    return [job_started(JOB, T0, world_size=16, nodes=2), *(rank_bound(JOB, r, T0) for r in range(16))]


def gpu_series(
    n: int, *, start: int = T0, every: int = 10_000, gpu: int = 3, **fields: object
) -> list[Event]:
    out = []
    for i in range(n):
        ev = gpu_sample("node-01", gpu, start + every * (i + 1))
        ev.record.update(fields)
        out.append(ev)
    return out


def test_xid_fires_at_once_with_the_bound_job_and_resolves_after_the_quiet_period() -> None:
    events = (
        job_on_two_nodes()
        + gpu_series(3)
        + gpu_series(1, start=T0 + 30_000, xid=79)
        + gpu_series(40, start=T0 + 40_000)
    )
    found = rule(drive(XidErrorDetector(Topology()), events), "xid_error")
    assert found[0].active and found[0].ts == T0 + 40_000 and found[0].severity == "critical"
    assert found[0].job_id == JOB and found[0].rank == 3 and found[0].key == ("node-01", "GPU-node-01-3")
    assert [f.active for f in found] == [True, False]
    assert T0 + 40_000 + 300_000 <= found[1].ts <= T0 + 40_000 + 310_000


def test_xid_outside_the_critical_classes_is_a_warning() -> None:
    events = job_on_two_nodes() + gpu_series(1, xid=13)
    assert rule(drive(XidErrorDetector(Topology()), events), "xid_error")[0].severity == "warning"


def test_a_gpu_bound_to_no_job_reports_with_an_empty_job_id() -> None:
    events = [*job_on_two_nodes(), gpu_sample("node-09", 0, T0 + 10000)]
    events[-1].record["xid"] = 48
    found = rule(drive(XidErrorDetector(Topology()), events), "xid_error")
    assert found[0].job_id == "" and found[0].rank is None


def test_uncorrectable_ecc_increment_fires_critical_at_once() -> None:
    events = (
        job_on_two_nodes()
        + gpu_series(3, ecc_uncorrected=2)
        + gpu_series(1, start=T0 + 30_000, ecc_uncorrected=3)
    )
    found = rule(drive(EccUncorrectableDetector(Topology()), events), "ecc_uncorrectable")
    # A counter already above zero at the first sample is history, not news: one finding only.
    assert [(f.active, f.ts, f.severity) for f in found] == [(True, T0 + 40_000, "critical")]


def test_remapped_row_after_uncorrectable_error_counts_as_ecc() -> None:
    events = (
        job_on_two_nodes() + gpu_series(2) + gpu_series(1, start=T0 + 20_000, remapped_rows_uncorrectable=1)
    )
    assert rule(drive(EccUncorrectableDetector(Topology()), events), "ecc_uncorrectable")


def test_thermal_throttling_with_low_clocks_is_reported_with_a_two_minute_sustain() -> None:
    events = (
        job_on_two_nodes()
        + gpu_series(20, clock_event_reasons=0x40, sm_clock_mhz=1400)
        + gpu_series(1, start=T0 + 200_000)
    )
    found = rule(drive(GpuThrottlingDetector(Topology()), events), "gpu_throttling")
    assert all(f.sustain_ms == 120_000 for f in found)
    assert found[0].since == T0 + 10_000 and "HW thermal slowdown" in found[0].summary
    assert [f.active for f in found] == [True] * 20 + [False]


def test_idle_and_application_clock_reasons_are_not_throttling() -> None:
    events = job_on_two_nodes() + gpu_series(20, clock_event_reasons=0x1 | 0x2, sm_clock_mhz=800)
    assert rule(drive(GpuThrottlingDetector(Topology()), events), "gpu_throttling") == []


def test_power_cap_bit_with_the_clock_near_max_is_not_throttling() -> None:
    events = job_on_two_nodes() + gpu_series(20, clock_event_reasons=0x4, sm_clock_mhz=1900)
    assert rule(drive(GpuThrottlingDetector(Topology()), events), "gpu_throttling") == []


def test_gpu_memory_above_97_percent_is_pressure_with_a_sustain() -> None:
    events = (
        job_on_two_nodes() + gpu_series(10, mem_used_bytes=int(79 * GIB)) + gpu_series(1, start=T0 + 100_000)
    )
    found = rule(drive(GpuMemoryPressureDetector(Topology()), events), "gpu_memory_pressure")
    assert (
        found[0].active
        and found[0].sustain_ms == 60_000
        and found[0].observed is not None
        and found[0].observed > 0.97
    )
    assert not found[-1].active


def host(ts: int, **fields: object) -> Event:
    ev = host_sample("node-02", ts)
    ev.record.update(fields)
    return ev


def test_oom_kill_fires_host_memory_pressure_at_once_for_the_node_job() -> None:
    events = [*job_on_two_nodes(), host(T0 + 10000), host(T0 + 20000, oom_kills=1)]
    events += [host(T0 + 20_000 + 10_000 * i) for i in range(1, 20)]
    found = rule(drive(HostMemoryPressureDetector(Topology()), events), "host_memory_pressure")
    assert found[0].active and found[0].sustain_ms == 0 and found[0].severity == "critical"
    assert found[0].job_id == JOB and found[0].node == "node-02" and found[0].key == ("node-02", JOB)
    assert not found[-1].active and found[-1].ts >= T0 + 20_000 + 120_000


def test_low_available_host_memory_is_pressure_with_a_sustain_and_clears() -> None:
    low = [host(T0 + 10_000 * i, mem_available_bytes=50 * GIB) for i in range(1, 10)]
    events = job_on_two_nodes() + low + [host(T0 + 100_000)]
    found = rule(drive(HostMemoryPressureDetector(Topology()), events), "host_memory_pressure")
    assert found[0].sustain_ms == 60_000 and found[0].since == T0 + 10_000
    assert [f.active for f in found][-1] is False


def telemetry(nodes: list[str], start: int, end: int, every: int = 10_000) -> list[Event]:
    out: list[Event] = []
    for ts in range(start, end, every):
        for node in nodes:
            out.append(host_sample(node, ts))
    return out


def test_a_silent_node_of_a_running_job_is_reported_after_three_intervals_and_clears() -> None:
    events = job_on_two_nodes() + telemetry(["node-01", "node-02"], T0 + 10_000, T0 + 100_000)
    events += telemetry(["node-01"], T0 + 100_000, T0 + 200_000)
    events += telemetry(["node-01", "node-02"], T0 + 200_000, T0 + 230_000)
    found = rule(drive(TelemetryMissingDetector(Topology()), events), "telemetry_missing")
    assert found[0].active and found[0].node == "node-02" and found[0].job_id == JOB
    # Last sample at 90 s; silent for more than max(3 x 10 s, 30 s).
    assert T0 + 120_000 < found[0].ts <= T0 + 130_000
    assert [f.active for f in found][-1] is False and found[-1].ts == T0 + 200_000


def test_nodes_of_finished_jobs_and_all_nodes_silent_at_once_are_not_missing() -> None:
    from tests.unit.streams.builders import job_state, step

    events = job_on_two_nodes() + telemetry(["node-01", "node-02"], T0 + 10_000, T0 + 100_000)
    # Every node stops (the input ended) while steps move the watermark on.
    events += [step(JOB, 0, i, T0 + 100_000 + i * 1000) for i in range(1, 200)]
    assert rule(drive(TelemetryMissingDetector(Topology()), events), "telemetry_missing") == []
    ended = [*job_on_two_nodes(), job_state(JOB, T0 + 1, "completed")]
    ended += telemetry(["node-01", "node-02"], T0 + 10_000, T0 + 100_000) + telemetry(
        ["node-01"], T0 + 100_000, T0 + 300_000
    )
    assert rule(drive(TelemetryMissingDetector(Topology()), ended), "telemetry_missing") == []


def test_the_interval_is_learned_from_one_gpus_samples_not_the_ms_between_a_rounds_gpus() -> None:
    """A 15 s agent sampling its 8 GPUs 3 ms apart is held to 3 x 15 s, not to the 30 s floor."""
    events = job_on_two_nodes()
    for ts in range(T0 + 15_000, T0 + 300_000, 15_000):
        for node in ("node-01", "node-02"):
            events += [gpu_sample(node, g, ts + 3 * g) for g in range(8)]
    last = T0 + 285_000  # node-01's last round; node-02 keeps reporting
    for ts in range(T0 + 300_000, T0 + 400_000, 15_000):
        events += [gpu_sample("node-02", g, ts + 3 * g) for g in range(8)]
    found = rule(drive(TelemetryMissingDetector(Topology()), events), "telemetry_missing")
    assert found and found[0].node == "node-01" and found[0].expected == 45.0
    # Silent for more than 45 s (not the 30 s floor) before it is reported.
    assert found[0].ts - (last + 21) > 45_000 and found[0].since == last + 21 + 45_000
