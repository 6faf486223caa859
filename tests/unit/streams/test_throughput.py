"""Self-baseline: a run slower than its own recent history raises one throughput_drop that names its cause."""

from __future__ import annotations

import random
import re
from typing import Any

from schemas.records import Event
from streams.offline.detection import DetectionEngine
from tests.unit.streams.builders import T0, gpu_sample, host_sample, job_started, job_state, rank_bound, step

RANKS = 4


def _run_job(
    seconds: int,
    slow: tuple[int, int] | None = None,
    *,
    factor: float = 2.25,
    segment: str = "compute",
    foreign: bool = False,
    cpu: float | None = None,
    jitter: float = 0.0,
) -> list[Event]:
    """A 4-rank job on node-01; during `slow` (seconds) every rank's step takes `factor` x longer,
    the extra time in `segment`; optionally a foreign pid on GPU 0 or a busy host CPU meanwhile."""
    rng = random.Random(3)
    events = [job_started("job-1", T0, world_size=RANKS, nodes=1), job_state("job-1", T0, "running")]
    events += [rank_bound("job-1", r, T0) for r in range(RANKS)]
    t, n = 0.0, 0
    while t < seconds:
        in_fault = slow is not None and slow[0] <= t < slow[1]
        f = factor if in_fault else 1.0
        extra = 1.0 * (f - 1.0)
        kw: dict[str, Any] = {"compute": 0.85, "data_wait": 0.03, "comm": 0.12}
        key = {"compute": "compute", "wait": "data_wait", "comm": "comm"}[segment]
        kw[key] += extra
        step_time = 1.0 * f
        t += step_time
        n += 1
        for r in range(RANKS):
            j = rng.uniform(1 - jitter, 1 + jitter) if jitter else 1.0
            events.append(
                step(
                    "job-1",
                    r,
                    n,
                    T0 + int(t * 1000),
                    step_time=step_time * j,
                    compute=kw["compute"] * j,
                    data_wait=kw["data_wait"],
                    comm=kw["comm"],
                )
            )
    for s in range(5, seconds, 5):
        in_fault = slow is not None and slow[0] <= s < slow[1]
        for i in range(RANKS):
            pids = [1000 + i] + ([4242] if foreign and in_fault and i == 0 else [])
            events.append(gpu_sample("node-01", i, T0 + s * 1000, pids=pids))
        host = host_sample("node-01", T0 + s * 1000)
        if cpu is not None and in_fault:
            host.record["cpu_util_pct"] = cpu
        events.append(host)
    return sorted(events, key=lambda e: e.record["ts"])


def _alerts(events: list[Event], rule: str = "throughput_drop") -> list[dict[str, Any]]:
    """Each alert state once (ownership routing also sends a copy to the job's team)."""
    out = DetectionEngine().run(events)
    seen: set[tuple[str, str]] = set()
    alerts = []
    for e in out:
        if e.type == "Alert" and e.record["rule"] == rule:
            key = (e.record["alert_id"], e.record["status"])
            if key not in seen:
                seen.add(key)
                alerts.append(e.record)
    return alerts


def test_a_75_s_doubling_of_step_time_raises_one_alert_naming_segment_and_foreign_process() -> None:
    alerts = _alerts(_run_job(900, slow=(400, 475), foreign=True))
    firing = [a for a in alerts if a["status"] == "firing"]
    assert len(firing) == 1, [a["summary"] for a in firing]
    a = firing[0]
    assert T0 + 400_000 <= a["ts"] <= T0 + 475_000 + 30_000
    assert (
        "2.2" in a["summary"] and "compute" in a["summary"] and "foreign process (pid 4242)" in a["summary"]
    )
    assert a["suspected_layer"] == "gpu" and a["team"] == "platform" and a["observed"] > 2 * a["expected"]
    assert [x["status"] for x in alerts] == ["firing", "resolved"]


def test_a_data_wait_slowdown_names_data_wait_and_the_busy_host_cpu() -> None:
    firing = [
        a
        for a in _alerts(_run_job(900, slow=(400, 600), factor=1.6, segment="wait", cpu=95.0))
        if a["status"] == "firing"
    ]
    assert len(firing) == 1
    summary = firing[0]["summary"]
    cpu = re.search(r"host CPU (\d+)% vs 30%", summary)
    assert "data wait expanded most" in summary and cpu is not None and int(cpu.group(1)) >= 80, summary
    assert firing[0]["suspected_layer"] == "data"
    # A one-node job whose data wait grew: its node's data path is named (storage under that node).
    assert firing[0]["node"] == "node-01" and "data path" in summary


def test_a_slowdown_with_no_infrastructure_change_says_so() -> None:
    firing = [
        a
        for a in _alerts(_run_job(900, slow=(400, 600), factor=1.5, segment="comm"))
        if a["status"] == "firing"
    ]
    assert len(firing) == 1 and "communication expanded most" in firing[0]["summary"]
    assert "no infrastructure signal changed" in firing[0]["summary"]


def test_a_mild_slowdown_under_the_ratio_raises_nothing() -> None:
    assert _alerts(_run_job(900, slow=(400, 700), factor=1.15)) == []


def test_one_slow_window_is_not_a_drop() -> None:
    assert _alerts(_run_job(900, slow=(400, 420), factor=2.0)) == []


def test_a_noisy_healthy_run_raises_nothing() -> None:
    assert _alerts(_run_job(1800, jitter=0.2)) == []


def test_a_run_that_is_slow_from_its_start_has_no_own_normal_to_drop_from() -> None:
    assert _alerts(_run_job(900, slow=(0, 900), factor=2.0)) == []


def test_the_h200_incident_a_foreign_process_doubling_43_ms_steps_for_75_s_is_one_alert() -> None:
    """One rank on one GPU at 43 ms a step; a foreign process shares the GPU for 75 s (97 ms steps)."""
    events = [job_started("job-1", T0, world_size=1, nodes=1), job_state("job-1", T0, "running")]
    events.append(rank_bound("job-1", 0, T0))
    t, n = 0.0, 0
    while t < 600:
        slow = 300 <= t < 375
        step_s = 0.097 if slow else 0.043
        t += step_s
        n += 1
        events.append(
            step(
                "job-1",
                0,
                n,
                T0 + int(t * 1000),
                step_time=step_s,
                compute=step_s - 0.004,
                data_wait=0.002,
                comm=0.0,
                tokens=8192,
            )
        )
    for s in range(2, 600, 2):
        slow = 300 <= s < 375
        events.append(
            gpu_sample(
                "node-01",
                0,
                T0 + s * 1000,
                pids=[1000, 7777] if slow else [1000],
                util=100.0,
                mem_used=(120 if slow else 70) * 2**30,
            )
        )
    alerts = _alerts(sorted(events, key=lambda e: e.record["ts"]))
    firing = [a for a in alerts if a["status"] == "firing"]
    assert len(firing) == 1, [a["summary"] for a in firing]
    summary = firing[0]["summary"]
    assert (
        "97.0 ms vs 43.0 ms" in summary and "compute" in summary and "foreign process (pid 7777)" in summary
    )


def test_a_75_s_job_wide_slowdown_covering_one_window_whole_is_caught_by_that_window() -> None:
    """The episode spans one 60 s window whole and its neighbours only in part (their medians stay
    normal): one window of a large slowdown of every rank alike is enough."""
    alerts = _alerts(_run_job(900, slow=(418, 493), factor=2.0))
    firing = [a for a in alerts if a["status"] == "firing"]
    assert len(firing) == 1, [a["summary"] for a in alerts]
    assert T0 + 418_000 <= firing[0]["ts"] <= T0 + 493_000
    assert [a["status"] for a in alerts] == ["firing", "resolved"]


def test_one_slow_window_of_a_mild_slowdown_is_not_enough() -> None:
    """Below `severe_ratio` a drop still needs `windows` deviating windows in a row."""
    assert _alerts(_run_job(900, slow=(418, 480), factor=1.4)) == []


def test_one_slow_window_with_one_slow_rank_waits_for_the_rank_level_rules() -> None:
    """When a rank is slower than its peers the straggler rule judges it (its change detector
    names the rank on that one window): no one-window drop."""
    events = _run_job(900, slow=(418, 480), factor=2.0)
    assert len([a for a in _alerts(events) if a["status"] == "firing"]) == 1  # every rank slow: caught
    for e in events:
        r = e.record
        if e.type == "StepCompleted" and r["rank"] != 0 and 418_000 <= r["ts"] - T0 < 480_000:
            # ranks 1-3 only wait for rank 0 in the collective: their busy time stays normal
            r["comm_s"] += r["forward_s"] + r["backward_s"] + r["optimizer_s"] - 0.85
            r["forward_s"], r["backward_s"], r["optimizer_s"] = 0.85 / 3, 0.85 / 2, 0.85 / 6
    assert _alerts(events) == []
    stragglers = [a for a in _alerts(events, "straggler") if a["status"] == "firing"]
    assert [(a["rank"], a["suspected_layer"]) for a in stragglers] == [(0, "gpu")]
