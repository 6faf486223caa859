"""Job facts that are not time series: progress towards the target with its ETA, and the checkpoint facts.

Pure arithmetic over what the store (`ui.pages`) or a recording (`ui.pages.recording`) holds, so a served
page and a report say the same. Progress is `sinks.progress.estimate` (the arithmetic `ranksight jobs`
uses) fed the inputs `sinks.progress.job_progress` works out: the latest run's last step, its step
rate and tokens per step over the last `PROGRESS_WINDOW_S` of its steps, its epoch and the length of
its last full epoch. (`job_progress` itself is not called: it binds values into the SQL text
client-side, and the pages send values only as query parameters.)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sinks.progress import DEFAULT_WINDOW_S, estimate

__all__ = [
    "OVERDUE_MIN_S",
    "PROGRESS_WINDOW_S",
    "checkpoint_facts",
    "job_condition",
    "progress_panel",
    "without_eta",
]

PROGRESS_WINDOW_S = DEFAULT_WINDOW_S
# States after which a job makes no more progress (`sinks.progress`: no ETA; preempted jobs come back).
_ENDED = ("completed", "failed")
# States in which a job writes nothing more until it is requeued.
TERMINAL = ("completed", "failed", "preempted")


# Firing rules that mean the job is not stepping now, and the word for it.
_STOPPED_RULES = {"job_stall": "stalled", "zombie_job": "stalled", "rank_hang": "hung"}
# A running job whose last step is older than this (or ten of its recent step intervals, if longer)
# than the newest data is overdue: its progress heartbeat stopped, whether or not a rule fired yet.
OVERDUE_MIN_S = 120.0


def job_condition(
    progress: Mapping[str, Any] | None, alerts: Iterable[Mapping[str, Any]], now_ms: int
) -> dict[str, Any]:
    """What the job is doing now, before any average: finished, stalled, hung, overdue or running.

    `progress`: `progress_panel`'s answer; `alerts`: the job's alerts (`status`, `rule`, `starts_ms`,
    `muted_by`); `now_ms`: the newest data the store (or recording) holds. A state that says the job
    is not stepping wins: the page then shows no ETA and says since when (issue 34.2).
    """
    state = (progress or {}).get("state")
    last_ms = (progress or {}).get("last_step_ms")
    if state in TERMINAL:
        return {"kind": "finished", "state": state, "since_ms": last_ms}
    stopped = sorted(
        (int(a["starts_ms"]), _STOPPED_RULES[a["rule"]], a["rule"])
        for a in alerts
        if a.get("status") == "firing" and a.get("rule") in _STOPPED_RULES
    )
    if stopped:
        since, kind, rule = stopped[0]
        return {
            "kind": kind,
            "state": state,
            "since_ms": last_ms if last_ms is not None else since,
            "rule": rule,
        }
    rate = (progress or {}).get("rate_steps_s")
    allowed_s = max(OVERDUE_MIN_S, 10 / rate) if rate else OVERDUE_MIN_S
    if last_ms is not None and (now_ms - last_ms) / 1000 > allowed_s:
        return {"kind": "overdue", "state": state, "since_ms": last_ms, "allowed_s": round(allowed_s, 1)}
    return {"kind": "running", "state": state, "since_ms": None}


def without_eta(progress: dict[str, Any], condition: Mapping[str, Any]) -> dict[str, Any]:
    """The progress panel with no ETA while the job is not stepping (an ETA at yesterday's rate misleads)."""
    if condition["kind"] in ("stalled", "hung", "overdue"):
        progress.update(eta_s=None, finish_ms=None)
    return progress


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def progress_panel(
    targets: Mapping[str, Any],
    window: Mapping[str, Any] | None,
    epochs: Sequence[tuple[int, int, int]],
    state: str | None,
) -> dict[str, Any]:
    """Progress, step rate and ETA of a job.

    `targets`: `target_steps`, `target_tokens`, `target_epochs` of its latest JobStarted. `window`:
    its latest run's steps over the last `PROGRESS_WINDOW_S` before its last step (`first_step`,
    `last_step`, `first_ms`, `last_ms`, `steps` distinct, `tokens` summed over ranks, `epoch` of the
    last step), None without steps. `epochs`: (epoch, first step, last step) of that run, by epoch.
    """
    step = int(window["last_step"]) if window else None
    rate = tokens_per_step = None
    if window:
        span_s = (window["last_ms"] - window["first_ms"]) / 1000
        if span_s > 0 and window["last_step"] > window["first_step"]:
            rate = (window["last_step"] - window["first_step"]) / span_s
        if window["tokens"] and window["steps"]:
            tokens_per_step = window["tokens"] / window["steps"]
    epoch = window.get("epoch") if window else None
    first_of_epoch = steps_per_epoch = None
    for number, first, _ in epochs:
        if number == epoch:
            first_of_epoch = int(first)
    full = [e for e in epochs if epoch is not None and e[0] < epoch]
    if full:
        steps_per_epoch = float(full[-1][2] - full[-1][1] + 1)
    est = estimate(
        step=step,
        rate_steps_s=rate,
        target_steps=targets.get("target_steps"),
        target_tokens=targets.get("target_tokens"),
        target_epochs=targets.get("target_epochs"),
        tokens_per_step=tokens_per_step,
        epoch=epoch,
        epoch_first_step=first_of_epoch,
        steps_per_epoch=steps_per_epoch,
        ended=state in _ENDED,
    )
    last_ms = int(window["last_ms"]) if window else None
    return {
        "step": step,
        "epoch": epoch,
        "state": state,
        "last_step_ms": last_ms,
        "rate_steps_s": _round(rate, 4),
        "target_kind": est.target_kind,
        "target": est.target,
        "done": _round(est.done, 3),
        "fraction": _round(est.fraction, 5),
        "eta_s": _round(est.eta_s, 1),
        "finish_ms": None if est.eta_s is None or last_ms is None else last_ms + int(est.eta_s * 1000),
    }


def checkpoint_facts(
    records: Iterable[Mapping[str, Any]], now_ms: int, max_age_s: float | None
) -> dict[str, Any] | None:
    """The job's last checkpoint, its latest verified one and its age at `now_ms`, and retention.

    `records`: every phase of the job's checkpoints (`checkpoint_id`, `step`, `phase`, `ts` in UTC ms,
    `retention_keep`, `deleted`), any order. `max_age_s`: the job's policy (JobStarted
    `checkpoint_max_age_s`): the verified checkpoint is stale past it. None without checkpoints.
    """
    rows = sorted(records, key=lambda r: (int(r["ts"]), str(r["checkpoint_id"]), str(r["phase"])))
    if not rows:
        return None

    def latest(phase: str) -> Mapping[str, Any] | None:
        found = [r for r in rows if r["phase"] == phase]
        return found[-1] if found else None

    completed, verified = latest("completed"), latest("verified")
    deleted = sorted({str(d) for r in rows for d in r.get("deleted") or ()})
    keeps = [r for r in rows if r.get("retention_keep") is not None]
    age_s = None if verified is None else (now_ms - int(verified["ts"])) / 1000
    return {
        "last_completed": None if completed is None else _phase(completed),
        "last_verified": None if verified is None else _phase(verified),
        "verified_age_s": _round(age_s, 1),
        "max_age_s": max_age_s,
        "stale": bool(max_age_s and age_s is not None and age_s > max_age_s),
        "retention_keep": None if not keeps else int(keeps[-1]["retention_keep"]),
        "deleted": deleted,
        # Retention deleted the only checkpoint a restore can trust (the checkpoint_retention rule's case).
        "verified_deleted": verified is not None and str(verified["checkpoint_id"]) in deleted,
        "failed": sum(1 for r in rows if r["phase"] == "failed"),
        "verify_failed": sum(1 for r in rows if r["phase"] == "verify_failed"),
    }


def _phase(record: Mapping[str, Any]) -> dict[str, Any]:
    return {"id": str(record["checkpoint_id"]), "step": int(record["step"]), "ts": int(record["ts"])}
