"""How far each job is and when it will finish: its target (JobStarted) against its steps, at its recent rate.

A run's target is in steps, tokens or epochs (`JobStarted.target_*`, what the trainer was told:
max_steps, a token budget, max_epochs); the first one known is used, in that order. Progress is
the latest step of the job's latest run (tokens: steps x the tokens one step processes, summed
over ranks; epochs: the current epoch plus the share of it done, from the length of the last full
epoch). The rate is the step rate of the latest run over the last `window_s` of its steps, so an
evaluation or a checkpoint pause inside the window slows the estimate as it slows the run. The
estimated time to completion is the remaining work at that rate; none when the target or the rate
is unknown, or the job has ended.

The arithmetic is `schemas.progress.estimate` (re-exported here), which the UI and the alerts
share; `job_progress` works its inputs out of the raw tables, with parameters, never values in SQL
text.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import ClickHouseError as _DriverError

from schemas.progress import RATE_WINDOW_S, Estimate, estimate
from sinks.errors import QueryError

__all__ = ["DEFAULT_WINDOW_S", "Estimate", "JobProgress", "estimate", "job_progress"]

DEFAULT_WINDOW_S = RATE_WINDOW_S
_ENDED = ("completed", "failed")


@dataclass(frozen=True)
class JobProgress:
    """One job's row of `ranksight jobs`."""

    job_id: str
    run_id: str
    team: str
    state: str
    step: int | None
    epoch: int | None
    last_step_ts: int | None  # UTC ms of the latest step
    rate_steps_s: float | None
    target_kind: str | None
    target: float | None
    done: float | None
    fraction: float | None
    eta_s: float | None
    finish_ts: int | None  # UTC ms: latest step + ETA

    def as_dict(self) -> dict[str, Any]:
        """JSON-able row."""
        return asdict(self)


def _rows(client: Client, sql: str, parameters: dict[str, Any]) -> list[dict[str, Any]]:
    try:
        result = client.query(sql, parameters=parameters)
    except _DriverError as exc:
        raise QueryError(str(exc).strip().splitlines()[0]) from exc
    return [dict(zip(result.column_names, row, strict=True)) for row in result.result_rows]


def _ms(value: Any) -> int | None:
    if value is None:
        return None
    if hasattr(value, "timestamp"):
        return int(value.timestamp() * 1000)
    return int(value)


def job_progress(
    client: Client, *, job: str | None = None, team: str | None = None, window_s: float = DEFAULT_WINDOW_S
) -> list[JobProgress]:
    """Progress, rate and ETA of every job that sent a JobStarted (or the one job / team asked for)."""
    clauses: list[str] = []
    params: dict[str, Any] = {"window": float(window_s)}
    if job:
        clauses.append("job_id = %(job)s")
        params["job"] = job
    if team:
        clauses.append("team = %(team)s")
        params["team"] = team
    where = (" WHERE " + " AND ".join(clauses)) if clauses else ""
    jobs = _rows(
        client,
        "SELECT job_id, argMax(run_id, ts) AS run_id, argMax(team, ts) AS team, "
        "argMax(target_steps, ts) AS target_steps, argMax(target_tokens, ts) AS target_tokens, "
        f"argMax(target_epochs, ts) AS target_epochs FROM job_started{where} GROUP BY job_id ORDER BY job_id",
        params,
    )
    if not jobs:
        return []
    ids = {"ids": [j["job_id"] for j in jobs]}
    states = {
        r["job_id"]: r["state"]
        for r in _rows(
            client,
            "SELECT job_id, argMax(state, ts) AS state FROM job_states WHERE job_id IN %(ids)s GROUP BY job_id",
            ids,
        )
    }
    latest = {
        r["job_id"]: r
        for r in _rows(
            client,
            "SELECT job_id, argMax(run_id, ts) AS run_id, max(ts) AS last_ts FROM steps "
            "WHERE job_id IN %(ids)s GROUP BY job_id",
            ids,
        )
    }
    # The latest run's steps in the window before its last step: rate, tokens per step, current epoch.
    recent = {
        r["job_id"]: r
        for r in _rows(
            client,
            "SELECT s.job_id AS job_id, min(s.step) AS first_step, max(s.step) AS last_step, "
            "toUnixTimestamp64Milli(min(s.ts)) AS first_ms, toUnixTimestamp64Milli(max(s.ts)) AS last_ms, "
            "uniqExact(s.step) AS steps, sum(s.tokens) AS tokens, argMax(s.epoch, s.ts) AS epoch "
            "FROM steps AS s INNER JOIN (SELECT job_id, argMax(run_id, ts) AS run_id, max(ts) AS last_ts "
            "FROM steps WHERE job_id IN %(ids)s GROUP BY job_id) AS l ON s.job_id = l.job_id AND s.run_id = l.run_id "
            "WHERE s.ts >= l.last_ts - toIntervalMillisecond(toInt64(%(window)s * 1000)) GROUP BY s.job_id",
            {**ids, "window": float(window_s)},
        )
    }
    epochs: dict[str, list[dict[str, Any]]] = {}
    for r in _rows(
        client,
        "SELECT s.job_id AS job_id, s.epoch AS epoch, min(s.step) AS first_step, max(s.step) AS last_step "
        "FROM steps AS s INNER JOIN (SELECT job_id, argMax(run_id, ts) AS run_id FROM steps "
        "WHERE job_id IN %(ids)s GROUP BY job_id) AS l ON s.job_id = l.job_id AND s.run_id = l.run_id "
        "WHERE s.epoch IS NOT NULL GROUP BY s.job_id, s.epoch ORDER BY s.job_id, s.epoch",
        ids,
    ):
        epochs.setdefault(r["job_id"], []).append(r)
    out = []
    for j in jobs:
        rec = recent.get(j["job_id"])
        state = states.get(j["job_id"], "running")
        step = int(rec["last_step"]) if rec else None
        rate = None
        tokens_per_step = None
        if rec:
            span_s = (rec["last_ms"] - rec["first_ms"]) / 1000
            if span_s > 0 and rec["last_step"] > rec["first_step"]:
                rate = (rec["last_step"] - rec["first_step"]) / span_s
            if rec["tokens"] and rec["steps"]:
                tokens_per_step = rec["tokens"] / rec["steps"]
        epoch = rec.get("epoch") if rec else None
        first_of_epoch = steps_per_epoch = None
        runs = epochs.get(j["job_id"], [])
        for e in runs:
            if e["epoch"] == epoch:
                first_of_epoch = int(e["first_step"])
        full = [e for e in runs if epoch is not None and e["epoch"] < epoch]
        if full:
            steps_per_epoch = float(full[-1]["last_step"] - full[-1]["first_step"] + 1)
        est = estimate(
            step=step,
            rate_steps_s=rate,
            target_steps=j["target_steps"],
            target_tokens=j["target_tokens"],
            target_epochs=j["target_epochs"],
            tokens_per_step=tokens_per_step,
            epoch=epoch,
            epoch_first_step=first_of_epoch,
            steps_per_epoch=steps_per_epoch,
            ended=state in _ENDED,
        )
        last_ms = int(rec["last_ms"]) if rec else _ms(latest.get(j["job_id"], {}).get("last_ts"))
        out.append(
            JobProgress(
                job_id=j["job_id"],
                run_id=(rec and latest[j["job_id"]]["run_id"]) or j["run_id"],
                team=j["team"],
                state=state,
                step=step,
                epoch=epoch,
                last_step_ts=last_ms,
                rate_steps_s=rate,
                target_kind=est.target_kind,
                target=est.target,
                done=est.done,
                fraction=est.fraction,
                eta_s=est.eta_s,
                finish_ts=None if est.eta_s is None or last_ms is None else last_ms + int(est.eta_s * 1000),
            )
        )
    return out
