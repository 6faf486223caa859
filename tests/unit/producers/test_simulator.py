"""The cluster simulator: shipped scenarios, determinism, the collective invariant, and each fault's signals."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from functools import cache
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from producers.simulator import FAULTS, Simulation, builtin_scenarios, load_scenario, paced, simulate
from schemas.files import JsonlFormat, parse_ts
from schemas.records import Event

ALERT_RULES = {
    "straggler", "gpu_imbalance", "network_degradation", "rank_hang", "job_stall", "zombie_job",
    "baseline_deviation", "nonfinite_loss", "nonfinite_grad", "loss_divergence", "grad_spike",
    "checkpoint_failed", "checkpoint_stuck", "checkpoint_stale", "foreign_process", "xid_error",
    "ecc_uncorrectable", "gpu_throttling", "gpu_memory_pressure", "host_memory_pressure",
    "telemetry_missing", "restart_loop", "long_pending",
}  # fmt: skip


@cache
def run(name: str, seed: int = 1, minutes: float | None = None) -> tuple[list[Event], list[dict[str, Any]]]:
    """Events and labels of a built-in scenario, cached across tests (pure function of its inputs)."""
    sc = load_scenario(name)
    if minutes is not None:
        sc = sc.with_overrides(duration=minutes * 60)
    sim = simulate(sc, seed)
    return list(sim.events()), sim.labels


_BY_TYPE: dict[int, dict[str, list[dict[str, Any]]]] = {}


def of(events: list[Event], record_type: str, **match: Any) -> list[dict[str, Any]]:
    """Records of one type (in event-time order) whose fields equal `match`."""
    grouped = _BY_TYPE.get(id(events))
    if grouped is None:
        grouped = _BY_TYPE[id(events)] = defaultdict(list)
        for e in events:
            grouped[e.type].append(e.record)
    return [r for r in grouped[record_type] if all(r.get(k) == v for k, v in match.items())]


def window(label: dict[str, Any]) -> tuple[int, int]:
    end = label["end"]
    return parse_ts(label["start"]), (parse_ts(end) if end else 2**62)


def compute(step: dict[str, Any]) -> float:
    return float(step["forward_s"] + step["backward_s"] + step["optimizer_s"])


# --------------------------------------------------------------------------- every scenario


@pytest.mark.parametrize("name", builtin_scenarios())
def test_every_shipped_scenario_loads_and_simulates_in_event_time_order(name: str) -> None:
    events, labels = run(name, minutes=4)
    assert events, name
    stamps = [e.record["ts"] for e in events]
    assert stamps == sorted(stamps)
    assert {"GpuSample", "HostSample", "JobStateChanged"} <= {e.type for e in events}
    for label in labels:
        assert parse_ts(label["start"]) < stamps[0] + 4 * 60_000


def test_each_fault_type_has_a_shipped_scenario_of_its_name_with_a_healthy_phase_first() -> None:
    names = set(builtin_scenarios())
    assert {"healthy", "mixed"} <= names
    for fault in FAULTS:
        assert fault in names, fault
        sc = load_scenario(fault)
        assert [f.type for f in sc.faults] == [fault]
        assert sc.faults[0].start >= 300
        assert 15 * 60 <= sc.duration <= 25 * 60
        end = sc.faults[0].end
        assert end is None or end < sc.duration


def test_a_full_fault_run_labels_the_fault_with_the_catalogue_fields() -> None:
    events, labels = run("straggler_gpu")
    assert len(events) > 30_000
    (label,) = labels
    assert list(label) == [
        "fault", "alert", "also", "job_id", "node", "rank", "gpu_uuid", "gpu_index",
        "start", "end", "layer", "team", "scenario", "detail",
    ]  # fmt: skip
    assert label["alert"] == "straggler" and label["layer"] == "gpu"
    assert label["also"] == ["gpu_throttling", "gpu_imbalance"]
    (bound,) = of(events, "RankBound", rank=5)
    assert (label["node"], label["gpu_uuid"], label["gpu_index"]) == (
        bound["node"],
        bound["gpu_uuid"],
        bound["gpu_index"],
    )
    (started,) = of(events, "JobStarted")
    assert label["team"] == started["team"] and label["job_id"] == started["job_id"]


def test_every_label_names_rules_of_the_catalogue() -> None:
    _, labels = run("mixed")
    assert len(labels) == 5
    for label in labels:
        assert label["alert"] is None or label["alert"] in ALERT_RULES
        assert set(label["also"]) <= ALERT_RULES
        assert label["scenario"] == "mixed"


# --------------------------------------------------------------------------- determinism


def _lines(sim: Simulation) -> list[str]:
    fmt = JsonlFormat()
    return [fmt.to_line(e) for e in sim.events()]


def test_the_same_seed_gives_identical_events_and_another_seed_different_ones() -> None:
    sc = load_scenario("mixed").with_overrides(duration=180)
    first, again, other = _lines(simulate(sc, 7)), _lines(simulate(sc, 7)), _lines(simulate(sc, 8))
    assert first == again
    assert first != other


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(min_value=0, max_value=2**31))
def test_every_rank_of_a_step_ends_together_whatever_the_seed(seed: int) -> None:
    sc = load_scenario("healthy").with_overrides(duration=120)
    steps: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for e in simulate(sc, seed).events():
        if e.type == "StepCompleted":
            steps[e.record["step"]].append(e.record)
    assert steps
    for records in steps.values():
        assert len(records) == 16
        times = [r["step_time_s"] for r in records]
        assert max(times) - min(times) < 0.005
        ends = [r["ts"] for r in records]
        assert max(ends) - min(ends) <= 5
        for r in records:
            parts = r["data_wait_s"] + compute(r) + r["comm_s"] + r["checkpoint_s"]
            assert parts == pytest.approx(r["step_time_s"], abs=1e-4)


# --------------------------------------------------------------------------- stragglers


def test_a_throttled_gpu_makes_its_rank_compute_longer_and_the_others_wait_in_the_collective() -> None:
    events, (label,) = run("straggler_gpu")
    lo, hi = window(label)
    inside = [s for s in of(events, "StepCompleted") if lo + 30_000 <= s["ts"] < hi]
    before = [s for s in of(events, "StepCompleted") if 120_000 + events[0].record["ts"] <= s["ts"] < lo]
    slow = statistics.median(compute(s) for s in inside if s["rank"] == 5)
    peers = statistics.median(compute(s) for s in inside if s["rank"] != 5)
    assert slow / peers == pytest.approx(1.5, rel=0.08)
    assert statistics.median(s["comm_s"] for s in inside if s["rank"] != 5) > 0.3
    assert statistics.median(s["comm_s"] for s in inside if s["rank"] == 5) < 0.2
    assert statistics.median(s["step_time_s"] for s in inside) > 1.3 * statistics.median(
        s["step_time_s"] for s in before
    )


def test_a_thermally_throttled_gpu_reports_low_clocks_high_temperature_and_thermal_bits() -> None:
    events, (label,) = run("straggler_gpu")
    lo, hi = window(label)
    target = [g for g in of(events, "GpuSample", gpu_uuid=label["gpu_uuid"]) if lo <= g["ts"] < hi]
    assert all(g["sm_clock_mhz"] < 0.75 * g["sm_clock_max_mhz"] for g in target)
    assert all(g["clock_event_reasons"] & 0x40 and g["clock_event_reasons"] & 0x20 for g in target)
    assert max(g["temp_gpu_c"] for g in target) > 85
    others = [
        g
        for g in of(events, "GpuSample", node=label["node"])
        if lo <= g["ts"] < hi and g["gpu_uuid"] != label["gpu_uuid"]
    ]
    assert statistics.median(g["sm_clock_mhz"] for g in others) > 0.95 * 1980
    assert not any(g["clock_event_reasons"] & 0x40 for g in others)
    after = [g for g in of(events, "GpuSample", gpu_uuid=label["gpu_uuid"]) if g["ts"] >= hi + 10_000]
    assert after and all(not g["clock_event_reasons"] & 0x40 for g in after)


def test_a_power_braked_gpu_reports_the_power_cap_and_brake_bits_at_its_lowered_limit() -> None:
    events, labels = run("mixed")
    label = next(lb for lb in labels if lb["fault"] == "straggler_gpu")
    lo, hi = window(label)
    target = [g for g in of(events, "GpuSample", gpu_uuid=label["gpu_uuid"]) if lo <= g["ts"] < hi]
    assert target and all(g["clock_event_reasons"] & 0x84 == 0x84 for g in target)
    assert all(g["power_limit_w"] < 700 and g["power_w"] <= g["power_limit_w"] * 1.05 for g in target)


def test_a_slow_data_worker_waits_for_data_and_its_gpu_idles_more_than_its_peers() -> None:
    events, (label,) = run("slow_data_worker", minutes=15)
    lo, hi = window(label)
    assert label["layer"] == "data" and label["rank"] == 11
    inside = [s for s in of(events, "StepCompleted") if lo + 30_000 <= s["ts"] < hi]
    assert statistics.median(s["data_wait_s"] for s in inside if s["rank"] == 11) > 0.35
    assert statistics.median(s["data_wait_s"] for s in inside if s["rank"] != 11) < 0.1
    assert statistics.median(s["comm_s"] for s in inside if s["rank"] != 11) > 0.45
    gpus = [g for g in of(events, "GpuSample", node=label["node"]) if lo + 30_000 <= g["ts"] < hi]
    mine = statistics.median(g["gpu_util_pct"] for g in gpus if g["gpu_uuid"] == label["gpu_uuid"])
    peers = statistics.median(g["gpu_util_pct"] for g in gpus if g["gpu_uuid"] != label["gpu_uuid"])
    assert mine < peers - 15
    loaders = [d for d in of(events, "DataLoaderSample", rank=11) if lo + 30_000 <= d["ts"] < hi]
    assert statistics.median(d["wait_s"] for d in loaders) > 0.4


def test_network_degradation_slows_every_ranks_collective_and_retransmits_on_its_node() -> None:
    events, (label,) = run("network_degradation", minutes=15)
    lo, hi = window(label)
    t0 = events[0].record["ts"]
    steps = of(events, "StepCompleted")
    before = statistics.median(s["comm_s"] for s in steps if t0 + 120_000 <= s["ts"] < lo)
    inside = statistics.median(s["comm_s"] for s in steps if lo + 10_000 <= s["ts"] < hi)
    assert inside / before == pytest.approx(2.0, rel=0.15)
    host = of(events, "HostSample", node=label["node"])
    assert min(h["tcp_retrans_segs_s"] for h in host if lo <= h["ts"] < hi) > 100
    assert max(h["tcp_retrans_segs_s"] for h in host if not lo <= h["ts"] < hi) < 10
    other = [h for h in of(events, "HostSample") if h["node"] != label["node"]]
    assert max(h["tcp_retrans_segs_s"] for h in other) < 10


# --------------------------------------------------------------------------- progress


def test_after_a_rank_hangs_no_rank_completes_a_step_and_the_others_time_out() -> None:
    events, (label,) = run("rank_hang")
    lo, hi = window(label)
    steps = of(events, "StepCompleted")
    assert max(s["ts"] for s in steps) == lo  # the label starts at the last completed step
    timeouts = of(events, "RankFault", kind="collective_timeout")
    assert sorted(f["rank"] for f in timeouts) == [r for r in range(16) if r != label["rank"]]
    assert all(hi <= f["ts"] < hi + 1000 for f in timeouts)
    assert [s["state"] for s in of(events, "JobStateChanged")][-1] == "failed"
    during = [g for g in of(events, "GpuSample") if lo + 10_000 <= g["ts"] < hi]
    assert all(g["gpu_util_pct"] > 90 and g["pids"] for g in during)  # spinning in NCCL
    after = [g for g in of(events, "GpuSample") if g["ts"] > hi + 10_000]
    assert after and not any(g["pids"] for g in after)
    _assert_only_the_hung_rank_is_outside_the_collective(events, label)


def _assert_only_the_hung_rank_is_outside_the_collective(events: list[Event], label: dict[str, Any]) -> None:
    lo, hi = window(label)
    blocked = [c for c in of(events, "CollectiveSample") if lo + 10_000 <= c["ts"] < min(hi, lo + 300_000)]
    assert blocked
    for c in blocked:
        fraction = c["time_s"] / c["interval_s"]
        assert (fraction == 0) if c["rank"] == label["rank"] else (fraction > 0.99), c


def test_a_hang_with_idle_gpus_keeps_the_pids_but_no_activity() -> None:
    events, (label,) = run("rank_hang_idle")
    lo, _ = window(label)
    assert label["end"] is None
    assert max(s["ts"] for s in of(events, "StepCompleted")) == lo
    during = [g for g in of(events, "GpuSample") if g["ts"] > lo + 10_000]
    assert all(g["gpu_util_pct"] == 0 and g["pids"] and g["clock_event_reasons"] & 0x1 for g in during)
    _assert_only_the_hung_rank_is_outside_the_collective(events, label)


def _gpu_of(events: list[Event], label: dict[str, Any], mine: bool, lo: int, hi: int) -> list[dict[str, Any]]:
    """GpuSamples of the hung rank's GPU (mine) or of its peers' on the same node, in [lo, hi)."""
    return [
        g
        for g in of(events, "GpuSample", node=label["node"])
        if lo <= g["ts"] < hi and (g["gpu_uuid"] == label["gpu_uuid"]) is mine and g["pids"]
    ]


def test_a_hung_kernel_holds_its_sms_without_tensor_work_while_the_peers_spin() -> None:
    """GPM (H100): the hung rank's kernel keeps every SM active, no tensor work; the peers' NCCL
    spin keeps a few SMs active; both read 100 % busy (issue 23.5)."""
    events, (label,) = run("rank_hang")
    lo, hi = window(label)
    hung = _gpu_of(events, label, True, lo + 10_000, hi)
    peers = _gpu_of(events, label, False, lo + 10_000, hi)
    assert hung and peers
    assert all(
        g["gpu_util_pct"] > 90 and g["sm_active_pct"] > 80 and g["tensor_active_pct"] == 0 for g in hung
    )
    assert all(
        g["gpu_util_pct"] > 90 and g["sm_active_pct"] < 20 and g["tensor_active_pct"] == 0 for g in peers
    )
    assert min(g["power_w"] for g in hung) > max(g["power_w"] for g in peers)


def test_after_a_hang_in_host_code_the_peers_start_the_next_step_and_the_hung_rank_does_not() -> None:
    """Idle variant: right after the last step the peers' GPUs run the next step's forward and
    backward before they wait; the hung rank's GPU never does; then every GPU is idle."""
    events, (label,) = run("rank_hang_idle")
    lo, _ = window(label)
    first_hung = _gpu_of(events, label, True, lo, lo + 10_000)
    first_peers = _gpu_of(events, label, False, lo, lo + 10_000)
    worked = sum(g["sm_active_pct"] for g in first_hung) / len(first_hung)
    assert all(
        sum(g["sm_active_pct"] for g in first_peers if g["gpu_index"] == i) / 2 - worked >= 20
        for i in {g["gpu_index"] for g in first_peers}
    )


def test_a_job_stall_stops_every_rank_without_an_open_checkpoint_then_resumes() -> None:
    events, (label,) = run("job_stall", minutes=17)
    lo, hi = window(label)
    steps = of(events, "StepCompleted")
    assert not [s for s in steps if lo < s["ts"] < hi]
    assert len([s for s in steps if s["ts"] > hi]) > 16 * 60
    assert max(s["ts"] for s in steps if s["ts"] <= lo) == lo
    ckpts = of(events, "CheckpointEvent")
    open_ids = {c["checkpoint_id"] for c in ckpts if c["phase"] == "started" and c["ts"] <= lo} - {
        c["checkpoint_id"] for c in ckpts if c["phase"] == "completed" and c["ts"] <= lo
    }
    assert not open_ids
    assert label["also"] == ["zombie_job"]
    first_after = min((s for s in steps if s["ts"] > hi), key=lambda s: s["ts"])
    assert first_after["data_wait_s"] > 400  # the step that waited out the stall says so


def test_a_zombie_keeps_its_gpus_with_no_steps_and_no_state_change() -> None:
    events, (label,) = run("zombie", minutes=12)
    lo, _ = window(label)
    assert label["end"] is None
    assert max(s["ts"] for s in of(events, "StepCompleted")) == lo
    assert all(s["ts"] < lo for s in of(events, "JobStateChanged"))
    last = [g for g in of(events, "GpuSample") if g["ts"] > events[-1].record["ts"] - 10_000]
    assert last and all(g["pids"] and g["gpu_util_pct"] == 0 for g in last)
    assert all(g["mem_used_bytes"] > 0.7 * g["mem_total_bytes"] for g in last)


def test_a_long_checkpoint_is_open_across_the_pause_and_completes_within_the_policy() -> None:
    events, (label,) = run("long_checkpoint", minutes=14)
    assert label["alert"] is None
    lo, hi = window(label)
    ckpts = of(events, "CheckpointEvent")
    started = next(c for c in ckpts if c["phase"] == "started" and c["ts"] == lo)
    done = next(
        c for c in ckpts if c["checkpoint_id"] == started["checkpoint_id"] and c["phase"] == "completed"
    )
    assert done["ts"] == hi and done["duration_s"] == pytest.approx(300, abs=1)
    (job,) = of(events, "JobStarted")
    assert done["duration_s"] < job["checkpoint_timeout_s"]
    assert not [s for s in of(events, "StepCompleted") if lo < s["ts"] < hi]
    resumed = min((s for s in of(events, "StepCompleted") if s["ts"] > hi), key=lambda s: s["ts"])
    assert resumed["checkpoint_s"] == pytest.approx(300, abs=1)


def test_a_restart_loop_restarts_with_new_runs_and_rising_restart_counts() -> None:
    events, (label,) = run("restart_loop", minutes=15)
    restarting = of(events, "JobStateChanged", state="restarting")
    assert [s["restart_count"] for s in restarting] == [1, 2, 3, 4]
    assert len(of(events, "RankFault", kind="exit")) == 4
    runs = [s["run_id"] for s in of(events, "JobStarted")]
    assert len(runs) == len(set(runs)) == 5
    assert len(of(events, "CheckpointEvent", phase="restored")) == 4
    assert parse_ts(label["start"]) == of(events, "RankFault", kind="exit")[0]["ts"]
    assert parse_ts(label["end"]) == of(events, "JobStateChanged", state="running")[-1]["ts"]


def test_a_long_pending_job_runs_only_after_the_pending_window() -> None:
    events, (label,) = run("long_pending")
    lo, hi = window(label)
    states = of(events, "JobStateChanged", job_id=label["job_id"])
    assert (states[0]["state"], states[0]["ts"]) == ("pending", lo)
    running = next(s for s in states if s["state"] == "running")
    assert running["ts"] - hi < 100
    assert min(s["ts"] for s in of(events, "StepCompleted", job_id=label["job_id"])) > hi


def test_a_throughput_regression_is_slower_than_the_earlier_runs_of_its_family() -> None:
    events, (label,) = run("throughput_regression")
    jobs = of(events, "JobStarted")
    assert len(jobs) == 4
    keys = {
        (
            j["workload_family"],
            j["model_version"],
            j["gpu_class"],
            tuple(j["nodes"]),
            j["global_batch_size"],
            j["seq_len"],
        )
        for j in jobs
    }
    assert len(keys) == 1
    steps = [s for s in of(events, "StepCompleted") if s["step"] > 30 and s["checkpoint_s"] == 0]
    base = statistics.median(s["step_time_s"] for s in steps if s["job_id"] != label["job_id"])
    slow = statistics.median(s["step_time_s"] for s in steps if s["job_id"] == label["job_id"])
    assert slow / base == pytest.approx(1.3, rel=0.05)
    ends = [s["ts"] for s in of(events, "JobStateChanged", state="completed")]
    assert len(ends) == 3 and max(ends) < parse_ts(label["start"])


# --------------------------------------------------------------------------- model numerics


def test_loss_divergence_trends_the_loss_up_for_minutes() -> None:
    events, (label,) = run("loss_divergence")
    lo, _ = window(label)
    losses = [(s["ts"], s["loss"]) for s in of(events, "StepCompleted", rank=0)]
    before = statistics.mean(v for t, v in losses if lo - 120_000 <= t < lo)
    last = statistics.mean(v for t, v in losses[-60:])
    assert last > before + 2.0
    healthy, _ = run("healthy")
    h = [s["loss"] for s in of(healthy, "StepCompleted", rank=0)]
    assert statistics.mean(h[-60:]) < statistics.mean(h[100:160])


def test_nonfinite_loss_and_gradients_appear_only_inside_their_windows() -> None:
    for name, field, expect_skip in (("nan_loss", "loss", True), ("nan_grad", "grad_norm", True)):
        events, (label,) = run(name, minutes=10)
        lo, hi = window(label)
        steps = of(events, "StepCompleted")
        bad = [s for s in steps if not math.isfinite(s[field])]
        assert bad and all(lo <= s["ts"] <= hi + 5_000 for s in bad)
        assert all(s["skipped"] is expect_skip for s in bad)
        assert all(
            math.isfinite(s["loss"]) and math.isfinite(s["grad_norm"]) for s in steps if s["ts"] > hi + 5_000
        )
        if name == "nan_grad":
            assert all(math.isfinite(s["loss"]) for s in bad)


def test_a_gradient_spike_jumps_the_norm_for_a_few_steps() -> None:
    events, (label,) = run("grad_spike", minutes=10)
    lo, hi = window(label)
    rank0 = of(events, "StepCompleted", rank=0)
    normal = statistics.median(s["grad_norm"] for s in rank0 if lo - 120_000 <= s["ts"] < lo)
    spiked = [s for s in rank0 if s["grad_norm"] > 20 * normal]
    assert 2 <= len(spiked) <= 6
    assert all(lo <= s["ts"] <= hi + 2_000 for s in spiked)


# --------------------------------------------------------------------------- checkpoints


def test_failing_checkpoints_report_failed_with_the_error_and_later_ones_succeed() -> None:
    events, (label,) = run("checkpoint_failure")
    lo, hi = window(label)
    failed = of(events, "CheckpointEvent", phase="failed")
    assert len(failed) == 3 and all(lo <= c["ts"] <= hi and "quota" in c["error"] for c in failed)
    later = [c for c in of(events, "CheckpointEvent", phase="verified") if c["ts"] > hi]
    assert later
    assert "checkpoint_stale" in label["also"]


def test_a_checkpoint_that_never_completes_stays_open_while_steps_continue() -> None:
    events, (label,) = run("checkpoint_never_completes")
    lo, hi = window(label)
    ckpts = of(events, "CheckpointEvent")
    stuck = next(c for c in ckpts if c["phase"] == "started" and c["ts"] == lo)
    phases = [c["phase"] for c in ckpts if c["checkpoint_id"] == stuck["checkpoint_id"]]
    assert phases == ["started", "failed"]
    assert not [c for c in ckpts if c["phase"] == "started" and lo < c["ts"] < hi]
    assert len([s for s in of(events, "StepCompleted", rank=0) if lo < s["ts"] < hi]) > 300
    assert hi - lo > 5 * 60_000  # longer than the job's checkpoint_timeout_s


# --------------------------------------------------------------------------- infrastructure


def test_an_xid_is_reported_once_on_its_gpu_at_the_labelled_moment() -> None:
    events, (label,) = run("xid_error", minutes=10)
    xids = [g for g in of(events, "GpuSample") if g["xid"] is not None]
    assert [(g["gpu_uuid"], g["xid"], g["ts"]) for g in xids] == [
        (label["gpu_uuid"], 79, parse_ts(label["start"]))
    ]


def test_an_uncorrectable_ecc_error_increments_only_its_gpus_counter() -> None:
    events, (label,) = run("ecc_uncorrectable", minutes=10)
    lo, _ = window(label)
    samples = of(events, "GpuSample")
    assert all(
        g["ecc_uncorrected"] == 0 for g in samples if g["ts"] < lo or g["gpu_uuid"] != label["gpu_uuid"]
    )
    after = [g for g in samples if g["gpu_uuid"] == label["gpu_uuid"] and g["ts"] >= lo]
    assert all(g["ecc_uncorrected"] == 1 and g["remapped_rows_uncorrectable"] == 1 for g in after)
    assert [g["xid"] for g in after if g["xid"] is not None] == [48]


def test_gpu_memory_pressure_holds_the_device_above_97_percent_only_in_its_window() -> None:
    events, (label,) = run("gpu_memory_pressure", minutes=15)
    lo, hi = window(label)
    mine = of(events, "GpuSample", gpu_uuid=label["gpu_uuid"])
    assert all(g["mem_used_bytes"] > 0.97 * g["mem_total_bytes"] for g in mine if lo <= g["ts"] < hi)
    assert all(g["mem_used_bytes"] < 0.9 * g["mem_total_bytes"] for g in mine if not lo <= g["ts"] < hi)


def test_host_oom_exhausts_memory_and_counts_oom_kills_on_its_node() -> None:
    events, (label,) = run("host_oom", minutes=14)
    lo, hi = window(label)
    host = of(events, "HostSample", node=label["node"])
    inside = [h for h in host if lo <= h["ts"] < hi]
    assert all(h["mem_available_bytes"] < 0.02 * h["mem_total_bytes"] for h in inside)
    assert max(h["swap_used_bytes"] for h in inside) > 2 * 1024**3
    before = [h["oom_kills"] for h in host if h["ts"] < lo]
    assert host[-1]["oom_kills"] - before[-1] == 2
    assert all(h["mem_available_bytes"] > 0.5 * h["mem_total_bytes"] for h in host if h["ts"] < lo)


def test_a_silent_agent_sends_nothing_while_its_ranks_keep_stepping() -> None:
    events, (label,) = run("agent_silent", minutes=14)
    lo, hi = window(label)
    node = label["node"]
    telemetry = [
        e.record for e in events if e.type in ("GpuSample", "HostSample") and e.record["node"] == node
    ]
    assert not [r for r in telemetry if lo < r["ts"] < hi]
    assert max(r["ts"] for r in telemetry if r["ts"] <= lo) == lo
    assert min(r["ts"] for r in telemetry if r["ts"] > lo) == hi
    ranks = {b["rank"] for b in of(events, "RankBound", node=node)}
    assert len({s["rank"] for s in of(events, "StepCompleted") if lo < s["ts"] < hi} & ranks) == 8
    other = [r for r in of(events, "HostSample") if r["node"] != node and lo < r["ts"] < hi]
    assert len(other) > 100


def test_a_foreign_process_shows_on_the_gpu_only_during_its_window() -> None:
    events, (label,) = run("foreign_process", minutes=14)
    lo, hi = window(label)
    own = {b["pid"] for b in of(events, "RankBound")}
    mine = of(events, "GpuSample", gpu_uuid=label["gpu_uuid"])
    inside = [g for g in mine if lo <= g["ts"] < hi]
    assert inside and all(set(g["pids"]) - own == {label["detail"]["pid"]} for g in inside)
    assert all(set(g["pids"]) <= own for g in mine if not lo <= g["ts"] < hi)
    others = [g for g in of(events, "GpuSample") if g["gpu_uuid"] != label["gpu_uuid"]]
    assert all(set(g["pids"]) <= own for g in others)


# --------------------------------------------------------------------------- healthy data


def test_a_healthy_job_evaluates_checkpoints_and_verifies_every_checkpoint() -> None:
    events, labels = run("healthy")
    assert labels == []
    assert len(of(events, "ValidationResult")) >= 2
    ckpts = of(events, "CheckpointEvent")
    started = {c["checkpoint_id"] for c in ckpts if c["phase"] == "started"}
    assert started and started == {c["checkpoint_id"] for c in ckpts if c["phase"] == "verified"}
    assert all(c["checksum"] and c["bytes"] for c in ckpts if c["phase"] == "verified")
    samples = [g for g in of(events, "GpuSample") if g["pids"]]
    throttled = [g for g in samples if g["clock_event_reasons"] & ~0x5]
    assert not throttled
    assert len(events) > 40_000


def test_paced_replay_waits_in_proportion_to_event_time_over_the_speed() -> None:
    now = [100.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(round(s, 6))
        now[0] += s

    events = [Event("HostSample", {"ts": t}) for t in (0, 1000, 1000, 11_000)]
    out = list(paced(events, 10.0, clock=lambda: now[0], sleep=sleep))
    assert out == events
    assert slept == [0.1, 1.0]


def test_every_value_stays_physical_and_steps_count_up_by_one_per_run_and_rank() -> None:
    events, _ = run("mixed")
    for g in of(events, "GpuSample"):
        assert 0 <= g["gpu_util_pct"] <= 100
        assert 0 < g["power_w"] <= g["power_limit_w"]
        assert 20 < g["temp_gpu_c"] < 100
        assert 0 < g["mem_used_bytes"] <= g["mem_total_bytes"]
        assert g["sm_clock_mhz"] <= g["sm_clock_max_mhz"]
    for h in of(events, "HostSample"):
        assert 0 < h["mem_available_bytes"] < h["mem_total_bytes"]
        assert 0 <= h["cpu_util_pct"] <= 100
    last: dict[tuple[str, int], int] = {}
    for s in of(events, "StepCompleted"):
        segments = ("data_wait_s", "forward_s", "backward_s", "optimizer_s", "comm_s", "checkpoint_s")
        assert all(s[k] >= 0 for k in segments)
        key = (s["run_id"], s["rank"])
        assert s["step"] == last.get(key, s["step"] - 1) + 1
        last[key] = s["step"]
