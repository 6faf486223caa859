"""The fleet page (`/`): every job's progress, health and firing alerts, from the store."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from clickhouse_connect.driver.client import Client

from ui.alerts import fold_muted
from ui.pages.common import (
    MINUTE_MS,
    PLAUSIBLE_MINUTE,
    PLAUSIBLE_TS,
    fetch_rows,
    ms_of,
    plausible_bounds,
    rounded,
    store_alerts,
)
from ui.pages.efficiency import fleet_goodput

__all__ = ["STALLED_MS", "fleet"]
_RECENT_RESOLVED_MS = 6 * 3600_000
_SEVERITIES = ("critical", "warning", "info")
# A job without a step for this long behind the fleet's newest data shows "no progress" and 0 steps/s.
STALLED_MS = 120_000


# --- fleet -------------------------------------------------------------------------------------------


def fleet(client: Client, goodput: bool = True, kinds: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Every job with its health, and the alerts firing and recently resolved (routed teams included).

    A muted alert (`inhibited_by`) carries `muted_by` (its cause) and its cause `mutes`: the page
    lists it under the cause, and a job's firing counts leave it out. `kinds`: receiver -> page,
    inform or escalate (the ownership file's), so each routed copy says whether it paged.

    `goodput=False` leaves `goodput_pct` unset (None): the efficiency views scan every step row, so
    the server answers them apart (`fleet_goodput`, cached) and the page fills the column in after.
    """
    jobs: dict[str, dict[str, Any]] = {}
    lo, hi = plausible_bounds()
    for row in fetch_rows(
        client,
        "SELECT job_id, argMax(run_id, ts), argMax(team, ts), argMax(owner, ts), argMax(cluster, ts), "
        "argMax(model_name, ts), argMax(world_size, ts), argMax(gpu_class, ts), "
        f"{ms_of('min(ts)')} FROM job_started WHERE {PLAUSIBLE_TS} GROUP BY job_id",
        lo=lo,
        hi=hi,
    ):
        jobs[row[0]] = {
            "job_id": row[0],
            "run_id": row[1],
            "team": row[2],
            "owner": row[3],
            "cluster": row[4],
            "model": row[5],
            "world_size": int(row[6]),
            "gpu_class": row[7],
            "started_ms": int(row[8]),
            "state": None,
            "last_progress_ms": None,
            "last_step": None,
            "step_rate": None,
            "progress_time_frac": None,
            "goodput_pct": None,
            "firing": {s: 0 for s in _SEVERITIES},
        }
    for job_id, state, reason in fetch_rows(
        client, "SELECT job_id, argMax(state, ts), argMax(reason, ts) FROM job_states GROUP BY job_id"
    ):
        if job_id in jobs:
            jobs[job_id]["state"] = state
            jobs[job_id]["state_reason"] = reason
    # Progress from the per-minute roll-up; the step rate over the last five minutes of each job.
    minutes: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for job_id, minute_ms, last_step in fetch_rows(
        client,
        "SELECT job_id, toUnixTimestamp(minute) * 1000 AS m, max(last_step) FROM job_step_minute "
        f"WHERE {PLAUSIBLE_MINUTE} GROUP BY job_id, m ORDER BY job_id, m",
        lo=lo,
        hi=hi,
    ):
        minutes[job_id].append((int(minute_ms), int(last_step)))
    newest_minute = max((series[-1][0] for series in minutes.values()), default=0)
    for job_id, series in minutes.items():
        # Not ML goodput (nothing stores useful work yet): the share of the minutes from the job's first
        # step to the fleet's newest one that have steps; a stalled job falls behind.
        spanned = (newest_minute - series[0][0]) // MINUTE_MS + 1
        job = jobs.setdefault(job_id, _unknown_job(job_id))
        job["progress_time_frac"] = rounded(len(series) / spanned, 3)
        job["last_step"] = series[-1][1]
        # Over the fleet's last five minutes: a job that stopped stepping before them runs at 0 steps/s.
        window = [p for p in series if p[0] >= newest_minute - 5 * MINUTE_MS]
        if not window:
            job["step_rate"] = 0.0
        elif len(window) >= 2 and window[-1][0] > window[0][0]:
            job["step_rate"] = rounded(
                (window[-1][1] - window[0][1]) / ((window[-1][0] - window[0][0]) / 1000), 3
            )
    if minutes:
        for job_id, last_ms, last_step in fetch_rows(
            client,
            f"SELECT job_id, {ms_of('max(ts)')}, max(step) FROM steps "
            f"WHERE {PLAUSIBLE_TS} AND (job_id, toStartOfMinute(ts)) IN "
            f"(SELECT job_id, max(minute) FROM job_step_minute WHERE {PLAUSIBLE_MINUTE} GROUP BY job_id) "
            "GROUP BY job_id",
            lo=lo,
            hi=hi,
        ):
            jobs[job_id]["last_progress_ms"] = int(last_ms)
            jobs[job_id]["last_step"] = int(last_step)
    if goodput:
        for job_id, pct in fleet_goodput(client).items():
            if job_id in jobs:
                jobs[job_id]["goodput_pct"] = pct
    alerts = store_alerts(client, kinds=kinds)
    fold_muted(alerts)
    data_now = max(
        [a["updated_ms"] for a in alerts] + [j["last_progress_ms"] or 0 for j in jobs.values()] + [0]
    )
    for job in jobs.values():
        # A job with no step for over STALLED_MS while the fleet moved on is stepping at 0/s now,
        # whatever it did in the minutes before.
        if job["last_progress_ms"] is not None and data_now - job["last_progress_ms"] > STALLED_MS:
            job["step_rate"] = 0.0
    firing = [a for a in alerts if a["status"] == "firing"]
    resolved = [
        a
        for a in alerts
        if a["status"] == "resolved" and (a["ends_ms"] or 0) >= data_now - _RECENT_RESOLVED_MS
    ]
    for alert in firing:
        owner = jobs.get(alert["job_id"])
        if owner is not None and alert["severity"] in owner["firing"] and not alert["muted_by"]:
            owner["firing"][alert["severity"]] += 1
    ordered = sorted(
        jobs.values(),
        key=lambda j: (-j["firing"]["critical"], -j["firing"]["warning"], -j["firing"]["info"], j["job_id"]),
    )
    return {
        "now_ms": data_now,
        "jobs": ordered,
        "teams": sorted({j["team"] for j in jobs.values() if j["team"]}),
        "clusters": sorted({j["cluster"] for j in jobs.values() if j["cluster"]}),
        "firing": sorted(firing, key=lambda a: (_SEVERITIES.index(a["severity"]), -a["starts_ms"])),
        "resolved": sorted(resolved, key=lambda a: -(a["ends_ms"] or 0)),
    }


def _unknown_job(job_id: str) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "run_id": "",
        "team": "",
        "owner": "",
        "cluster": "",
        "model": "",
        "world_size": 0,
        "gpu_class": "",
        "started_ms": None,
        "state": None,
        "last_progress_ms": None,
        "last_step": None,
        "step_rate": None,
        "progress_time_frac": None,
        "goodput_pct": None,
        "firing": {s: 0 for s in _SEVERITIES},
    }
