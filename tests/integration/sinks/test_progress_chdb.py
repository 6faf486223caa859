"""`ranksight jobs` on chDB: progress of the latest run towards each job's target and the ETA at its recent
step rate, computed here independently from the same events."""

from __future__ import annotations

import time
from typing import Any

import pytest
from clickhouse_connect.driver.client import Client

from schemas.records import Event
from schemas.topics import topic_for
from sinks.progress import job_progress
from sinks.writer import ClickHouseSink

S = 1000
T = (int(time.time()) - 2 * 3600) * S  # recent: the raw tables keep 30 days


def started(job: str, run: str, ts: int, **target: Any) -> Event:
    return Event("JobStarted", {
        "ts": ts, "job_id": job, "run_id": run, "owner": "ann", "team": "nlp", "cluster": "c1",
        "world_size": 2, "nodes": ["n1"], **target,
    })  # fmt: skip


def steps(
    job: str, run: str, first: int, last: int, t0: int, *, step_s: float, epoch_steps: int = 0
) -> list[Event]:
    return [
        Event(
            "StepCompleted",
            {
                "ts": t0 + int((n - first + 1) * step_s * S),
                "job_id": job,
                "run_id": run,
                "rank": rank,
                "step": n,
                "tokens": 1000,
                "step_time_s": step_s,
                "epoch": n // epoch_steps if epoch_steps else None,
            },
        )
        for n in range(first, last + 1)
        for rank in range(2)
    ]


def store(client: Client, events: list[Event]) -> None:
    sink = ClickHouseSink(client)
    for offset, event in enumerate(events):
        sink.add(topic_for(event.type), 0, offset, event)
    for topic, partition in sink.pending():
        batch = sink.flush(topic, partition)
        if batch is not None:
            sink.write(batch)


@pytest.fixture
def loaded(chdb: Client) -> Client:
    events = [
        # steps: a restart from step 40; the latest run steps at 0.5 s.
        started("steps", "r0", T, target_steps=1000),
        *steps("steps", "r0", 0, 50, T, step_s=1.0),
        started("steps", "r1", T + 100 * S, target_steps=1000),
        *steps("steps", "r1", 40, 139, T + 100 * S, step_s=0.5),
        # tokens: 2 ranks x 1000 tokens a step, 1 step/s.
        started("tokens", "r0", T, target_tokens=1_000_000),
        *steps("tokens", "r0", 0, 99, T, step_s=1.0),
        # epochs of 30 steps, 2 steps/s.
        started("epochs", "r0", T, target_epochs=4.0),
        *steps("epochs", "r0", 0, 74, T, step_s=0.5, epoch_steps=30),
        # no target; a completed job.
        started("open", "r0", T),
        *steps("open", "r0", 0, 20, T, step_s=1.0),
        started("done", "r0", T, target_steps=30),
        *steps("done", "r0", 0, 29, T, step_s=1.0),
        Event("JobStateChanged", {"ts": T + 40 * S, "job_id": "done", "run_id": "r0", "state": "completed"}),
    ]
    store(chdb, events)
    return chdb


def test_progress_and_eta_per_job(loaded: Client) -> None:
    rows = {r.job_id: r for r in job_progress(loaded, window_s=600)}
    steps_row = rows["steps"]
    assert (steps_row.run_id, steps_row.step, steps_row.target_kind) == ("r1", 139, "steps")
    assert steps_row.rate_steps_s == pytest.approx(2.0, rel=0.02)
    assert steps_row.fraction == pytest.approx(0.14) and steps_row.eta_s == pytest.approx(860 / 2.0, rel=0.02)
    assert steps_row.finish_ts == steps_row.last_step_ts + int(steps_row.eta_s * 1000)
    tokens_row = rows["tokens"]
    assert tokens_row.done == pytest.approx(200_000) and tokens_row.eta_s == pytest.approx(400.0, rel=0.02)
    epochs_row = rows["epochs"]
    assert epochs_row.epoch == 2 and epochs_row.done == pytest.approx(2.5)
    assert epochs_row.eta_s == pytest.approx(45 / 2.0, rel=0.03)
    assert rows["open"].target_kind is None and rows["open"].eta_s is None
    assert rows["done"].state == "completed" and rows["done"].fraction == 1.0 and rows["done"].eta_s is None
    assert [r.job_id for r in job_progress(loaded, job="tokens")] == ["tokens"]


def test_the_cli_prints_progress_and_eta(
    loaded: Client, chdb_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from ranksight.cli import app
    from sinks.clickhouse import close

    close(chdb_dsn)  # chDB: one engine per process; the command opens it again
    monkeypatch.setenv("CLICKHOUSE_URL", chdb_dsn)
    result = CliRunner().invoke(app, ["jobs"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].split()[:3] == ["job", "team", "state"] and "\x1b[" not in result.output
    row = next(line for line in lines if line.startswith("steps "))
    assert "1,000 steps" in row and "(14.0%)" in row and "7m10s" in row  # 860 steps at 2/s
    # The target and done columns of a job without a target are "-" (read by the header's columns:
    # the state column has words of its own, e.g. "running, stalled since ...").
    header = lines[0]
    open_row = next(line for line in lines if line.startswith("open "))
    start, end = header.index("target"), header.index("steps/s")
    assert open_row[start:end].split()[:1] == ["-"], (header, open_row)
    missing = CliRunner().invoke(app, ["jobs", "--job", "nope"])
    assert missing.exit_code == 1 and "no job recorded as nope" in missing.output
