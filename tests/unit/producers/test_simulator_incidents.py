"""Simulator features for real incidents (issue 10.6): ramps, per-rank noise, co-location,
evaluation start events, unverified checkpoints, InfiniBand counters, and the case generator."""

from __future__ import annotations

import itertools
import statistics
from typing import Any

import pytest

from producers.simulator import FAULTS, ScenarioError, load_scenario, simulate
from producers.simulator.generator import GENERATED_FAULTS, generate, generate_mappings
from producers.simulator.scenario import GPU_CLASSES, scenario_from_mapping
from schemas.files import parse_ts
from schemas.records import Event

T0 = parse_ts("2026-01-01T00:00:00Z")


def _scenario(jobs: list[dict[str, Any]], faults: list[dict[str, Any]] | None = None, **top: Any) -> Any:
    data = {
        "name": "t",
        "duration": top.pop("duration", "6m"),
        "cluster": {"name": "t", "nodes": 2, "gpus_per_node": 4},
        "telemetry": {"interval": "5s", "dataloader_samples": False, "collective_samples": False},
        "jobs": jobs,
        "faults": faults or [],
        **top,
    }
    return scenario_from_mapping(data, "t.yaml")


def _job(**over: Any) -> dict[str, Any]:
    return {"id": "j1", "team": "a", "nodes": 1, "gpus_per_node": 4, "init_time": 5, **over}


def _events(sc: Any, seed: int = 0) -> tuple[list[Event], list[dict[str, Any]]]:
    sim = simulate(sc, seed)
    return list(sim.events()), sim.labels


def _compute_by_rank(events: list[Event], lo_s: float = 0, hi_s: float = 1e9) -> dict[int, list[float]]:
    out: dict[int, list[float]] = {}
    for e in events:
        r = e.record
        if e.type == "StepCompleted" and lo_s * 1000 <= r["ts"] - T0 < hi_s * 1000:
            out.setdefault(r["rank"], []).append(r["forward_s"] + r["backward_s"] + r["optimizer_s"])
    return out


def test_a_ramped_straggler_slows_gradually_to_its_magnitude() -> None:
    """ramp: 1.0x at the start, the full factor only after the ramp."""
    sc = _scenario(
        [_job(step_noise=0.0)],
        [
            {
                "type": "straggler_gpu",
                "job": "j1",
                "rank": 2,
                "start": 60,
                "duration": 240,
                "magnitude": 1.6,
                "ramp": 120,
            }
        ],
    )
    events, _ = _events(sc)

    def ratio(lo: float, hi: float) -> float:
        c = _compute_by_rank(events, lo, hi)
        return statistics.median(c[2]) / statistics.median(c[0])

    early, middle, late = ratio(62, 80), ratio(110, 130), ratio(200, 290)
    assert early < 1.15 < middle < 1.45 < late
    assert late == pytest.approx(1.6, rel=0.05)


def test_persistently_slow_ranks_and_per_rank_jitter_show_in_the_steps() -> None:
    sc = _scenario([_job(step_noise=0.01, rank_jitter=0.05, slow_ranks={1: 1.05})])
    c = _compute_by_rank(_events(sc)[0], 60)
    assert statistics.median(c[1]) / statistics.median(c[0]) == pytest.approx(1.05, rel=0.02)
    spread = {r: statistics.stdev(v) / statistics.mean(v) for r, v in c.items()}
    assert min(spread.values()) > 0.015  # each rank jitters on its own, beyond the shared noise
    assert max(spread.values()) / min(spread.values()) > 1.2  # ...and each by its own amount


def test_a_scenario_without_the_new_knobs_keeps_its_exact_output() -> None:
    """Rank noise is drawn from its own stream only when asked: old scenarios replay unchanged."""
    plain = _events(_scenario([_job()]))[0]
    explicit = _events(_scenario([_job(rank_jitter=0.0, rank_speed_spread=0.0, slow_ranks={})]))[0]
    assert plain == explicit


def test_two_jobs_split_one_node_and_a_node_fault_is_labelled_for_both_teams() -> None:
    """Co-location: disjoint GPU ranges on node-01; an ECC error there reaches both jobs' teams."""
    sc = _scenario(
        [
            _job(id="a", team="vision", nodes=["node-01"], gpus_per_node=2, gpu_offset=0),
            _job(id="b", team="speech", nodes=["node-01"], gpus_per_node=2, gpu_offset=2),
        ],
        [{"type": "ecc_uncorrectable", "job": "a", "node": "node-01", "gpu": 1, "start": 120}],
    )
    events, labels = _events(sc)
    bound = {(r.record["job_id"], r.record["gpu_index"]) for r in events if r.type == "RankBound"}
    assert bound == {("a", 0), ("a", 1), ("b", 2), ("b", 3)}
    assert [(lab["job_id"], lab["team"], lab["alert"]) for lab in labels] == [
        ("a", "vision", "ecc_uncorrectable"),
        ("b", "speech", "ecc_uncorrectable"),
    ]
    assert labels[0]["gpu_index"] == 1 and labels[1]["gpu_uuid"] is None and labels[1]["node"] == "node-01"


def test_overlapping_gpus_on_a_shared_node_are_rejected_with_the_key() -> None:
    with pytest.raises(ScenarioError, match=r"jobs\[1\]\.nodes: .*already used by job a.*gpu_offset"):
        _scenario(
            [
                _job(id="a", nodes=["node-01"], gpus_per_node=2),
                _job(id="b", nodes=["node-01"], gpus_per_node=2, gpu_offset=1),
            ]
        )
    with pytest.raises(ScenarioError, match=r"jobs\[0\]\.gpu_offset: GPUs 3\.\.4 do not fit"):
        _scenario([_job(gpus_per_node=2, gpu_offset=3)])
    with pytest.raises(
        ScenarioError, match=r"jobs\[0\]\.slow_ranks: rank 4 is not a rank of this job \(0\.\.3\)"
    ):
        _scenario([_job(slow_ranks={4: 1.1})])


@pytest.mark.parametrize("with_events", [True, False])
def test_evaluations_send_start_and_completion_events_unless_switched_off(with_events: bool) -> None:
    sc = _scenario(
        [_job(evaluation={"every_steps": 50, "duration": "40s"}, step_time=1.0)],
        telemetry={"interval": "5s", "evaluation_events": with_events},
    )
    events, _ = _events(sc)
    evals = [e.record for e in events if e.type == "EvaluationEvent"]
    results = [e.record for e in events if e.type == "ValidationResult"]
    assert results
    if not with_events:
        assert evals == []
        return
    assert [e["phase"] for e in evals[:2]] == ["started", "completed"]
    started, completed = evals[0], evals[1]
    assert started["evaluation_id"] == completed["evaluation_id"] and started["step"] == results[0]["step"]
    assert started["expected_duration_s"] == 40.0
    assert completed["ts"] < results[0]["ts"] and completed["ts"] - started["ts"] == pytest.approx(
        results[0]["duration_s"] * 1000, abs=5
    )
    # No step completes while an evaluation is open.
    steps = [e.record["ts"] for e in events if e.type == "StepCompleted"]
    assert not [t for t in steps if started["ts"] < t < completed["ts"]]


def test_an_evaluation_running_at_the_end_of_the_recording_reports_no_end() -> None:
    """Its result would come minutes after every other stream stopped: the recording ends first."""
    sc = _scenario([_job(evaluation={"every_steps": 100, "duration": "150s"}, step_time=1.0)], duration="3m")
    events, _ = _events(sc)
    phases = [e.record["phase"] for e in events if e.type == "EvaluationEvent"]
    assert phases == ["started"]
    assert not [e for e in events if e.type == "ValidationResult"]
    assert max(e.record["ts"] for e in events) <= T0 + 180_000 + 10_000  # the last step and sample


def test_unverified_checkpoints_complete_without_a_verification_and_are_labelled_stale() -> None:
    sc = _scenario(
        [_job(checkpoint={"every": "1m", "duration": "5s", "max_age": "3m"})],
        [{"type": "checkpoint_unverified", "job": "j1", "start": 150}],
    )
    events, labels = _events(sc)
    phases = [(e.record["ts"] - T0, e.record["phase"]) for e in events if e.type == "CheckpointEvent"]
    verified = [t for t, p in phases if p == "verified"]
    completed = [t for t, p in phases if p == "completed"]
    assert verified and max(verified) < 150_000 < max(completed)
    (label,) = labels
    assert label["alert"] == "checkpoint_stale"
    assert parse_ts(label["start"]) - T0 == max(verified)  # the age counts from the last verification


def test_hosts_report_infiniband_counters_and_an_ib_fault_degrades_one_node() -> None:
    sc = _scenario(
        [_job(nodes=2)],
        [
            {
                "type": "ib_degradation",
                "job": "j1",
                "node": "node-02",
                "start": 150,
                "duration": 120,
                "magnitude": 2.5,
            }
        ],
    )
    events, labels = _events(sc)
    hosts = [e.record for e in events if e.type == "HostSample"]

    def rx(node: str, lo: float, hi: float) -> float:
        return statistics.median(
            h["ib_rx_bytes_s"] for h in hosts if h["node"] == node and lo * 1000 <= h["ts"] - T0 < hi * 1000
        )

    assert all(h["ib_rx_bytes_s"] is not None and h["ib_errors"] is not None for h in hosts)
    degraded = rx("node-02", 160, 260) / rx("node-02", 60, 140)
    healthy = rx("node-01", 160, 260) / rx("node-01", 60, 140)
    assert degraded < 0.85 < 0.95 < healthy  # the faulty port moves less; its peer waits, not slower
    # Increments per interval, as the contract and the agent have them: errors only during the fault.
    errors = {h["ts"] - T0: h["ib_errors"] for h in hosts if h["node"] == "node-02"}
    assert all(n >= 0 for n in errors.values())
    assert sum(n for t, n in errors.items() if 150_000 <= t < 270_000) > 0
    assert all(n == 0 for t, n in errors.items() if t < 150_000 or t >= 271_000)
    assert all(h["ib_errors"] == 0 for h in hosts if h["node"] == "node-01")
    assert labels[0]["alert"] == "network_degradation" and labels[0]["node"] == "node-02"


def test_the_generator_is_a_pure_function_of_its_seed() -> None:
    assert generate_mappings(12, 7) == generate_mappings(12, 7)
    assert generate_mappings(12, 7) != generate_mappings(12, 8)


def _class(name: str) -> str:
    return name.split("-", 3)[3].removesuffix("-twin")


def test_generated_cases_pair_each_fault_with_a_must_not_alert_twin_and_cover_the_catalogue() -> None:
    cases = generate(300, 0)
    classes = set()
    for fault_case, twin in zip(cases[::2], cases[1::2], strict=True):
        assert twin.name == fault_case.name.replace(fault_case.name[:11], twin.name[:11]) + "-twin"
        assert [j.id for j in twin.jobs] == [j.id for j in fault_case.jobs]
        cls = _class(fault_case.name)
        classes.add(cls)
        if cls in ("boundaries", "startup_gap", "checkpoint_in_step", "agent_pace"):
            assert fault_case.faults == twin.faults == ()  # healthy runs: both must stay quiet
        else:
            (fault,) = fault_case.faults
            assert FAULTS[fault.type].alert is not None
        assert all(FAULTS[f.type].alert is None for f in twin.faults)  # nothing that should alert
    assert classes == set(GENERATED_FAULTS)
    assert any(
        len({n for j in c.jobs for n in j.nodes if n == "node-01"}) and len(c.jobs) == 2 for c in cases
    )


def test_issue_33_shapes_start_up_gaps_late_watchdogs_checkpoints_in_steps_and_agent_paces() -> None:
    """Start-up of 60-240 s (twin 20-40 s), a hang whose watchdog times out 600 s later (twin: a long
    checkpoint), 90 s checkpoints of 20-45 s on 4-6 s steps, agents every 3 s (twin every 30 s), a
    GPU 1.2-1.35x slow from the start under DDP with no throttle sign (twin: 2-4 % slower)."""
    seen = set()
    for m in generate_mappings(4 * 2 * len(GENERATED_FAULTS), 0):
        cls, twin, job = _class(m["name"]), m["name"].endswith("-twin"), m["jobs"][0]
        seen.add(cls)
        if cls == "startup_gap":
            assert (20 <= job["init_time"] <= 40) if twin else (60 <= job["init_time"] <= 240)
        elif cls == "late_watchdog":
            if twin:
                assert [f["type"] for f in m["faults"]] == ["long_checkpoint"]
            else:
                (hang,) = m["faults"]
                assert hang["type"] == "rank_hang" and hang["duration"] == 600
                assert m["duration"] >= hang["start"] + 600 + 60  # the timeouts are in the recording
        elif cls == "checkpoint_in_step":
            assert job["checkpoint"]["every"] == "90s" and 4.0 <= job["step_time"] <= 6.0
        elif cls == "agent_pace":
            assert m["telemetry"]["interval"] == ("30s" if twin else "3s")
        elif cls == "ddp_static":
            assert job["comm_overlap"] is True
            if twin:
                assert m["faults"] == [] and 1.02 <= next(iter(job["slow_ranks"].values())) <= 1.04
            else:
                (slow,) = m["faults"]
                assert (
                    slow["start"] == 0 and slow["variant"] == "degraded" and 1.2 <= slow["magnitude"] <= 1.35
                )
    assert {"startup_gap", "late_watchdog", "checkpoint_in_step", "agent_pace", "ddp_static"} <= seen


def test_every_cycle_of_pairs_covers_every_class_once() -> None:
    per_cycle = 2 * len(GENERATED_FAULTS)
    cases = generate_mappings(3 * per_cycle, 4)
    for k in range(3):
        cycle = cases[k * per_cycle : (k + 1) * per_cycle : 2]
        assert sorted(_class(c["name"]) for c in cycle) == sorted(GENERATED_FAULTS)


def test_generated_jobs_span_8_to_1024_ranks_and_network_faults_2_to_128_nodes_as_steps_and_ramps() -> None:
    cases = generate_mappings(1000, 0)
    worlds = [len(j["nodes"]) * j["gpus_per_node"] for c in cases for j in c["jobs"][:1]]
    assert min(worlds) == 8 and max(worlds) == 1024 and {16, 32, 64, 128, 256, 1000} <= set(worlds)
    network = [c for c in cases[::2] if _class(c["name"]) in ("network_degradation", "ib_degradation")]
    nodes = {len(c["jobs"][0]["nodes"]) for c in network}
    assert {2, 4, 8, 16, 32, 64, 128} <= nodes
    ramps = {bool(c["faults"][0]["ramp"]) for c in network}
    assert ramps == {True, False}
    for c in network:  # one node of the job, the job's own
        assert c["faults"][0]["node"] in c["jobs"][0]["nodes"]
    # Throttled stragglers of 1.25-1.9x, and GPUs 1.2-1.35x slow from the start under DDP (ddp_static).
    stragglers = [
        c["faults"][0] for c in cases[::2] if c["faults"] and c["faults"][0]["type"] == "straggler_gpu"
    ]
    assert min(f["magnitude"] for f in stragglers) < 1.3 and all(f["magnitude"] >= 1.2 for f in stragglers)


def test_stalls_are_15_to_30_step_times_and_their_twins_5_to_10() -> None:
    cases = generate_mappings(8 * 2 * len(GENERATED_FAULTS), 0)  # eight cycles of classes
    pairs = [
        (a, b) for a, b in zip(cases[::2], cases[1::2], strict=True) if _class(a["name"]) == "stall_steps"
    ]
    assert len(pairs) >= 8
    for stall, blip in pairs:
        step = stall["jobs"][0]["step_time"]
        (f,), (g,) = stall["faults"], blip["faults"]
        assert f["type"] == "job_stall" and 15 <= round(f["duration"] / step) <= 30 and f["duration"] >= 90
        assert g["type"] == "stall_blip" and 5 <= round(g["duration"] / step) <= 10 and g["duration"] <= 42
        # The run has six minutes of throughput history first; the case outlasts the stall by 5.
        assert f["start"] >= 400 and stall["duration"] > f["start"] + f["duration"] + 299


def test_ecc_on_a_shared_node_comes_with_and_without_xid_and_its_twin_corrects_errors() -> None:
    cases = generate_mappings(8 * 2 * len(GENERATED_FAULTS), 0)  # eight cycles of classes
    pairs = [
        (a, b) for a, b in zip(cases[::2], cases[1::2], strict=True) if _class(a["name"]) == "ecc_shared"
    ]
    assert {p[0]["faults"][0]["xid"] for p in pairs} == {48, None}
    for ecc, twin in pairs:
        assert (
            len(ecc["jobs"]) == 2 and ecc["faults"][0]["node"] in ecc["jobs"][1]["nodes"]
        )  # the shared node
        assert twin["faults"][0]["type"] == "ecc_correctable"


def test_simulated_hangs_fall_before_or_after_the_first_evaluation_and_stops_after_the_first_or_second() -> (
    None
):
    """What the generator promises, read back from the simulated data."""
    per_cycle = 2 * len(GENERATED_FAULTS)
    cases = generate(4 * per_cycle, 0)
    seen_hangs, seen_stops = set(), set()
    for sc in cases[::2]:
        cls = _class(sc.name)
        if cls not in ("rank_hang", "validation_stop"):
            continue
        sim = simulate(sc.with_overrides(duration=min(sc.duration, 330.0)), 0)
        events = list(sim.events())
        (label,) = sim.labels
        start = parse_ts(label["start"])
        evaluated = [
            e.record["ts"] for e in events if e.type == "ValidationResult" and e.record["ts"] < start
        ]
        if cls == "rank_hang":
            before = "before the first evaluation" in sc.description
            assert (evaluated == []) == before, sc.name
            busy = sc.faults[0].params["gpus"] == "busy"
            seen_hangs.add((busy, before))
        else:
            after = 1 if "after evaluation 1" in sc.description else 2
            assert len(evaluated) == after, (sc.name, evaluated)
            seen_stops.add(after)
    assert seen_hangs == {(True, True), (True, False), (False, True), (False, False)}
    assert seen_stops == {1, 2}


def test_a_short_stall_and_corrected_ecc_errors_show_in_the_data_and_label_no_alert() -> None:
    events, labels = _events(load_scenario("stall_blip").with_overrides(duration=600.0))
    steps = sorted({e.record["ts"] for e in events if e.type == "StepCompleted" and e.record["rank"] == 0})
    gaps = [b - a for a, b in itertools.pairwise(steps)]
    assert 30_000 <= max(gaps) <= 40_000  # 32 s of silence in steps of 4 s
    assert [lab["alert"] for lab in labels] == [None]
    events, labels = _events(load_scenario("ecc_correctable").with_overrides(duration=600.0))
    corrected = {
        e.record["ts"] - T0: e.record["ecc_corrected"]
        for e in events
        if e.type == "GpuSample" and e.record["node"] == "node-01" and e.record["gpu_index"] == 2
    }
    before = max(t for t in corrected if t < 480_000)
    after = min(t for t in corrected if t > 480_000)
    assert corrected[after] - corrected[before] >= 4  # the fault's 4 (plus, rarely, a background one)
    assert all(e.record["ecc_uncorrected"] in (0, None) for e in events if e.type == "GpuSample") and [
        lab["alert"] for lab in labels
    ] == [None]


def test_workload_mix_puts_one_family_on_two_gpu_classes_and_two_layouts() -> None:
    """Issue 35.6: both jobs share a workload family, the second runs TP=8 on nodes of another GPU
    class; the fault case hits one of them, the twin has none; the simulator names each node's class."""
    cases = [
        m for m in generate_mappings(6 * 2 * len(GENERATED_FAULTS), 0) if _class(m["name"]) == "workload_mix"
    ]
    assert len(cases) == 12
    kinds = set()
    for m in cases:
        first, second = m["jobs"]
        assert first["workload_family"] == second["workload_family"]
        assert second["tensor_parallel"] == 8 and "tensor_parallel" not in first
        classes = m["cluster"]["gpu_classes"]
        assert set(classes) == set(second["nodes"]) and m["cluster"]["gpu_class"] not in classes.values()
        assert m["cluster"]["nodes"] == len(first["nodes"]) + len(second["nodes"])
        if m["name"].endswith("-twin"):
            assert m["faults"] == []
        else:
            (fault,) = m["faults"]
            kinds.add((fault["type"], fault["job"] == second["id"]))
    assert {k for k, _ in kinds} == {"straggler_gpu", "gpu_memory_pressure", "slow_data_worker"}
    assert {on_second for _, on_second in kinds} == {True, False}
    twin = scenario_from_mapping({**cases[1], "duration": 60}, "mix.yaml")
    events = list(simulate(twin, 0).events())
    started = {e.record["job_id"]: e.record for e in events if e.type == "JobStarted"}
    first, second = cases[1]["jobs"]
    assert started[first["id"]]["gpu_class"] == cases[1]["cluster"]["gpu_class"]
    other = cases[1]["cluster"]["gpu_classes"][second["nodes"][0]]
    assert (started[second["id"]]["gpu_class"], started[second["id"]]["tensor_parallel"]) == (other, 8)
    names = {(e.record["node"], e.record["gpu_name"]) for e in events if e.type == "GpuSample"}
    assert {g for n, g in names if n in second["nodes"]} == {GPU_CLASSES[other].product}
    assert {g for n, g in names if n in first["nodes"]} == {
        GPU_CLASSES[cases[1]["cluster"]["gpu_class"]].product
    }


def test_a_mixed_cluster_names_known_nodes_and_classes() -> None:
    base = {
        "name": "m",
        "duration": "1m",
        "cluster": {"nodes": 2},
        "jobs": [{"id": "j", "nodes": ["node-01"]}],
    }
    with pytest.raises(ScenarioError, match="no such node"):
        scenario_from_mapping({**base, "cluster": {"nodes": 2, "gpu_classes": {"node-09": "A100-80GB"}}})
    with pytest.raises(ScenarioError, match="unknown GPU class"):
        scenario_from_mapping({**base, "cluster": {"nodes": 2, "gpu_classes": {"node-02": "T4"}}})
