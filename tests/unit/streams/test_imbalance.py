"""Rank imbalance: stragglers after N low windows, the suspected layer, GPU imbalance, network, window stats."""

from __future__ import annotations

import json
from typing import Any

from schemas.records import Event
from streams.detectors.base import Finding, Topology
from streams.detectors.imbalance import ImbalanceDetector
from tests.unit.streams.builders import T0, gpu_sample, host_sample, job_started, job_state, rank_bound, step
from tests.unit.streams.stages import job_stage_input

RANKS = 8


def _job(
    seconds: int,
    fault: dict[str, Any] | None = None,
    *,
    fault_from: int = 0,
    gpus: bool = False,
    comm_extra: float = 0.0,
    retrans_node: str | None = None,
) -> list[Event]:
    """A 1-node, 8-rank job stepping once a second; `fault` overrides step fields of rank 3 from `fault_from` s.

    Synchronous, as data-parallel training is: when rank 3 is busier than its peers they wait for
    it in the collective (their `comm_s` and everyone's step time grow by its extra busy time).
    """
    events = [job_started("job-1", T0, world_size=RANKS, nodes=1), job_state("job-1", T0, "running")]
    events += [rank_bound("job-1", r, T0) for r in range(RANKS)]
    for i in range(1, seconds + 1):
        ts = T0 + i * 1000
        faulty = fault is not None and i >= fault_from
        comm = 0.12 + (comm_extra if i >= fault_from else 0.0)
        slow: dict[str, Any] = dict(fault or {}) if faulty else {}
        compute, wait = slow.get("compute", 0.85), slow.get("data_wait", 0.03)
        busy = compute + wait if compute is not None and wait is not None else slow.get("step_time", 0.88)
        extra = max(0.0, busy - 0.88)
        for r in range(RANKS):
            kw: dict[str, Any] = {"comm": comm + extra, "step_time": 1.0 + extra}
            if r == 3 and slow:
                kw = {"comm": comm, "step_time": 1.0 + extra, **slow}
            events.append(step("job-1", r, i, ts, **kw))
        if gpus and i % 5 == 0:
            for g in range(RANKS):
                slow = faulty and g == 3
                events.append(
                    gpu_sample(
                        "node-01",
                        g,
                        ts,
                        util=60.0 if slow else 95.0,
                        power=400.0 if slow else 600.0,
                        sm_clock=1300 if slow else 1980,
                        throttle=0x40 if slow else 0,
                    )
                )
        if retrans_node and i % 5 == 0:
            events.append(host_sample(retrans_node, ts, retrans=900.0 if i >= fault_from else 1.0))
            events.append(host_sample("node-other", ts, retrans=1.0))
    return events


def _run(
    events: list[Event], params: dict[str, object] | None = None
) -> tuple[ImbalanceDetector, list[Finding], list[Event]]:
    topo = Topology()
    det = ImbalanceDetector(topo, params)
    findings: list[Finding] = []
    derived: list[Event] = []
    last = None
    for e in job_stage_input(events):
        topo.observe(e)
        findings += det.observe(e)
        second = e.record["ts"] // 1000
        if second != last:
            findings += det.advance(e.record["ts"] - 5000)
            derived += det.drain_derived()
            last = second
    return det, findings, derived


def _active(findings: list[Finding], rule: str) -> list[Finding]:
    return [f for f in findings if f.rule == rule and f.active]


def test_a_straggler_is_flagged_on_its_third_low_bucket_and_not_before() -> None:
    slow = {"compute": 0.85 * 1.6}
    _, findings, _ = _run(_job(150, slow, fault_from=100))
    flagged = _active(findings, "straggler")
    assert flagged and {f.rank for f in flagged} == {3}
    # Buckets of 5 s: 100-105, 105-110 and 110-115 are low; the third one's end flags it.
    assert min(f.ts for f in flagged) == T0 + 115_000
    assert flagged[0].since == T0 + 100_000
    assert (
        flagged[0].suspected_layer == "gpu" and flagged[0].observed is not None and flagged[0].observed < 0.75
    )


def test_two_low_buckets_are_not_a_straggler() -> None:
    # Slow only between 150 s and 160 s: two buckets, one short of `straggler_buckets` and of the
    # CUSUM's minimum evidence.
    events = [e for e in _job(300)]
    for e in events:
        r = e.record
        if e.type == "StepCompleted" and r["rank"] == 3 and 150 <= (r["ts"] - T0) // 1000 < 160:
            r["forward_s"] *= 2
            r["backward_s"] *= 2
    _, findings, _ = _run(events)
    assert _active(findings, "straggler") == []


def test_the_suspected_layer_is_data_when_the_ranks_data_wait_grew() -> None:
    _, findings, _ = _run(_job(150, {"data_wait": 0.6}, fault_from=1))
    flagged = _active(findings, "straggler")
    assert flagged and flagged[0].suspected_layer == "data" and flagged[0].category == "data"


def test_a_gpu_straggler_quotes_its_clock_and_throttle_reasons() -> None:
    _, findings, _ = _run(_job(150, {"compute": 0.85 * 1.6}, fault_from=1, gpus=True))
    flagged = _active(findings, "straggler")
    assert "SM clock 1300 MHz" in flagged[0].summary and "hw_thermal" in flagged[0].summary


def test_a_straggler_resolves_when_the_rank_keeps_pace_again() -> None:
    events = _job(300, {"compute": 0.85 * 1.6}, fault_from=1)
    for e in events:
        if e.type == "StepCompleted" and e.record["rank"] == 3 and e.record["ts"] >= T0 + 150_000:
            e.record.update(step("job-1", 3, e.record["step"], e.record["ts"]).record)
    _, findings, _ = _run(events)
    cleared = [f for f in findings if f.rule == "straggler" and not f.active]
    assert cleared and cleared[0].rank == 3 and cleared[0].ts > T0 + 150_000


def test_steps_without_segments_use_the_step_time_as_busy_time() -> None:
    # Per-worker mini-batch times (the Alibaba PAI trace's shape): no segments, no collective wait.
    events = _job(150, {"step_time": 1.6, "compute": None, "data_wait": None, "comm": None}, fault_from=1)
    for e in events:
        if e.type == "StepCompleted" and e.record["rank"] != 3:
            e.record.update(
                {
                    "forward_s": None,
                    "backward_s": None,
                    "optimizer_s": None,
                    "data_wait_s": None,
                    "comm_s": None,
                }
            )
            e.record["step_time_s"] = 1.0
    _, findings, _ = _run(events)
    assert {f.rank for f in _active(findings, "straggler")} == {3}


def test_a_gpu_out_of_line_with_its_peers_is_a_gpu_imbalance() -> None:
    _, findings, _ = _run(_job(150, {}, fault_from=1, gpus=True))
    flagged = _active(findings, "gpu_imbalance")
    assert flagged and {f.gpu_uuid for f in flagged} == {"GPU-node-01-3"}


def test_healthy_jobs_raise_nothing() -> None:
    _, findings, _ = _run(_job(300, gpus=True))
    assert [f for f in findings if f.active] == []


def test_communication_up_for_every_rank_is_network_degradation_naming_the_retransmitting_node() -> None:
    _, findings, _ = _run(_job(400, fault_from=200, comm_extra=0.2, retrans_node="node-01"))
    flagged = _active(findings, "network_degradation")
    assert flagged and flagged[0].node == "node-01" and flagged[0].ts >= T0 + 200_000
    assert _active(findings, "straggler") == []


def _comm_ramp(seconds: int, ramp_s: int, to: float, *, retrans: bool) -> list[Event]:
    """Every rank's comm_s grows linearly from 0.4 s to `to` x over `ramp_s` from 200 s."""
    events = _job(seconds, fault_from=200, retrans_node="node-01" if retrans else None)
    for e in events:
        r = e.record
        if e.type == "StepCompleted":
            grown = min(1.0, max(0, r["ts"] - T0 - 200_000) / (ramp_s * 1000))
            r["comm_s"] = 0.4 * (1 + (to - 1) * grown)
        if e.type == "HostSample" and r["ts"] < T0 + 200_000:
            r["tcp_retrans_segs_s"] = 1.0
    return events


def test_a_link_degrading_gradually_pages_while_it_degrades_when_its_node_retransmits() -> None:
    # 2x over 120 s: 1.5x (the uncorroborated ratio) only 60 s in.
    _, findings, _ = _run(_comm_ramp(400, 120, 2.0, retrans=True))
    flagged = _active(findings, "network_degradation")
    assert flagged and flagged[0].node == "node-01"
    assert flagged[0].ts - (T0 + 200_000) <= 50_000, (flagged[0].ts - T0) / 1000  # 45 s; 75 s uncorroborated
    assert "network errors" in flagged[0].invariant
    # Held at the ratio it fired at: one alert, firing until the link is back.
    assert all(f.active for f in findings if f.rule == "network_degradation")


def test_without_a_node_at_fault_a_gradual_link_pages_only_past_1_5x() -> None:
    _, findings, _ = _run(_comm_ramp(400, 120, 2.0, retrans=False))
    flagged = _active(findings, "network_degradation")
    assert flagged and flagged[0].ts - (T0 + 200_000) >= 60_000, (flagged[0].ts - T0) / 1000
    assert flagged[0].node is None


def test_a_small_rise_with_a_node_at_fault_stays_quiet_below_1_25x() -> None:
    _, findings, _ = _run(_comm_ramp(400, 30, 1.2, retrans=True))
    assert _active(findings, "network_degradation") == []


def test_a_straggler_does_not_look_like_network_degradation() -> None:
    # The others wait for rank 3 (their comm goes up), rank 3's own comm does not.
    events = _job(400, {"compute": 0.85 * 1.6, "comm": 0.12}, fault_from=200)
    for e in events:
        r = e.record
        if e.type == "StepCompleted" and r["rank"] != 3 and r["ts"] >= T0 + 200_000:
            r["comm_s"] = 0.12 + 0.5
    _, findings, _ = _run(events)
    assert _active(findings, "network_degradation") == []
    assert _active(findings, "straggler")


def test_each_closed_window_yields_rank_and_job_window_stats() -> None:
    _, _, derived = _run(_job(130, gpus=True))
    jobs = [e.record for e in derived if e.type == "JobWindowStats"]
    ranks = [e.record for e in derived if e.type == "RankWindowStats"]
    assert [j["window_end"] - T0 for j in jobs] == [60_000, 90_000, 120_000]
    assert len(ranks) == 3 * RANKS
    j = jobs[-1]
    assert j["baseline_key"] == "llama-pretrain|v1|H100-80GB|1n|bs512|seq4096|dp8.tp1.pp1|data:ds1@-"
    assert j["ranks"] == RANKS and j["step_time_s"] == 1.0 and j["gpu_util_pct"] == 95.0
    assert j["tokens_per_s_per_gpu"] == 65536.0 and abs(j["data_wait_frac"] - 0.03) < 1e-9
    assert all(r["straggler_score"] == 1.0 for r in ranks)


def test_state_round_trips_and_continues_identically() -> None:
    events = _job(150, {"compute": 1.4}, fault_from=1)
    det, _, _ = _run(events[: len(events) // 2])
    clone = ImbalanceDetector(det.topology)
    clone.from_bytes(det.to_bytes())
    assert clone.to_bytes() == det.to_bytes()
    rest = events[len(events) // 2 :]
    a = [f for e in rest for f in det.observe(e)] + det.advance(T0 + 200_000)
    b = [f for e in rest for f in clone.observe(e)] + clone.advance(T0 + 200_000)
    assert a == b and clone.drain_derived() == det.drain_derived()


def _two_node_job(
    seconds: int, slow_ranks: set[int], *, from_s: int = 60, wait: float = 1.0, ddp: bool = False
) -> list[Event]:
    """8 ranks on two nodes (4 each) stepping once a second; from `from_s` the `slow_ranks` wait
    `wait` s longer for data per step and every other rank waits for them in the collective
    (`ddp`: inside its backward, which overlaps the all-reduce; no comm segment timed)."""
    events = [job_started("job-1", T0, world_size=8, nodes=2), job_state("job-1", T0, "running")]
    events += [rank_bound("job-1", r, T0, gpus_per_node=4) for r in range(8)]
    for i in range(1, seconds + 1):
        faulty = i >= from_s
        for r in range(8):
            if faulty and r in slow_ranks:
                kw: dict[str, Any] = {"data_wait": 0.03 + wait, "step_time": 1.0 + wait}
            else:
                kw = {"comm": 0.12 + (wait if faulty else 0.0), "step_time": 1.0 + (wait if faulty else 0.0)}
            event = step("job-1", r, i, T0 + i * 1000, **kw)
            if ddp:
                event.record["backward_s"] += event.record["comm_s"] or 0.0
                event.record["comm_s"] = None
            events.append(event)
    return events


def test_slow_storage_under_one_node_is_one_straggler_naming_the_node_not_one_per_rank() -> None:
    """Half the job's ranks slow score ~0.8 against the job median; against the other node they are slow."""
    _, findings, _ = _run(_two_node_job(240, {0, 1, 2, 3}))
    flagged = _active(findings, "straggler")
    assert flagged and {(f.node, f.rank) for f in flagged} == {("node-01", None)}
    first = min(flagged, key=lambda f: f.ts)
    assert first.ts <= T0 + 60_000 + 90_000  # two low windows after the fault starts
    assert first.suspected_layer == "data" and first.category == "data"
    assert "ranks 0-3" in first.summary and "data path" in first.summary


def test_under_ddp_slow_storage_under_one_node_is_one_straggler_naming_the_node() -> None:
    """The other node's ranks wait inside backward: busy times alike, data wait + forward not."""
    _, findings, _ = _run(_two_node_job(240, {0, 1, 2, 3}, ddp=True))
    flagged = _active(findings, "straggler")
    assert flagged and {(f.node, f.rank) for f in flagged} == {("node-01", None)}, [
        f.summary for f in flagged
    ]
    assert min(f.ts for f in flagged) <= T0 + 60_000 + 90_000
    assert flagged[0].suspected_layer == "data"


def test_one_slow_gpu_on_a_node_is_that_rank_s_straggler_not_its_node_s() -> None:
    _, findings, _ = _run(_two_node_job(240, {2}))
    flagged = _active(findings, "straggler")
    assert flagged and {(f.node, f.rank) for f in flagged} == {("node-01", 2)}


def test_a_node_straggler_resolves_when_its_ranks_keep_pace_again() -> None:
    events = [
        e
        for e in _two_node_job(400, {4, 5, 6, 7})
        if not (e.type == "StepCompleted" and e.record["ts"] >= T0 + 200_000)
    ]
    events += [step("job-1", r, i, T0 + i * 1000) for i in range(200, 400) for r in range(8)]
    _, findings, _ = _run(events)
    node = [f for f in findings if f.rule == "straggler" and f.node == "node-02"]
    assert node[0].active and not node[-1].active and node[-1].ts > T0 + 200_000
    assert all(f.rank is None for f in node)


def test_a_window_era_snapshot_is_migrated_and_its_firing_straggler_resolves() -> None:
    """A snapshot taken before the per-bucket rules restores; a straggler it had firing clears once the rank keeps pace."""
    det, _, _ = _run(_job(60))
    state = det.state()
    job = state["jobs"]["job-1"]
    for key in ("bucket", "decided", "run", "seq", "node_seq", "imb_hist", "net"):
        job.pop(key)
    job.update(low={"3": 2}, straggler={"3": T0 + 30_000}, score_hist={}, net_learn=[0.12], net_high=0)
    restored = ImbalanceDetector(det.topology)
    restored.load_state(state)
    rest = [e for e in job_stage_input(_job(200)) if e.record["ts"] > T0 + 60_000]
    findings = [f for e in rest for f in restored.observe(e)] + restored.advance(T0 + 200_000)
    cleared = [f for f in findings if f.rule == "straggler" and not f.active]
    assert [(f.rank, f.since) for f in cleared] == [(3, T0 + 30_000)]
    # Until then it is the same alert (same since); nothing fires after.
    assert all(f.since == T0 + 30_000 and f.ts < cleared[0].ts for f in _active(findings, "straggler"))


def _atomic(value: object) -> bool:
    """Numbers, strings, None and tuples of them: what the cyclic collector stops tracking."""
    if isinstance(value, tuple):
        return all(_atomic(v) for v in value)
    return value is None or isinstance(value, (int, float, str))


def test_a_window_s_rows_leave_the_collector_s_reach_also_after_a_restore() -> None:
    """Held for a 60 s window per rank, the rows are tuples of numbers and packed Stats, which the
    cyclic collector stops tracking once it looked at them (a 16k-rank job holds ~200,000); lists
    and dicts it walks for as long as they live."""
    events = _job(40, gpus=True)
    det, _, _ = _run(events)
    clone = ImbalanceDetector(det.topology)
    clone.from_bytes(det.to_bytes())  # JSON: the rows come back as lists
    for d in (det, clone):
        rows = [*d.jobs["job-1"]["steps"], *d.jobs["job-1"]["gpu"]]
        assert len(rows) > 8 * 5 and all(_atomic(row) for row in rows)
    assert clone.to_bytes() == det.to_bytes()


def test_a_snapshot_whose_rows_hold_stat_dicts_is_read_as_packed_stats() -> None:
    events = _job(150, {"compute": 1.4}, fault_from=1)
    det, _, _ = _run(events[: len(events) // 2])
    state = json.loads(det.to_bytes())
    for job in state["jobs"].values():  # the form before Stats were packed: {n, sum, min, max, med, values}
        for row in job["steps"]:
            for i in (2, 3, 4, 5, 6, 9):
                if row[i] is not None:
                    n, total, lo, hi, med, values = row[i]
                    row[i] = {"n": n, "sum": total, "min": lo, "max": hi, "med": med, "values": values}
    old = ImbalanceDetector(det.topology)
    old.load_state(state)
    assert old.to_bytes() == det.to_bytes()
