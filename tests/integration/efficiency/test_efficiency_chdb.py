"""The efficiency views in chDB against numbers computed here, independently, from the same events."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import pytest
from clickhouse_connect.driver.client import Client

from schemas.records import Event
from schemas.topics import topic_for
from sinks.writer import ClickHouseSink
from tests.integration.efficiency.scenario import S, scenario

LOST = ("restarted", "failed", "preempted")


def store(client: Client, events: list[Event], first_offset: int = 0) -> None:
    sink = ClickHouseSink(client)
    for offset, event in enumerate(events, start=first_offset):
        sink.add(topic_for(event.type), 0, offset, event)
    for topic, partition in sink.pending():
        batch = sink.flush(topic, partition)
        if batch is not None:
            sink.write(batch)


def expected_runs(events: list[Event]) -> dict[tuple[str, str], dict[str, Any]]:
    """docs/efficiency.md, formula by formula, in plain Python over the event list."""
    by_type: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        by_type[e.type].append(e.record)
    runs = {(r["job_id"], r["run_id"]): r for r in by_type["JobStarted"]}
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for (job, run), js in runs.items():
        later = [r for (j, _), r in runs.items() if j == job and r["ts"] > js["ts"]]

        def mine(kind: str, job: str = job, run: str = run) -> list[dict[str, Any]]:
            return [r for r in by_type[kind] if r["job_id"] == job and r["run_id"] == run]

        per_step: dict[int, dict[str, Any]] = {}
        for r in mine("StepCompleted"):
            s = per_step.setdefault(r["step"], {"s": 0.0, "tok": 0, "skip": False, "ts": 0})
            s["s"] = max(s["s"], r["step_time_s"])
            s["tok"] += r["tokens"]
            s["skip"] = s["skip"] or r["skipped"]
            s["ts"] = max(s["ts"], r["ts"])
        ckpts, evals = mine("CheckpointEvent"), mine("EvaluationEvent")
        verified = [r for r in ckpts if r["phase"] == "verified"]
        vstep = max((r["step"] for r in verified), default=None)
        vts = max((r["ts"] for r in verified), default=None)
        write_s = defaultdict(float)
        for r in ckpts:
            if r["phase"] in ("completed", "failed"):
                write_s[r["checkpoint_id"]] = max(write_s[r["checkpoint_id"]], r.get("duration_s") or 0.0)
        eval_s = defaultdict(float)
        for r in evals:
            if r["phase"] in ("completed", "failed"):
                eval_s[r["evaluation_id"]] = max(eval_s[r["evaluation_id"]], r.get("duration_s") or 0.0)
        activity = max([s["ts"] for s in per_step.values()] + [r["ts"] for r in ckpts + evals])
        states = sorted((r for r in by_type["JobStateChanged"] if r["job_id"] == job), key=lambda r: r["ts"])
        last = states[-1] if states else None
        if later:
            outcome = "restarted"
        elif last is None or last["ts"] < js["ts"]:
            outcome = "running"
        else:
            outcome = {"pending": "restarted", "restarting": "restarted"}.get(last["state"], last["state"])
            outcome = outcome if outcome in (*LOST, "completed") else "running"
        ended = max(js["ts"], activity, last["ts"] if (not later and outcome != "running" and last) else 0)
        wall = (ended - js["ts"]) / S

        def saved(step: int, vstep: int | None = vstep) -> bool:
            return vstep is not None and step <= vstep

        step_s = sum(s["s"] for s in per_step.values())
        skipped_s = sum(s["s"] for s in per_step.values() if s["skip"])
        unsaved_s = sum(s["s"] for n, s in per_step.items() if not s["skip"] and not saved(n))
        lost = outcome in LOST
        restart_lost = unsaved_s if lost else 0.0
        tokens = sum(s["tok"] for n, s in per_step.items() if not s["skip"] and not (lost and not saved(n)))
        productive = step_s - skipped_s - restart_lost
        gpus = js["world_size"]
        # Energy: counters of GPUs attributed to the job (job_id on the sample, the run by time), else
        # of GPUs bound to the run's ranks between the binding and the run's last activity.
        energy: dict[tuple[str, str], list[int]] = defaultdict(list)
        run_starts = sorted(r["ts"] for (j, _), r in runs.items() if j == job)
        for g in by_type["GpuSample"]:
            if g["job_id"] == job:
                owner_start = max(t for t in run_starts if t <= g["ts"])
                if owner_start == js["ts"]:
                    energy[(g["node"], g["gpu_uuid"])].append(g["energy_mj"])
            elif g["job_id"] is None:
                for b in by_type["RankBound"]:
                    same_gpu = (b["job_id"], b["run_id"], b["node"], b["gpu_uuid"]) == (
                        job,
                        run,
                        g["node"],
                        g["gpu_uuid"],
                    )
                    if same_gpu and b["ts"] <= g["ts"] <= activity:
                        energy[(g["node"], g["gpu_uuid"])].append(g["energy_mj"])
        kwh = sum(max(v) - min(v) for v in energy.values()) / 3.6e9
        out[(job, run)] = {
            "outcome": outcome,
            "wall_s": wall,
            "allocated_gpu_h": gpus * wall / 3600,
            "productive_s": productive,
            "restart_lost_s": restart_lost,
            "skipped_s": skipped_s,
            "checkpoint_s": sum(write_s.values()),
            "evaluation_s": sum(eval_s.values()),
            "stall_s": max(0.0, wall - step_s - sum(write_s.values()) - sum(eval_s.values())),
            "goodput_pct": 100 * productive / wall,
            "tokens": tokens,
            "tokens_per_gpu_h": tokens / (gpus * wall / 3600),
            "energy_kwh": kwh,
            "failed_work_s": (ended - max(vts or js["ts"], js["ts"])) / S if lost else 0.0,
            "tokens_per_gpu_s": tokens / (productive * gpus),
            "gpus": gpus,
        }
    return out


@pytest.fixture
def loaded(chdb: Client) -> tuple[Client, list[Event]]:
    events = scenario()
    store(chdb, events)
    return chdb, events


def _rows(client: Client, sql: str) -> list[dict[str, Any]]:
    result = client.query(sql)
    return [dict(zip(result.column_names, row, strict=True)) for row in result.result_rows]


def test_run_efficiency_matches_the_formulas(loaded: tuple[Client, list[Event]]) -> None:
    client, events = loaded
    expected = expected_runs(events)
    rows = {(r["job_id"], r["run_id"]): r for r in _rows(client, "SELECT * FROM run_efficiency")}
    assert set(rows) == set(expected) == {("big", "r1"), ("big", "r2"), ("solo", "s1")}
    for key, want in expected.items():
        got = rows[key]
        for name, value in want.items():
            if isinstance(value, str):
                assert got[name] == value, (key, name)
            else:
                assert got[name] == pytest.approx(value, rel=1e-6, abs=1e-9), (key, name, got[name], value)
    # The numbers themselves, for the record: r1 failed 4 steps after its verified checkpoint.
    r1 = rows[("big", "r1")]
    assert r1["outcome"] == "restarted" and r1["restart_lost_s"] == pytest.approx(8.0)
    assert r1["skipped_s"] == pytest.approx(2.0) and r1["last_verified_step"] == 6
    assert rows[("big", "r2")]["outcome"] == "completed" and rows[("big", "r2")]["evaluation_s"] == 4.0


def test_job_efficiency_adds_runs_queue_waits_energy_and_scaling(loaded: tuple[Client, list[Event]]) -> None:
    client, events = loaded
    runs = expected_runs(events)
    jobs = {r["job_id"]: r for r in _rows(client, "SELECT * FROM job_efficiency")}
    big = jobs["big"]
    r1, r2 = runs[("big", "r1")], runs[("big", "r2")]
    alloc = r1["allocated_gpu_h"] + r2["allocated_gpu_h"]
    productive_gpu_h = (r1["productive_s"] * 4 + r2["productive_s"] * 4) / 3600
    assert big["outcome"] == "completed" and big["runs"] == 2 and big["restarts"] == 1
    assert big["queue_s"] == pytest.approx(60 + 20)  # two waits, from the scheduler's submit times
    assert big["allocated_gpu_h"] == pytest.approx(alloc)
    assert big["goodput_pct"] == pytest.approx(100 * productive_gpu_h / alloc)
    assert big["restart_gpu_h"] == pytest.approx(8.0 * 4 / 3600)
    assert big["failed_work_pct"] == pytest.approx(100 * (r1["failed_work_s"] * 4 / 3600) / alloc)
    assert (
        big["tokens"] == r1["tokens"] + r2["tokens"] == 5 * 4000 + 8 * 4000
    )  # r1 keeps steps 1-6 but the skipped 3
    assert big["energy_kwh"] == pytest.approx(r1["energy_kwh"] + r2["energy_kwh"])
    assert big["energy_kwh"] == pytest.approx((105e6 + 80e6) / 3.6e9)
    assert big["kwh_per_billion_tokens"] == pytest.approx(big["energy_kwh"] / (big["tokens"] / 1e9))
    # A job known only from the scheduler still shows its queue wait and owner.
    queued = jobs["queued"]
    assert (queued["outcome"], queued["runs"], queued["team"], queued["owner"]) == (
        "running",
        0,
        "vision",
        "bo",
    )
    assert queued["queue_s"] == pytest.approx(90.0) and queued["allocated_gpu_h"] == 0
    assert queued["goodput_pct"] is None
    solo = jobs["solo"]
    assert solo["tokens_per_gpu_s"] == pytest.approx(2000.0) and solo["scaling_efficiency"] is None
    # 500 tokens per GPU-second on two nodes against 2 000 on one: 25 % scaling efficiency.
    assert big["tokens_per_gpu_s"] == pytest.approx(500.0)
    assert big["scaling_efficiency"] == pytest.approx(0.25)
    assert not math.isnan(big["goodput_pct"]) and big["goodput_pct"] < 100


def test_a_running_run_is_reported_as_it_goes(chdb: Client) -> None:
    """Before the job ends the run is `running`, nothing counts as lost to restarts, and it updates."""
    events = [e for e in scenario() if e.record["job_id"] == "solo" and e.type != "JobStateChanged"]
    half = [e for e in events if e.type != "StepCompleted" or e.record["step"] <= 10]
    store(chdb, half)
    first = _rows(chdb, "SELECT outcome, steps, tokens FROM run_efficiency")[0]
    assert first == {"outcome": "running", "steps": 10, "tokens": 10 * 2 * 2000}
    store(chdb, [e for e in events if e not in half], first_offset=len(half))
    assert _rows(chdb, "SELECT steps FROM run_efficiency")[0]["steps"] == 20


def test_the_cli_prints_plain_text_with_costs_and_a_team_total(
    loaded: tuple[Client, list[Event]], chdb_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from ranksight.cli import app
    from sinks.clickhouse import close

    client, _ = loaded
    alloc = {
        r["job_id"]: r["allocated_gpu_h"]
        for r in _rows(client, "SELECT job_id, allocated_gpu_h FROM job_efficiency")
    }
    close(chdb_dsn)  # chDB: one engine per process; the command opens it again
    monkeypatch.setenv("CLICKHOUSE_URL", chdb_dsn)
    result = CliRunner().invoke(app, ["efficiency", "--team", "nlp", "--price", "H100-80GB=3", "--runs"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].split()[:3] == ["job", "team", "outcome"] and "\x1b[" not in result.output
    big = next(line for line in lines if line.startswith("big "))
    assert f"{alloc['big'] * 3:.2f}" in big.split()  # cost = GPU-hours x price
    total = lines[-1]
    assert total.startswith("nlp: 2 jobs (2 completed)")
    assert f"cost per successful run {(alloc['big'] + alloc['solo']) * 3 / 2:.2f}" in total
    missing = CliRunner().invoke(app, ["efficiency", "--job", "nope"])
    assert missing.exit_code == 1 and "no runs recorded for job nope" in missing.output
    bad = CliRunner().invoke(app, ["efficiency", "--price", "H100"])
    assert bad.exit_code == 1 and "CLASS=USD_PER_GPU_HOUR" in bad.output
