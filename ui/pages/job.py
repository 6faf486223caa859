"""The job page (`/jobs/<id>`): its frame (identity, range, buckets, ranks), header, progress and timeline panels.

`job_page` reads every panel from the store on one time axis; `job_report` folds the same page
from a recording in two passes (`ui.pages.recording.Scan`, then `Panels`). The rank heatmap and
step series live in `ui.pages.job_steps`, the GPU, host, loader and collective panels (a big
job's details, answered apart) in `ui.pages.job_details`: each with its SQL and its fold.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from clickhouse_connect.driver.client import Client

from schemas.records import Event
from sinks.efficiency import PriceList
from ui.alerts import fold_muted
from ui.errors import NotFoundError, UiError
from ui.facts import (
    PROGRESS_WINDOW_S,
    checkpoint_facts,
    job_condition,
    progress_panel,
    without_eta,
)
from ui.pages.common import (
    JOB_WHERE,
    MINUTE_MS,
    PLAUSIBLE_MINUTE,
    PLAUSIBLE_TS,
    TARGET_BUCKETS,
    TERMINAL_STATES,
    JobFrame,
    RecordingFrame,
    between,
    bucket_ms,
    fetch_rows,
    ms_of,
    plausible_bounds,
    rounded,
    store_actions,
    store_alerts,
)
from ui.pages.compare import (
    CompareFold,
    Run,
    assemble,
    choose_runs,
    config_of,
    step_bucket,
)
from ui.pages.efficiency import efficiency
from ui.pages.job_details import GPU_WHERE, DetailFold, details_panels, gpu_keys
from ui.pages.job_steps import StepFold, rank_heatmap, step_series
from ui.pages.recording import EventSource, Scan, ScannedJob, alert_rows
from ui.rows import RowLayout, row_layout

__all__ = [
    "MAX_FAULTS",
    "Panels",
    "finished_fingerprint",
    "fold_alerts",
    "job_details",
    "job_page",
    "job_report",
    "recording_frame",
]


def _job_meta(client: Client, job_id: str) -> dict[str, Any]:
    lo, hi = plausible_bounds()
    rows = fetch_rows(
        client,
        "SELECT argMax(run_id, ts), argMax(team, ts), argMax(owner, ts), argMax(cluster, ts), "
        "argMax(model_name, ts), argMax(model_version, ts), argMax(dataset_version, ts), "
        "argMax(world_size, ts), argMax(nodes, ts), argMax(gpu_class, ts), argMax(workload_family, ts), "
        "argMax(target_steps, ts), argMax(target_tokens, ts), argMax(target_epochs, ts), "
        "argMax(checkpoint_max_age_s, ts), argMax(image, ts), argMax(workspace, ts), "
        f"{ms_of('min(ts)')}, count() FROM job_started WHERE {JOB_WHERE} AND {PLAUSIBLE_TS}",
        job=job_id,
        lo=lo,
        hi=hi,
    )
    if not rows or not rows[0][-1]:
        return {"job_id": job_id, "team": "", "owner": "", "cluster": "", "nodes": [], "world_size": 0}
    r = rows[0]
    return {
        "job_id": job_id,
        "run_id": r[0],
        "team": r[1],
        "owner": r[2],
        "cluster": r[3],
        "model": f"{r[4]} {r[5]}".strip(),
        "dataset_version": r[6],
        "world_size": int(r[7]),
        "nodes": list(r[8]),
        "gpu_class": r[9],
        "workload_family": r[10],
        "target_steps": r[11],
        "target_tokens": r[12],
        "target_epochs": rounded(r[13], 6),
        "checkpoint_max_age_s": rounded(r[14], 6),
        "image": r[15],  # where the job runs (issue 35.5)
        "workspace": r[16],
        "started_ms": int(r[17]),
    }


def _job_span(client: Client, job_id: str) -> tuple[int, int] | None:
    # Only plausible times make the span: one record stamped 2199 must not stretch the job to 2199.
    lo, hi = plausible_bounds()
    rows = fetch_rows(
        client,
        "SELECT toUnixTimestamp(min(minute)) * 1000, toUnixTimestamp(max(minute)) * 1000 + 60000, count() "
        f"FROM job_step_minute WHERE {JOB_WHERE} AND {PLAUSIBLE_MINUTE}",
        job=job_id,
        lo=lo,
        hi=hi,
    )
    if rows and rows[0][2]:
        return int(rows[0][0]), int(rows[0][1])
    rows = fetch_rows(
        client,
        f"SELECT {ms_of('min(ts)')}, {ms_of('max(ts)')} + 1, count() FROM steps WHERE {JOB_WHERE} AND {PLAUSIBLE_TS}",
        job=job_id,
        lo=lo,
        hi=hi,
    )
    if rows and rows[0][2]:
        return int(rows[0][0]), int(rows[0][1])
    return None


def _quiet_until(client: Client, job_id: str) -> int | None:
    """Where the range of a job that stopped stepping ends: its last state change or alert record, and,
    while it is not in a terminal state, the newest step the store holds of any job (UTC ms).

    A stalled job's steps end where the stall begins; ending its page there would hide the stall
    (and its 0 steps/s, its idle GPUs, the alert that fired).
    """
    lo, hi = plausible_bounds()
    rows = fetch_rows(
        client,
        f"SELECT (SELECT argMax(state, ts) FROM job_states WHERE {JOB_WHERE}), "
        f"(SELECT {ms_of('max(ts)')} FROM job_states WHERE {JOB_WHERE} AND {PLAUSIBLE_TS}), "
        f"(SELECT {ms_of('max(ts)')} FROM alerts WHERE {JOB_WHERE} AND {PLAUSIBLE_TS}), "
        "(SELECT toUnixTimestamp(max(minute)) * 1000 + 60000 FROM job_step_minute "
        f"WHERE {PLAUSIBLE_MINUTE})",
        job=job_id,
        lo=lo,
        hi=hi,
    )
    if not rows:
        return None
    state, state_ms, alert_ms, newest_ms = rows[0]
    ends = [int(v) + 1 for v in (state_ms, alert_ms) if v and int(v) >= lo]
    if state not in TERMINAL_STATES and newest_ms:
        ends.append(int(newest_ms))
    return max(ends) if ends else None


def _ranks(client: Client, job_id: str) -> list[dict[str, Any]]:
    rows = fetch_rows(
        client,
        "SELECT rank, argMax(node, ts), argMax(gpu_index, ts), argMax(gpu_uuid, ts) FROM rank_bound "
        f"WHERE {JOB_WHERE} GROUP BY rank ORDER BY rank",
        job=job_id,
    )
    return [{"rank": int(r[0]), "node": r[1], "gpu_index": r[2], "gpu_uuid": r[3]} for r in rows]


def _validation(client: Client, job_id: str, t0: int, t1: int) -> dict[str, list[list[Any]]]:
    out: dict[str, list[list[Any]]] = defaultdict(list)
    for ts, step, name, value in fetch_rows(
        client,
        f"SELECT {ms_of('ts')}, step, k, v FROM validation_results ARRAY JOIN mapKeys(metrics) AS k, "
        f"mapValues(metrics) AS v WHERE {JOB_WHERE} AND {between('ts')} ORDER BY ts",
        job=job_id,
        t0=t0,
        t1=t1,
    ):
        out[name].append([int(ts), rounded(value, 5), int(step)])
    return dict(out)


# Rank faults shown at most (a crash loop of a 16k-rank job writes thousands).
MAX_FAULTS = 500


def _faults(
    client: Client,
    job_id: str,
    cluster: str,
    ranks: list[dict[str, Any]],
    t0: int,
    t1: int,
    layout: RowLayout | None = None,
) -> dict[str, Any]:
    """Rank faults (`RankFault`: exception, exit, CUDA OOM, ...) and GPU faults (XID events, uncorrected ECC)
    of the job's GPUs in the range."""
    rank_faults = [
        {"ts": int(r[0]), "rank": int(r[1]), "node": r[2], "kind": r[3], "detail": r[4], "exit_code": r[5]}
        for r in fetch_rows(
            client,
            f"SELECT {ms_of('ts')}, rank, node, kind, detail, exit_code FROM rank_faults "
            f"WHERE {JOB_WHERE} AND {between('ts')} ORDER BY ts, rank, kind LIMIT {{limit:UInt32}}",
            job=job_id,
            t0=t0,
            t1=t1,
            limit=MAX_FAULTS,
        )
    ]
    keys = gpu_keys(ranks)
    gpu_faults: list[dict[str, Any]] = []
    if keys:
        grouped = layout is not None and layout.grouped
        where = "cluster = {cluster:String} AND node IN {nodes:Array(String)}" if grouped else GPU_WHERE
        params: dict[str, Any] = {
            "cluster": cluster,
            "nodes": sorted({n for n, _ in keys}),
            "t0": t0,
            "t1": t1,
        }
        if not grouped:
            params["keys"] = [(n, int(g)) for n, g in keys]
        for node, gpu, first, last, xids, ecc, xid_samples in fetch_rows(
            client,
            f"SELECT node, gpu_index, {ms_of('min(ts)')}, {ms_of('max(ts)')}, "
            "arraySort(groupUniqArrayIf(xid, xid IS NOT NULL)), max(ecc_uncorrected), countIf(xid IS NOT NULL) "
            f"FROM gpu_samples WHERE {where} AND {between('ts')} AND (xid IS NOT NULL OR ecc_uncorrected > 0) "
            "GROUP BY node, gpu_index ORDER BY node, gpu_index",
            **params,
        ):
            gpu_faults.append(
                {
                    "node": node,
                    "gpu_index": int(gpu),
                    "first_ms": int(first),
                    "last_ms": int(last),
                    "xids": [int(x) for x in xids],
                    "xid_samples": int(xid_samples),
                    "ecc_uncorrected": None if ecc is None else int(ecc),
                }
            )
    return {"ranks": rank_faults, "gpus": gpu_faults}


def _progress(client: Client, job_id: str, meta: dict[str, Any]) -> dict[str, Any]:
    """Progress towards the target and the ETA (`ui.facts.progress_panel`), at the job's latest step."""
    lo, hi = plausible_bounds()
    latest = fetch_rows(
        client,
        f"SELECT argMax(run_id, ts), {ms_of('max(ts)')}, count() FROM steps WHERE {JOB_WHERE} AND {PLAUSIBLE_TS} "
        f"AND ts >= (SELECT max(minute) FROM job_step_minute WHERE {JOB_WHERE} AND {PLAUSIBLE_MINUTE})",
        job=job_id,
        lo=lo,
        hi=hi,
    )
    window = None
    epochs: list[tuple[int, int, int]] = []
    if latest and latest[0][2]:
        run, last_ms = str(latest[0][0]), int(latest[0][1])
        params = {"job": job_id, "run": run, "lo": lo, "hi": hi}
        r = fetch_rows(
            client,
            f"SELECT min(step), max(step), {ms_of('min(ts)')}, {ms_of('max(ts)')}, uniqExact(step), sum(tokens), "
            f"argMax(epoch, ts) FROM steps WHERE {JOB_WHERE} AND run_id = {{run:String}} AND {PLAUSIBLE_TS} "
            "AND ts >= fromUnixTimestamp64Milli({from:Int64}, 'UTC')",
            **params,
            **{"from": last_ms - int(PROGRESS_WINDOW_S * 1000)},
        )[0]
        window = {
            "first_step": int(r[0]),
            "last_step": int(r[1]),
            "first_ms": int(r[2]),
            "last_ms": int(r[3]),
            "steps": int(r[4]),
            "tokens": r[5],
            "epoch": r[6],
        }
        # Epoch lengths only matter for a target in epochs (a scan of the run's every step).
        if meta.get("target_epochs") and not (meta.get("target_steps") or meta.get("target_tokens")):
            epochs = [
                (int(e), int(a), int(b))
                for e, a, b in fetch_rows(
                    client,
                    f"SELECT epoch, min(step), max(step) FROM steps WHERE {JOB_WHERE} AND run_id = {{run:String}} "
                    f"AND {PLAUSIBLE_TS} AND epoch IS NOT NULL GROUP BY epoch ORDER BY epoch",
                    **params,
                )
            ]
    state = fetch_rows(
        client, f"SELECT argMax(state, ts), count() FROM job_states WHERE {JOB_WHERE}", job=job_id
    )
    return progress_panel(meta, window, epochs, state[0][0] if state and state[0][1] else None)


def _checkpoint_facts(
    client: Client, job_id: str, now_ms: int, max_age_s: float | None
) -> dict[str, Any] | None:
    """The job's last and last verified checkpoint, its age at the page's end and retention (`ui.facts`)."""
    lo, hi = plausible_bounds()
    rows = fetch_rows(
        client,
        f"SELECT checkpoint_id, step, phase, {ms_of('ts')}, retention_keep, deleted FROM checkpoints "
        f"WHERE {JOB_WHERE} AND {PLAUSIBLE_TS}",
        job=job_id,
        lo=lo,
        hi=hi,
    )
    keys = ("checkpoint_id", "step", "phase", "ts", "retention_keep", "deleted")
    return checkpoint_facts([dict(zip(keys, r, strict=True)) for r in rows], now_ms, max_age_s)


_STARTED_TS = "minIf(ts, phase = 'started')"
# A checkpoint's band ends when it completed or failed, not when it was verified hours later.
_ENDED_TS = "maxIf(ts, phase IN ('completed', 'failed'))"


def _phases(
    client: Client, table: str, id_column: str, job_id: str, t0: int, t1: int
) -> list[dict[str, Any]]:
    # A band per checkpoint or evaluation: started .. last phase, with how it ended.
    name = "any(name)" if table == "evaluations" else "any(uri)"
    rows = fetch_rows(
        client,
        f"SELECT {id_column}, min(step), {ms_of(_STARTED_TS)}, {ms_of(_ENDED_TS)}, "
        f"{ms_of('min(ts)')}, {ms_of('max(ts)')}, argMax(phase, ts), groupUniqArray(phase), {name}, any(error) "
        f"FROM {table} WHERE {JOB_WHERE} AND {between('ts')} "
        f"GROUP BY {id_column} ORDER BY min(ts)",
        job=job_id,
        t0=t0 - 3600_000,
        t1=t1,
    )
    out = []
    for cid, step, started, ended, first, last, phase, phases, label, error in rows:
        start = int(started) if started and int(started) > 0 else int(first)
        last = int(ended) if ended and int(ended) > 0 else int(last)
        done = any(p in ("completed", "failed", "verified", "restored") for p in phases)
        if int(last) < t0 and done:
            continue
        out.append(
            {
                "id": cid,
                "step": int(step),
                "start_ms": start,
                "end_ms": int(last) if done else None,
                "status": phase if done else "open",
                "label": label,
                "error": error,
            }
        )
    return out


def _states(client: Client, job_id: str, t0: int, t1: int) -> list[dict[str, Any]]:
    rows = fetch_rows(
        client,
        f"SELECT {ms_of('ts')}, state, reason, exit_code, restart_count FROM job_states "
        f"WHERE {JOB_WHERE} AND {between('ts')} ORDER BY ts",
        job=job_id,
        t0=t0 - 24 * 3600_000,
        t1=t1,
    )
    return [
        {"ts": int(r[0]), "state": r[1], "reason": r[2], "exit_code": r[3], "restart_count": int(r[4])}
        for r in rows
    ]


def _job_frame(
    client: Client,
    job_id: str,
    t0: int | None,
    t1: int | None,
    target: int,
    nodes: Sequence[str],
    kinds: Mapping[str, str] | None,
) -> JobFrame:
    meta = _job_meta(client, job_id)
    span = _job_span(client, job_id)
    alerts = store_alerts(client, JOB_WHERE, kinds=kinds, job=job_id)
    fold_alerts(client, alerts)
    if span is None and not meta.get("started_ms") and not alerts:
        raise NotFoundError("job", job_id)
    if span is None:
        first = meta.get("started_ms") or min(a["starts_ms"] for a in alerts)
        span = (first, first + MINUTE_MS)
    quiet = _quiet_until(client, job_id)
    if quiet is not None and quiet > span[1]:
        span = (span[0], quiet)
    start = int(t0) if t0 is not None else span[0]
    end = int(t1) if t1 is not None else span[1]
    # A range asked for by URL is cut to the plausible times too (from=0&to=1e15 is 11 million buckets).
    lo, hi = plausible_bounds()
    start, end = min(max(start, lo), hi), min(max(end, lo), hi + MINUTE_MS)
    if end <= start:
        end = start + MINUTE_MS
    width = bucket_ms(end - start, target)
    start = start // width * width
    ranks = _ranks(client, job_id)
    job_nodes = meta.get("nodes") or sorted({r["node"] for r in ranks})
    layout = row_layout(ranks, nodes)
    if nodes:
        ranks = [r for r in ranks if r["node"] in set(nodes)]
        if not ranks:
            raise NotFoundError(f"rank of job {job_id!r} on node", ", ".join(nodes))
    hosts_nodes = sorted({r["node"] for r in ranks}) if nodes else list(job_nodes)
    return JobFrame(job_id, meta, span, alerts, start, end, width, ranks, layout, hosts_nodes)


def job_page(
    client: Client,
    job_id: str,
    t0: int | None = None,
    t1: int | None = None,
    target: int = TARGET_BUCKETS,
    prices: PriceList | None = None,
    with_efficiency: bool = True,
    nodes: Sequence[str] = (),
    kinds: Mapping[str, str] | None = None,
    defer_details: bool = False,
) -> dict[str, Any]:
    """Every panel of a job's page over [t0, t1) (default: the job's whole span), on one time axis.

    The efficiency panel reads views that scan all the job's step rows (seconds for a big job): the
    server leaves it out (`with_efficiency=False`, no `efficiency` key) and answers it apart, cached.
    A job of more than `ui.rows.MAX_RANK_ROWS` ranks gets one heatmap row per node (or group of
    nodes) and bands across its GPUs and hosts; `nodes` drills down to those nodes' ranks. With
    `defer_details`, such a page (grouped or drilled down) leaves its `DETAIL_PANELS` out
    (`"details": "pending"`): the server answers them apart (`job_details`) so the page draws
    before they are read.
    """
    f = _job_frame(client, job_id, t0, t1, target, nodes, kinds)
    start, end, width, span = f.start, f.end, f.width, f.span
    heatmap = rank_heatmap(client, job_id, start, end, width, f.layout)
    page: dict[str, Any] = {
        "job": f.meta,
        "range": {"from_ms": start, "to_ms": end, "bucket_ms": width, "span": list(span)},
        # A grouped page names its rows, not its 16,384 ranks (a megabyte of JSON nobody draws).
        "ranks": [] if f.grouped else f.ranks,
        "heatmap": heatmap,
        "steps": step_series(
            client,
            job_id,
            start,
            end,
            width,
            heatmap["source"] == "derived_rank_windows",
        ),
        "validation": _validation(client, job_id, start, end),
        "faults": _faults(client, job_id, f.meta.get("cluster", ""), f.ranks, start, end, f.layout),
        "progress": _progress(client, job_id, f.meta),
        "checkpoint": _checkpoint_facts(client, job_id, span[1], f.meta.get("checkpoint_max_age_s")),
        "checkpoints": _phases(client, "checkpoints", "checkpoint_id", job_id, start, end),
        "evaluations": _phases(client, "evaluations", "evaluation_id", job_id, start, end),
        "states": _states(client, job_id, start, end),
        "alerts": f.alerts,
        "actions": store_actions(client, JOB_WHERE, job=job_id),
    }
    # State wins over averages: a stalled, hung or overdue job shows no ETA and says since when.
    now_ms = max([span[1], *(a.get("updated_ms") or 0 for a in f.alerts)])
    page["condition"] = job_condition(page["progress"], f.alerts, now_ms)
    without_eta(page["progress"], page["condition"])
    # A big job's panels read all its ranks, GPUs and nodes, drilled down or not.
    if defer_details and f.layout is not None:
        page["details"] = "pending"
    else:
        page.update(details_panels(client, f))
    if with_efficiency:
        page["efficiency"] = efficiency(client, job_id, prices)
    return page


def job_details(
    client: Client,
    job_id: str,
    t0: int,
    t1: int,
    nodes: Sequence[str] = (),
    target: int = TARGET_BUCKETS,
) -> dict[str, Any]:
    """The `DETAIL_PANELS` of a job page over the page's own range (its `from_ms` and `to_ms`)."""
    f = _job_frame(client, job_id, t0, t1, target, nodes, None)
    return {"range": {"from_ms": f.start, "to_ms": f.end, "bucket_ms": f.width}, **details_panels(client, f)}


def fold_alerts(client: Client, alerts: list[dict[str, Any]]) -> None:
    """`fold_muted` over a job's alerts; causes that are not among them (another job's, a node's) are read."""
    known = {a["alert_id"] for a in alerts}
    missing = sorted(
        {a["inhibited_by"] for a in alerts if a["inhibited_by"] and a["inhibited_by"] not in known}
    )
    others = (
        {a["alert_id"]: a for a in store_alerts(client, "alert_id IN {ids:Array(String)}", ids=missing)}
        if missing
        else {}
    )
    fold_muted(alerts, others)


def finished_fingerprint(client: Client, job_id: str) -> tuple[Any, ...] | None:
    """What identifies a finished job's data, None while it runs: its answers can be cached on it.

    The last state must be terminal; the counts of its state changes, step rows, checkpoint phases
    and alert records change with any row that arrives after (a restart, a late record), and with
    them the fingerprint, so a cached answer is never served stale.
    """
    rows = fetch_rows(
        client,
        f"SELECT (SELECT argMax(state, ts) FROM job_states WHERE {JOB_WHERE}), "
        f"(SELECT count() FROM job_states WHERE {JOB_WHERE}), (SELECT count() FROM steps WHERE {JOB_WHERE}), "
        f"(SELECT count() FROM checkpoints WHERE {JOB_WHERE}), (SELECT count() FROM alerts WHERE {JOB_WHERE})",
        job=job_id,
    )
    if not rows or rows[0][0] not in TERMINAL_STATES:
        return None
    return tuple(rows[0])


# What a derived rank window contributes to the page (kept from pass 1 when the detectors run once).
_WINDOW_FIELDS = ("job_id", "window_start", "rank", "compute_s", "step_time_s", "comm_s", "data_wait_s")


def _meta(job_id: str, job: ScannedJob) -> dict[str, Any]:
    r = job.meta_latest
    if r is None:
        return {"job_id": job_id, "team": "", "owner": "", "cluster": "", "nodes": [], "world_size": 0}
    return {
        "job_id": job_id,
        "run_id": r.get("run_id") or "",
        "team": r["team"],
        "owner": r["owner"],
        "cluster": r["cluster"],
        "model": f"{r.get('model_name') or ''} {r.get('model_version') or ''}".strip(),
        "dataset_version": r.get("dataset_version") or "",
        "world_size": int(r["world_size"]),
        "nodes": list(r.get("nodes") or []),
        "gpu_class": r.get("gpu_class") or "",
        "workload_family": r.get("workload_family") or "",
        "target_steps": job.optional.get("target_steps", (0, None))[1],
        "target_tokens": job.optional.get("target_tokens", (0, None))[1],
        "target_epochs": rounded(job.optional.get("target_epochs", (0, None))[1], 6),
        "checkpoint_max_age_s": rounded(job.optional.get("checkpoint_max_age_s", (0, None))[1], 6),
        "image": r.get("image") or "",  # where the job runs (issue 35.5), as the store's argMax
        "workspace": r.get("workspace") or "",
        "started_ms": int(job.started_min or r["ts"]),
    }


def recording_frame(
    found: Scan, job_id: str, t0: int | None, t1: int | None, target: int, kinds: dict[str, str] | None = None
) -> RecordingFrame:
    job = found.jobs.get(job_id)
    if job is None:
        raise NotFoundError("job", job_id)
    meta = _meta(job_id, job)
    span = (job.minutes[0], job.minutes[1] + MINUTE_MS) if job.minutes else None
    alerts = alert_rows(job.alerts, found.lo, found.hi, kinds)
    found.fold(alerts, kinds)
    if span is None and not meta.get("started_ms") and not alerts:
        raise NotFoundError("job", job_id)
    if span is None:
        first = meta.get("started_ms") or min(a["starts_ms"] for a in alerts)
        span = (first, first + MINUTE_MS)
    # `_quiet_until`: a job that is not over runs to the newest step of the recording.
    ends = [v + 1 for v in (job.state_max, job.alert_max) if v and v >= found.lo]
    if (job.state is None or job.state[1] not in TERMINAL_STATES) and found.newest_minute is not None:
        ends.append(found.newest_minute + MINUTE_MS)
    if ends and max(ends) > span[1]:
        span = (span[0], max(ends))
    start = int(t0) if t0 is not None else span[0]
    end = int(t1) if t1 is not None else span[1]
    start, end = min(max(start, found.lo), found.hi), min(max(end, found.lo), found.hi + MINUTE_MS)
    if end <= start:
        end = start + MINUTE_MS
    width = bucket_ms(end - start, target)
    start = start // width * width
    ranks = [
        {"rank": rank, "node": b["node"], "gpu_index": b.get("gpu_index"), "gpu_uuid": b.get("gpu_uuid")}
        for rank, (_, b) in sorted(job.ranks.items())
    ]
    nodes = meta.get("nodes") or sorted({r["node"] for r in ranks})
    keys = sorted({(r["node"], int(r["gpu_index"])) for r in ranks if r["gpu_index"] is not None})
    return RecordingFrame(
        job_id,
        start,
        end,
        width,
        span,
        meta,
        ranks,
        list(nodes),
        keys,
        alerts,
        found.actions_of("job_id", job_id),
        job.latest_step,
        job.state[1] if job.state else None,
        found.lo,
        found.hi,
    )


def _compare_frame(found: Scan, job_id: str) -> tuple[list[Run], str, int]:
    runs, family = choose_runs(list(found.runs.values()), [job_id])
    for run in runs:
        run.config = config_of(found.jobs[run.job_id].started.get(run.run_id, {}))
    width = step_bucket(max((found.last_step.get((r.job_id, r.run_id), 0) for r in runs), default=0))
    return runs, family, width


# --- pass 2: the panels ----------------------------------------------------------------------------


class Panels(StepFold, DetailFold, CompareFold):
    """Pass 2 for one job and range: every panel's aggregates, folded event by event."""

    def __init__(
        self, frame: RecordingFrame, compare_runs: list[Run] | None = None, compare_width: int = 1
    ) -> None:
        self.f = frame
        self._init_steps()
        self._init_details()
        self._init_compare(compare_runs, compare_width)
        self.validation: dict[str, list[list[Any]]] = defaultdict(list)
        self.phases: dict[str, dict[str, dict[str, Any]]] = {"checkpoints": {}, "evaluations": {}}
        self.states: list[dict[str, Any]] = []
        # Progress: the latest run's steps of the window before its last step; epoch lengths.
        self.window: dict[str, Any] | None = None
        self.epochs: dict[int, list[int]] = {}
        self.checkpoint_records: list[dict[str, Any]] = []
        self.rank_faults: list[dict[str, Any]] = []

    def feed(self, event: Event) -> None:
        """Fold one event into the panels it belongs to."""
        kind, r = event.type, event.record
        if kind == "StepCompleted":
            if (r["job_id"], r.get("run_id") or "") in self.compare_keys and not r.get("skipped"):
                self._compare(r)
            if r["job_id"] == self.f.job_id:
                self._step(r)
                self._progress(r)
        elif kind == "GpuSample":
            self._gpu(r)
            self._gpu_extra(r)
        elif kind == "HostSample":
            self._host(r)
        elif r.get("job_id") != self.f.job_id:
            return
        elif kind == "RankWindowStats":
            self._window(r)
        elif kind == "DataLoaderSample":
            self._loader(r)
            self._datapath(r)
        elif kind == "RankFault":
            if self.f.start <= r["ts"] < self.f.end:
                self.rank_faults.append(
                    {
                        "ts": r["ts"],
                        "rank": r["rank"],
                        "node": r.get("node"),
                        "kind": r["kind"],
                        "detail": r.get("detail"),
                        "exit_code": r.get("exit_code"),
                    }
                )
        elif kind == "CollectiveSample":
            self._collective(r)
        elif kind == "ValidationResult":
            if self.f.start <= r["ts"] < self.f.end:
                for name, value in (r.get("metrics") or {}).items():
                    self.validation[name].append([r["ts"], rounded(value, 5), r["step"]])
        elif kind in ("CheckpointEvent", "EvaluationEvent"):
            self._phase(kind, r)
            if kind == "CheckpointEvent" and self.f.lo <= r["ts"] <= self.f.hi:
                self.checkpoint_records.append(r)
        elif kind == "JobStateChanged" and self.f.start - 24 * 3600_000 <= r["ts"] < self.f.end:
            self.states.append(
                {
                    "ts": r["ts"],
                    "state": r["state"],
                    "reason": r.get("reason"),
                    "exit_code": r.get("exit_code"),
                    "restart_count": int(r.get("restart_count") or 0),
                }
            )

    def _phase(self, kind: str, r: dict[str, Any]) -> None:
        f = self.f
        if not f.start - 3600_000 <= r["ts"] < f.end:
            return
        table = "checkpoints" if kind == "CheckpointEvent" else "evaluations"
        key = r["checkpoint_id"] if table == "checkpoints" else r["evaluation_id"]
        p = self.phases[table].get(key)
        ts, phase = r["ts"], r["phase"]
        if p is None:
            p = self.phases[table][key] = {
                "step": r["step"], "started": None, "ended": None, "first": ts, "last": (ts, phase),
                "phases": set(), "label": r.get("name" if table == "evaluations" else "uri"), "error": r.get("error"),
            }  # fmt: skip
        p["step"] = min(p["step"], r["step"])
        p["first"] = min(p["first"], ts)
        if ts >= p["last"][0]:
            p["last"] = (ts, phase)
        p["phases"].add(phase)
        # ClickHouse's any() skips nulls: the first label and error that are set.
        label = r.get("name" if table == "evaluations" else "uri")
        if p["label"] is None and label is not None:
            p["label"] = label
        if p["error"] is None and r.get("error") is not None:
            p["error"] = r.get("error")
        if phase == "started":
            p["started"] = ts if p["started"] is None else min(p["started"], ts)
        if phase in ("completed", "failed"):
            p["ended"] = ts if p["ended"] is None else max(p["ended"], ts)

    def _progress(self, r: dict[str, Any]) -> None:
        # `_progress`: the latest run's plausible steps in the window before its last step.
        f = self.f
        if (
            f.latest_step is None
            or (r.get("run_id") or "") != f.latest_step[1]
            or not f.lo <= r["ts"] <= f.hi
        ):
            return
        epoch = r.get("epoch")
        if epoch is not None:
            span = self.epochs.setdefault(epoch, [r["step"], r["step"]])
            span[0], span[1] = min(span[0], r["step"]), max(span[1], r["step"])
        if r["ts"] < f.latest_step[0] - int(PROGRESS_WINDOW_S * 1000):
            return
        w = self.window
        if w is None:
            w = self.window = {"steps": set(), "tokens": None, "epoch": None}
            w.update(first_step=r["step"], last_step=r["step"], first_ms=r["ts"], last_ms=r["ts"])
        w["first_step"], w["last_step"] = min(w["first_step"], r["step"]), max(w["last_step"], r["step"])
        w["first_ms"], w["last_ms"] = min(w["first_ms"], r["ts"]), max(w["last_ms"], r["ts"])
        w["steps"].add(r["step"])
        if r.get("tokens") is not None:
            w["tokens"] = (w["tokens"] or 0) + r["tokens"]
        if epoch is not None and (w["epoch"] is None or r["ts"] >= w["epoch"][0]):
            w["epoch"] = (r["ts"], epoch)

    # -- the page ---------------------------------------------------------------------------------

    def _progress_panel(self) -> dict[str, Any]:
        f = self.f
        w = self.window
        window = None
        if w is not None:
            window = {k: w[k] for k in ("first_step", "last_step", "first_ms", "last_ms", "tokens")}
            window["steps"] = len(w["steps"])
            window["epoch"] = None if w["epoch"] is None else w["epoch"][1]
        meta = f.meta
        epochs: list[tuple[int, int, int]] = []
        if meta.get("target_epochs") and not (meta.get("target_steps") or meta.get("target_tokens")):
            epochs = [(e, a, b) for e, (a, b) in sorted(self.epochs.items())]
        return progress_panel(meta, window, epochs, f.state)

    def _faults_panel(self) -> dict[str, Any]:
        ranks = sorted(self.rank_faults, key=lambda x: (x["ts"], x["rank"], x["kind"]))[:MAX_FAULTS]
        gpus = [
            {
                "node": node,
                "gpu_index": gpu,
                "first_ms": first,
                "last_ms": last,
                "xids": sorted(xids),
                "xid_samples": count,
                "ecc_uncorrected": ecc,
            }
            for (node, gpu), (first, last, xids, ecc, count) in sorted(self.gpu_faults.items())
        ]
        return {"ranks": ranks, "gpus": gpus}

    def _phases_panel(self, table: str) -> list[dict[str, Any]]:
        out = []
        for key, p in sorted(self.phases[table].items(), key=lambda kv: kv[1]["first"]):
            start = p["started"] if p["started"] else p["first"]
            last = p["ended"] if p["ended"] else p["last"][0]
            done = bool(p["phases"] & {"completed", "failed", "verified", "restored"})
            if last < self.f.start and done:
                continue
            out.append(
                {
                    "id": key,
                    "step": p["step"],
                    "start_ms": start,
                    "end_ms": last if done else None,
                    "status": p["last"][1] if done else "open",
                    "label": p["label"],
                    "error": p["error"],
                }
            )
        return out

    def page(self) -> dict[str, Any]:
        """The job page's JSON (`job_page` without the efficiency panel)."""
        f = self.f
        heatmap = self._heatmap()
        page: dict[str, Any] = {
            "job": f.meta,
            "range": {"from_ms": f.start, "to_ms": f.end, "bucket_ms": f.width, "span": list(f.span)},
            "ranks": f.ranks,
            "heatmap": heatmap,
            "steps": self._steps(heatmap["source"] == "derived_rank_windows"),
            "validation": {k: sorted(v, key=lambda p: p[0]) for k, v in self.validation.items()},
            "gpus": self._gpus(),
            "hosts": self._hosts(),
            "dataloader": self._loader_panel(),
            "collectives": self._collectives_panel(),
            "checkpoints": self._phases_panel("checkpoints"),
            "evaluations": self._phases_panel("evaluations"),
            "states": sorted(self.states, key=lambda s: s["ts"]),
            "alerts": f.alerts,
            "actions": f.actions,
            "datapath": self._datapath_panel(),
            "gpm": self._gpm_panel(),
            "faults": self._faults_panel(),
            "progress": self._progress_panel(),
            "checkpoint": checkpoint_facts(
                self.checkpoint_records, f.span[1], f.meta.get("checkpoint_max_age_s")
            ),
        }
        # State wins over averages: a stalled, hung or overdue job shows no ETA and says since when.
        now_ms = max([f.span[1], *(a.get("updated_ms") or 0 for a in f.alerts)])
        page["condition"] = job_condition(page["progress"], f.alerts, now_ms)
        without_eta(page["progress"], page["condition"])
        return page


def job_report(
    events: EventSource,
    job_id: str,
    *,
    t0: int | None = None,
    t1: int | None = None,
    prices: PriceList | None = None,
    target: int = TARGET_BUCKETS,
    sources: EventSource | None = None,
    kinds: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A job report's data from two passes: the job page, its efficiency panel, its comparison.

    `events` is the replay (source events with the detectors' alerts and derived windows). With
    `sources` (the same source events without detection), the detectors run once: pass 1 keeps the
    job's derived rank windows (six numbers each) and pass 2 reads `sources`.
    """
    from ui.pages.efficiency import RunTally

    lo, hi = plausible_bounds()
    found, tally = Scan(lo, hi), RunTally()
    windows: list[dict[str, Any]] = []
    for event in events():
        found.feed(event)
        tally.plan(event)
        if sources is not None and event.type == "RankWindowStats" and event.record["job_id"] == job_id:
            r = event.record
            windows.append({k: r.get(k) for k in _WINDOW_FIELDS})
    if job_id not in found.jobs or (found.jobs[job_id].minutes is None and not found.jobs[job_id].started):
        jobs = sorted(j for j, info in found.jobs.items() if info.minutes is not None)
        raise UiError(f"job {job_id!r} is not in the recording (it holds: {', '.join(jobs) or 'none'})")
    frame = recording_frame(found, job_id, t0, t1, target, kinds)
    runs, family, width = _compare_frame(found, job_id) if found.jobs[job_id].started else ([], "", 1)
    panels = Panels(frame, runs, width)
    tally.select([job_id] + [r.job_id for r in runs])
    for event in (sources or events)():
        panels.feed(event)
        tally.feed(event)
    for window in windows:
        panels.feed(Event("RankWindowStats", window))
    page = panels.page()
    page["efficiency"] = tally.efficiency(job_id, prices or PriceList())
    page["compare"] = (
        assemble(runs, panels.compare_rows(), width, tally.run_goodput(), family) if runs else None
    )
    page["_events"] = found.events
    return page
