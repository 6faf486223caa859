"""The panel queries on chDB: roll-ups for wide ranges, raw rows zoomed in, bands, fleet health."""

from __future__ import annotations

import json
from typing import Any

import pytest

from schemas.records import Event
from sinks.efficiency import PriceList
from tests.integration.ui.conftest import (
    FAULT_END_S,
    FAULT_START_S,
    PRICE_PER_GPU_H,
    STRAGGLER_JOB,
    STRAGGLER_RANK,
    UiStore,
    efficiency_json,
)
from ui.errors import NotFoundError
from ui.pages.alert import alert_page
from ui.pages.common import MIN_PLAUSIBLE_MS, to_json
from ui.pages.fleet import fleet as fleet_json
from ui.pages.job import job_page
from ui.store import load_events


def _slowest_rank_during_fault(page: dict[str, Any], start_ms: int) -> int:
    buckets, ranks, compute = json.loads(page["heatmap"]["cells"].text)[:3]
    t0, width = page["range"]["from_ms"], page["range"]["bucket_ms"]
    lo, hi = start_ms + (FAULT_START_S + 60) * 1000, start_ms + (FAULT_END_S - 60) * 1000
    per_rank: dict[int, list[float]] = {}
    for x, rank, value in zip(buckets, ranks, compute, strict=True):
        if value is not None and lo <= t0 + x * width < hi:
            per_rank.setdefault(rank, []).append(value)
    return max(per_rank, key=lambda r: sum(per_rank[r]) / len(per_rank[r]))


def test_two_hours_read_the_roll_ups_and_a_zoom_reads_raw_rows_with_the_same_straggler(
    ui_store: UiStore,
) -> None:
    """A 2-hour range reads derived windows and gpu_minute; 10 minutes read steps and gpu_samples; both find rank 13."""
    wide = job_page(
        ui_store.client, STRAGGLER_JOB, ui_store.start_ms - 3600_000, ui_store.start_ms + 3600_000
    )
    assert wide["range"]["bucket_ms"] == 60_000
    assert (wide["heatmap"]["source"], wide["gpus"]["source"]) == ("derived_rank_windows", "gpu_minute")
    assert wide["steps"]["segments_source"] == "derived_rank_windows"
    narrow = job_page(
        ui_store.client, STRAGGLER_JOB, ui_store.start_ms + 5 * 60_000, ui_store.start_ms + 13 * 60_000
    )
    assert narrow["range"]["bucket_ms"] < 30_000
    assert (narrow["heatmap"]["source"], narrow["gpus"]["source"]) == ("steps", "gpu_samples")
    assert set(narrow["steps"]["segments"]) == {
        "data_wait",
        "forward",
        "backward",
        "optimizer",
        "comm",
        "checkpoint",
    }
    assert _slowest_rank_during_fault(wide, ui_store.start_ms) == STRAGGLER_RANK
    assert _slowest_rank_during_fault(narrow, ui_store.start_ms) == STRAGGLER_RANK


def test_evaluations_become_bands_open_until_they_end(ui_store: UiStore) -> None:
    """A completed evaluation is a band from start to end; one without an end stays open."""
    base = {"job_id": STRAGGLER_JOB, "run_id": f"{STRAGGLER_JOB}-r0", "rank": 0, "step": 100}
    t = ui_store.start_ms + 4 * 60_000
    load_events(
        ui_store.client,
        [
            Event(
                "EvaluationEvent",
                {**base, "ts": t, "evaluation_id": "ev-1", "phase": "started", "name": "mmlu"},
            ),
            Event(
                "EvaluationEvent",
                {**base, "ts": t + 30_000, "evaluation_id": "ev-1", "phase": "completed", "duration_s": 30.0},
            ),
            Event("EvaluationEvent", {**base, "ts": t + 60_000, "evaluation_id": "ev-2", "phase": "started"}),
        ],
    )
    bands = {b["id"]: b for b in job_page(ui_store.client, STRAGGLER_JOB)["evaluations"]}
    assert bands["ev-1"]["start_ms"] == t and bands["ev-1"]["end_ms"] == t + 30_000
    assert bands["ev-1"]["status"] == "completed" and bands["ev-1"]["label"] == "mmlu"
    assert bands["ev-2"]["status"] == "open" and bands["ev-2"]["end_ms"] is None


def test_fleet_health_counts_firing_alerts_per_job_and_orders_the_unhealthy_first(ui_store: UiStore) -> None:
    """The stalled vision job has its critical alert counted and comes first; every alert names its team."""
    fleet = fleet_json(ui_store.client)
    assert fleet["jobs"][0]["job_id"] == "vit-h-0302"
    assert fleet["jobs"][0]["firing"]["critical"] >= 1
    by_id = {j["job_id"]: j for j in fleet["jobs"]}
    assert by_id["asr-0303"]["progress_time_frac"] == 1.0  # healthy throughout
    assert by_id["vit-h-0302"]["progress_time_frac"] < 0.8  # stalled from minute 8 on
    assert by_id["vit-h-0302"]["step_rate"] == 0.0 and by_id["asr-0303"]["step_rate"] > 0
    assert {a["rule"] for a in fleet["resolved"]} >= {"straggler"}
    assert all(a["team"] for a in fleet["firing"] + fleet["resolved"])
    assert json.loads(to_json(fleet))["jobs"][0]["job_id"] == "vit-h-0302"


def test_unknown_jobs_and_alerts_are_not_found(ui_store: UiStore) -> None:
    """A job or alert the store does not hold raises NotFoundError (the API answers 404)."""
    with pytest.raises(NotFoundError):
        job_page(ui_store.client, "no-such-job")
    with pytest.raises(NotFoundError):
        alert_page(ui_store.client, "no-such-alert")


def test_fleet_goodput_and_the_job_efficiency_panel_are_what_the_efficiency_command_says(
    ui_store: UiStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fleet goodput per job, and the job panel's figures and runs, equal `ranksight efficiency --json`."""
    expected = efficiency_json(ui_store, monkeypatch)
    prices = PriceList.parse([f"default={PRICE_PER_GPU_H}"])
    fleet = {j["job_id"]: j for j in fleet_json(ui_store.client)["jobs"]}
    for job_id in ui_store.jobs:
        assert fleet[job_id]["goodput_pct"] == pytest.approx(expected[job_id]["goodput_pct"], abs=0.01)
        panel = job_page(ui_store.client, job_id, prices=prices)["efficiency"]
        row = expected[job_id]
        for key in (
            "allocated_gpu_h",
            "goodput_pct",
            "tokens_per_gpu_h",
            "samples_per_gpu_h",
            "energy_kwh",
            "kwh_per_billion_tokens",
            "queue_s",
            "failed_work_pct",
            "cost",
        ):
            assert panel[key] == pytest.approx(row[key], rel=1e-5), key
        for part in ("productive", "stall", "restart", "checkpoint", "evaluation"):
            assert panel["spent_gpu_h"][part] == pytest.approx(row[f"{part}_gpu_h"], rel=1e-5, abs=1e-6), part
        assert panel["cost"] == pytest.approx(row["allocated_gpu_h"] * PRICE_PER_GPU_H, rel=1e-5)
        assert [r["run_id"] for r in panel["per_run"]] == [
            k for k, v in expected.items() if v["job_id"] == job_id and "run_id" in v
        ]
        for run in panel["per_run"]:
            assert run["goodput_pct"] == pytest.approx(expected[run["run_id"]]["goodput_pct"], rel=1e-5)
            assert run["allocated_gpu_h"] == pytest.approx(
                expected[run["run_id"]]["allocated_gpu_h"], rel=1e-5
            )
    # Unpriced, the panel says so rather than showing a cost of zero.
    unpriced = job_page(ui_store.client, STRAGGLER_JOB)["efficiency"]
    assert unpriced["cost"] is None and unpriced["price_per_gpu_h"] is None


def _forget_job(client: Any, job_id: str) -> None:
    """Delete every row of a job from every table that has a job_id (raw tables and roll-ups alike)."""
    tables = client.query(
        "SELECT DISTINCT c.table FROM system.columns AS c INNER JOIN system.tables AS t "
        "ON c.database = t.database AND c.table = t.name WHERE c.database = currentDatabase() "
        "AND c.name = 'job_id' AND t.engine LIKE '%MergeTree'"
    ).result_rows
    for (table,) in tables:
        client.command(
            f"ALTER TABLE `{table}` DELETE WHERE job_id = {{j:String}}",
            parameters={"j": job_id},
            settings={"mutations_sync": 2},
        )


def test_a_record_stamped_2199_does_not_stretch_the_job_or_move_the_fleets_now(ui_store: UiStore) -> None:
    """A step and an alert stamped 2199 (stored: the writer accepts up to 2200) leave the job's range and the fleet alone."""
    client = ui_store.client
    job = "clock-2199"
    t = ui_store.start_ms + 60_000
    step = {"job_id": job, "run_id": f"{job}-r0", "rank": 0, "step": 1, "step_time_s": 1.0}
    far = 7_200_000_000_000  # 2198-02-27, inside the writer's 2000..2200 and far past any clock
    before_fleet = fleet_json(client, goodput=False)
    try:
        load_events(
            client,
            [
                Event(
                    "JobStarted",
                    {
                        "ts": t,
                        "job_id": job,
                        "run_id": f"{job}-r0",
                        "world_size": 1,
                        "team": "t",
                        "owner": "o",
                        "cluster": "c",
                    },
                ),
                Event("StepCompleted", {**step, "ts": t}),
                Event("StepCompleted", {**step, "ts": far, "step": 2}),
            ],
        )
        client.command(
            "INSERT INTO alerts SELECT * REPLACE ('far-future' AS alert_id, {j:String} AS job_id, "
            "fromUnixTimestamp64Milli(toInt64(7200000000000), 'UTC') AS ts, "
            "fromUnixTimestamp64Milli(toInt64(7200000000000), 'UTC') AS starts_at) "
            "FROM (SELECT * FROM alerts LIMIT 1)",
            parameters={"j": job},
        )
        assert (
            client.query(
                "SELECT count() FROM steps WHERE job_id = {j:String}", parameters={"j": job}
            ).result_rows[0][0]
            == 2
        )
        page = job_page(client, job, with_efficiency=False)
        # From its first step to the newest data of the store (a job without an end runs till now), not 2198.
        assert page["range"]["span"][0] == t // 60_000 * 60_000
        assert page["range"]["span"][1] <= before_fleet["now_ms"] + 60_000
        assert page["alerts"] == []
        fleet = fleet_json(client, goodput=False)
        assert fleet["now_ms"] == before_fleet["now_ms"]
        row = {j["job_id"]: j for j in fleet["jobs"]}[job]
        assert (row["last_progress_ms"], row["last_step"]) == (t, 1)
        assert "far-future" not in {a["alert_id"] for a in fleet["firing"] + fleet["resolved"]}
        # A range asked for by URL is cut to plausible times too.
        huge = job_page(client, job, 0, 10**15, with_efficiency=False)
        assert huge["range"]["to_ms"] < far and huge["range"]["from_ms"] >= MIN_PLAUSIBLE_MS
    finally:
        _forget_job(client, job)


def test_a_stall_page_shows_its_newest_refresh_not_its_first_minute(ui_store: UiStore) -> None:
    """Issue 34.2: the engine republishes a firing stall as it grows; the alerts table keeps the
    newest record of it (ReplacingMergeTree on team, fingerprint, alert_id, status), so the alert
    page's headline, observed value and chart are the stall's length now, not "for 61 s"."""
    rows = ui_store.client.query(
        "SELECT alert_id, toUnixTimestamp64Milli(ts), observed, summary FROM alerts "
        "WHERE rule = 'job_stall' AND job_id = 'vit-h-0302' AND status = 'firing' ORDER BY ts"
    ).result_rows
    assert len({r[0] for r in rows}) == 1, rows
    newest = rows[-1]
    page = alert_page(ui_store.client, newest[0])["alert"]
    assert page["observed_fired"] == newest[2] >= 120.0, (page["observed_fired"], newest)
    assert page["summary"] == newest[3] and f"for {newest[2]:.0f} s" in page["summary"]
    assert page["history"][-1] == [newest[1], newest[2]]  # the chart ends at the newest record
    assert [t["status"] for t in page["transitions"]].count("firing") == 1
