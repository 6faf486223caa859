"""The efficiency views in chDB against numbers computed here, independently, from the same events."""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from typing import Any

import pytest
from clickhouse_connect.driver.client import Client

from schemas.records import Event
from schemas.topics import topic_for
from sinks.efficiency_sql import STALL_INTERVAL_FACTOR
from sinks.writer import ClickHouseSink
from tests.integration.efficiency.scenario import S, T, job_started, scenario, state, steps

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
            s = per_step.setdefault(r["step"], {"s": 0.0, "tok": 0, "skip": False, "ts": 0, "reports": 0})
            s["s"] = max(s["s"], r["step_time_s"])
            s["tok"] += r["tokens"]
            s["skip"] = s["skip"] or r["skipped"]
            s["ts"] = max(s["ts"], r["ts"])
            s["reports"] += 1
        for s in per_step.values():  # a rank-step reported twice counts once
            s["tok"] = round(s["tok"] * min(1.0, js["world_size"] / s["reports"]))
        ckpts, evals = mine("CheckpointEvent"), mine("EvaluationEvent")
        verified = [r for r in ckpts if r["phase"] == "verified"]
        vstep = max((r["step"] for r in verified), default=None)
        vts = max((r["ts"] for r in verified), default=None)
        write_s: dict[str, float] = defaultdict(float)
        pause_end: dict[tuple[str, str], int] = {}
        for r in ckpts:
            if r["phase"] in ("completed", "failed"):
                write_s[r["checkpoint_id"]] = max(write_s[r["checkpoint_id"]], r.get("duration_s") or 0.0)
                key = ("c", r["checkpoint_id"])
                pause_end[key] = max(pause_end.get(key, 0), r["ts"])
        eval_s: dict[str, float] = defaultdict(float)
        for r in evals:
            if r["phase"] in ("completed", "failed"):
                eval_s[r["evaluation_id"]] = max(eval_s[r["evaluation_id"]], r.get("duration_s") or 0.0)
                key = ("e", r["evaluation_id"])
                pause_end[key] = max(pause_end.get(key, 0), r["ts"])
        pauses = [(end, (write_s if kind == "c" else eval_s)[i]) for (kind, i), end in pause_end.items()]
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

        # The heartbeat (docs/efficiency.md): each step's interval since the previous completion, less
        # the pauses that ended in it; a step is credited its step time, capped by that, and by one
        # median interval when the interval is over STALL_INTERVAL_FACTOR of them. The rest is stall.
        beats = sorted(per_step.items(), key=lambda kv: (kv[1]["ts"], kv[0]))
        previous, open_s = js["ts"], list[float]()
        for _, st in beats:
            first = not open_s
            paused = sum(length for end, length in pauses if (first or previous < end) and end <= st["ts"])
            open_s.append(max(0.0, max(0, st["ts"] - previous) / S - paused))
            previous = st["ts"]
        gaps = sorted(max(0, b["ts"] - a["ts"]) / S for (_, a), (_, b) in itertools.pairwise(beats))
        normal = gaps[len(gaps) // 2] if gaps else 0.0  # quantileExact(0.5): the upper middle
        work: dict[int, float] = {}
        for (n, st), o in zip(beats, open_s, strict=True):
            credit = normal if normal > 0 and o > STALL_INTERVAL_FACTOR * normal else o
            work[n] = min(st["s"], credit)
        last_step = beats[-1][1]["ts"] if beats else js["ts"]
        tail_pause = sum(length for end, length in pauses if end > last_step)
        step_s = sum(work.values())
        skipped_s = sum(work[n] for n, s in per_step.items() if s["skip"])
        unsaved_s = sum(work[n] for n, s in per_step.items() if not s["skip"] and not saved(n))
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
            "step_s": step_s,
            "stall_s": sum(open_s) - step_s + max(0.0, (ended - last_step) / S - tail_pause),
            "goodput_pct": min(100.0, 100 * productive / wall),
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


def _hung_job(step_s: float = 1.0, stall_s: float = 360.0) -> list[Event]:
    """One 2-rank run of 40 steps; step 20 waits `stall_s` for data inside the step (its step time says so)."""
    started = T + 3600 * S
    ev = [job_started("hung", "h1", started, world=2, nodes=["n5"], family="llm-hung")]
    ev += steps("hung", "h1", 1, 19, started, ranks=2, step_s=step_s)
    stalled_from = started + int(19 * step_s * S)
    ev += steps("hung", "h1", 20, 20, stalled_from, ranks=2, step_s=step_s + stall_s)
    ev += steps("hung", "h1", 21, 40, stalled_from + int((step_s + stall_s) * S), ranks=2, step_s=step_s)
    last = max(e.record["ts"] for e in ev)
    ev.append(state("hung", last + 500, "completed", exit_code=0))
    return ev


def test_a_stall_inside_one_long_step_is_stall_time_not_productive(chdb: Client) -> None:
    """Issue 24.4: a 6-minute data wait inside one step counts as stall, from the heartbeat."""
    events = _hung_job()
    store(chdb, events)
    row = _rows(chdb, "SELECT * FROM run_efficiency")[0]
    want = expected_runs(events)[("hung", "h1")]
    for name, value in want.items():
        assert row[name] == (value if isinstance(value, str) else pytest.approx(value, rel=1e-6, abs=1e-9)), (
            name
        )
    # The numbers: 40 steps of about a second are the work; the 6 minutes are stall.
    assert row["productive_s"] == pytest.approx(40.0, abs=0.5)
    assert row["stall_s"] == pytest.approx(360.0, abs=1.0)
    assert row["goodput_pct"] == pytest.approx(100 * row["productive_s"] / row["wall_s"])
    assert row["goodput_pct"] < 11  # 40 s of 401 s; the old formula said 100 %
    job = _rows(chdb, "SELECT * FROM job_efficiency")[0]
    assert job["stall_gpu_h"] == pytest.approx(2 * row["stall_s"] / 3600)
    assert job["goodput_pct"] == pytest.approx(row["goodput_pct"])


def test_steps_longer_than_their_interval_never_make_goodput_exceed_100(chdb: Client) -> None:
    """Ranks overlap: each reports 1.2 s per step while steps complete every second (100.01 % was seen)."""
    events = [e for e in _hung_job(stall_s=0.0) if e.type != "StepCompleted"]
    started = events[0].record["ts"]
    events += [
        Event("StepCompleted", e.record | {"step_time_s": 1.2})
        for e in steps("hung", "h1", 1, 40, started, ranks=2, step_s=1.0)
    ]
    store(chdb, events)
    row = _rows(chdb, "SELECT * FROM run_efficiency")[0]
    assert sum(1.2 for _ in range(40)) > row["wall_s"]  # the reported step times add up to more than the run
    assert row["step_s"] == pytest.approx(40.0)  # each step credited its 1-second interval
    assert row["productive_s"] + row["stall_s"] == pytest.approx(row["wall_s"])
    assert row["goodput_pct"] == pytest.approx(100 * 40 / row["wall_s"]) and row["goodput_pct"] <= 100
    assert _rows(chdb, "SELECT goodput_pct FROM job_efficiency")[0]["goodput_pct"] <= 100


def test_the_roll_ups_hold_what_the_raw_tables_hold_and_a_retried_insert_counts_once(chdb: Client) -> None:
    events = scenario()
    store(chdb, events)  # `store` writes every batch twice: the second insert is deduplicated by its token
    by_step = _rows(
        chdb,
        "SELECT job_id, run_id, step, sum(reports) AS reports, max(step_time_s) AS step_s, sum(tokens) AS tokens, "
        "max(done_ts) AS done FROM run_step_progress GROUP BY ALL ORDER BY ALL",
    )
    raw = _rows(
        chdb,
        "SELECT job_id, run_id, step, count() AS reports, max(step_time_s) AS step_s, sum(tokens) AS tokens, "
        "max(ts) AS done FROM steps GROUP BY ALL ORDER BY ALL",
    )
    assert by_step == raw and len(raw) == 10 + 8 + 20
    energy = _rows(
        chdb,
        "SELECT job_id, node, gpu_uuid, min(energy_min) AS low, max(energy_max) AS high, "
        "min(first_ts) AS first, max(last_ts) AS last FROM gpu_energy_minute GROUP BY ALL ORDER BY ALL",
    )
    raw_energy = _rows(
        chdb,
        "SELECT ifNull(job_id, '') AS job_id, node, gpu_uuid, min(energy_mj) AS low, max(energy_mj) AS high, "
        "min(ts) AS first, max(ts) AS last FROM gpu_samples GROUP BY ALL ORDER BY ALL",
    )
    assert energy == raw_energy and len(energy) == 8


def test_a_store_made_before_the_roll_ups_is_backfilled_by_the_migration(chdb_dsn: str) -> None:
    """Rows stored at schema version 8 (no roll-ups) reach the roll-ups when version 9 is applied."""
    from sinks.clickhouse import connect
    from sinks.ddl import MIGRATIONS, applied_versions, migrate

    client = connect(chdb_dsn)
    applied_versions(client)  # the migrations table
    for migration in MIGRATIONS:
        if migration.version < 9:
            for statement in migration.statements(30):
                client.command(statement)
            client.command(f"INSERT INTO schema_migrations VALUES ({migration.version}, 'old', now64(3))")
    events = scenario()
    store(client, events)
    assert "run_step_progress" not in {r["name"] for r in _rows(client, "SHOW TABLES")}
    assert migrate(client) == [9, 10]  # 10: the job page's roll-ups, backfilled too
    steps_rolled = _rows(client, "SELECT sum(reports) AS n FROM run_step_progress")[0]["n"]
    assert steps_rolled == sum(1 for e in events if e.type == "StepCompleted")
    rollups = next(m for m in MIGRATIONS if m.version == 9)
    for statement in rollups.statements(30):  # applied again (a second migrating process): no change
        client.command(statement)
    assert _rows(client, "SELECT sum(reports) AS n FROM run_step_progress")[0]["n"] == steps_rolled
    expected = expected_runs(events)
    rows = {(r["job_id"], r["run_id"]): r for r in _rows(client, "SELECT * FROM run_efficiency")}
    assert set(rows) == set(expected)
    for key, want in expected.items():
        assert rows[key]["productive_s"] == pytest.approx(want["productive_s"]), key
        assert rows[key]["energy_kwh"] == pytest.approx(want["energy_kwh"]), key


def test_the_simulated_job_stall_counts_as_stall_in_the_command_and_the_job_panel(
    chdb: Client, chdb_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The simulator's `job_stall` (every rank waits 8 minutes for data inside one step), as the
    efficiency command and the job page's panel (`ui.pages.efficiency.efficiency`) report it."""
    import json

    from typer.testing import CliRunner

    from producers.simulator import load_scenario, simulate
    from ranksight.cli import app
    from sinks.ddl import migrate
    from ui.pages.efficiency import efficiency

    migrate(chdb, ttl_days=None)  # simulated time is in the past
    events = list(simulate(load_scenario("job_stall"), 0).events())
    store(chdb, events)
    job = next(e.record["job_id"] for e in events if e.type == "JobStarted")
    (want,) = expected_runs(events).values()
    monkeypatch.setenv("CLICKHOUSE_URL", chdb_dsn)
    monkeypatch.setenv("RANKSIGHT_TTL_DAYS", "3650")
    try:
        result = CliRunner().invoke(app, ["efficiency", "--json", "--runs", "--job", job])
    finally:
        migrate(chdb, ttl_days=None)
    assert result.exit_code == 0, result.output
    job_row, run_row = (json.loads(line) for line in result.stdout.splitlines())
    gpus = run_row["gpus"]
    # The 8-minute stall (and the start-up before the first step) is stall time, not productive.
    assert run_row["stall_s"] == pytest.approx(want["stall_s"]) and run_row["stall_s"] > 8 * 60
    assert job_row["stall_gpu_h"] == pytest.approx(gpus * run_row["stall_s"] / 3600)
    assert job_row["stall_gpu_h"] >= gpus * 8 * 60 / 3600
    assert run_row["productive_s"] == pytest.approx(want["productive_s"])
    assert run_row["productive_s"] + run_row["stall_s"] + run_row["checkpoint_s"] + run_row[
        "evaluation_s"
    ] == pytest.approx(run_row["wall_s"], rel=1e-3)
    # Goodput against the share of minutes with steps: 12 of the 20 minutes had none for 8.
    assert job_row["goodput_pct"] == pytest.approx(100 * run_row["productive_s"] / run_row["wall_s"])
    assert job_row["goodput_pct"] < 100 * (20 - 8) / 20
    panel = efficiency(chdb, job)
    assert panel is not None
    assert panel["goodput_pct"] == pytest.approx(job_row["goodput_pct"], rel=1e-5)
    assert panel["spent_gpu_h"]["stall"] == pytest.approx(job_row["stall_gpu_h"], rel=1e-5)
    assert panel["per_run"][0]["spent_gpu_h"]["stall"] == pytest.approx(
        gpus * run_row["stall_s"] / 3600, rel=1e-5
    )


def test_one_statement_gives_a_job_page_the_same_job_and_run_rows(loaded: tuple[Client, list[Event]]) -> None:
    from sinks.efficiency import PriceList, job_and_runs, job_rows, run_rows
    from sinks.efficiency_sql import RUN_COLUMNS

    client, _ = loaded
    assert tuple(r["name"] for r in _rows(client, "DESCRIBE run_efficiency")) == RUN_COLUMNS
    prices = PriceList.parse(["H100-80GB=3"])
    for job in ("big", "solo", "queued"):
        row, runs = job_and_runs(client, prices, job)
        assert row == job_rows(client, prices, job=job)[0], job
        assert runs == run_rows(client, job=job, prices=prices), job
    assert [r["run_id"] for r in job_and_runs(client, prices, "big")[1]] == ["r1", "r2"]
    assert job_and_runs(client, prices, "nope") == (None, [])
