"""Slurm as a source of job states: `squeue --json` polled, `sacct --json` for jobs already purged.

`squeue --json` lists every job slurmctld still holds (pending, running, and ended ones for
`MinJobAge` seconds) with its state, reason, user, account, submit/start/end times, restart
count and exit code. Jobs that vanish before ranksight saw them end are looked up in `sacct`
when accounting is enabled; without it they are dropped (a longer `MinJobAge` avoids that).
Both the JSON of Slurm 22.05 (plain numbers) and of 23.02+ (`{"set": .., "number": ..}`
times, exit codes as objects, state lists) are read.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from producers.scheduler.errors import SchedulerUnavailableError
from producers.scheduler.tracker import JobObservation

__all__ = ["SLURM_STATES", "SlurmSource", "observation_from_slurm", "parse_slurm_json"]

log = logging.getLogger(__name__)

# Slurm job state -> ranksight JobState. Requeues become `restarting`; suspension is a preemption.
SLURM_STATES: dict[str, str] = {
    "PENDING": "pending",
    "CONFIGURING": "running",
    "RUNNING": "running",
    "COMPLETING": "running",
    "RESIZING": "running",
    "SIGNALING": "running",
    "STAGE_OUT": "running",
    "SUSPENDED": "preempted",
    "PREEMPTED": "preempted",
    "REQUEUED": "restarting",
    "REQUEUE_FED": "restarting",
    "REQUEUE_HOLD": "restarting",
    "COMPLETED": "completed",
    "FAILED": "failed",
    "CANCELLED": "failed",
    "TIMEOUT": "failed",
    "NODE_FAIL": "failed",
    "OUT_OF_MEMORY": "failed",
    "BOOT_FAIL": "failed",
    "DEADLINE": "failed",
    "SPECIAL_EXIT": "failed",
    "REVOKED": "failed",
}

Runner = Callable[[Sequence[str]], str]


def _number(value: Any) -> int | None:
    # 22.05: a plain int (0 = unset); 23.02+: {"set": bool, "infinite": bool, "number": int}.
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite"):
            return None
        value = value.get("number")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value) if value > 0 else None


def _ms(value: Any) -> int | None:
    seconds = _number(value)
    return seconds * 1000 if seconds is not None else None


def _exit_code(value: Any) -> int | None:
    # squeue 22.05 gives the raw wait status (code << 8 | signal); newer versions an object.
    if isinstance(value, dict):
        signal = value.get("signal")
        sig = _number(signal.get("id") if isinstance(signal, dict) else signal)
        if sig:
            return 128 + sig
        rc = value.get("return_code")
        if isinstance(rc, dict):
            rc = rc.get("number") if rc.get("set", True) else None
        return int(rc) if isinstance(rc, int) else None
    if isinstance(value, int) and not isinstance(value, bool):
        return 128 + (value & 0x7F) if value & 0x7F else value >> 8
    return None


def _state(value: Any) -> str:
    if isinstance(value, list):  # 23.02+: ["PENDING"] or ["RUNNING", "COMPLETING"]
        value = value[0] if value else ""
    if isinstance(value, dict):  # sacct: {"current": [...], "reason": ...}
        return _state(value.get("current"))
    return str(value or "").split(" ")[0].upper()


def observation_from_slurm(job: dict[str, Any]) -> JobObservation | None:
    """A ranksight observation of one `squeue --json` (or `sacct --json`) job; None for unknown states."""
    native = _state(job.get("job_state") if "job_state" in job else job.get("state"))
    state = SLURM_STATES.get(native)
    if state is None:
        return None
    nested = job.get("time")
    times: dict[str, Any] = nested if isinstance(nested, dict) else job  # sacct nests its times
    reason = job.get("state_reason")
    if reason is None and isinstance(job.get("state"), dict):
        reason = job["state"].get("reason")
    exit_raw = job.get("exit_code")
    restarts = _number(job.get("restart_cnt")) or 0
    return JobObservation(
        job_id=str(job.get("job_id")),
        state=state,
        native_state=native,
        reason=None if reason in (None, "", "None") else str(reason),
        exit_code=_exit_code(exit_raw) if state in ("completed", "failed", "preempted") else None,
        restart_count=restarts,
        owner=job.get("user_name") or job.get("user") or None,
        account=job.get("account") or None,
        submit_ts=_ms(times.get("submit_time") if "submit_time" in times else times.get("submission")),
        start_ts=_ms(times.get("start_time") if "start_time" in times else times.get("start")),
        end_ts=_ms(times.get("end_time") if "end_time" in times else times.get("end")),
        cluster=str(job["cluster"]) if job.get("cluster") else None,
    )


def parse_slurm_json(text: str, what: str = "squeue --json") -> list[JobObservation]:
    """Observations of every job in the JSON `squeue` or `sacct` printed."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SchedulerUnavailableError(
            f"`{what}` did not print JSON ({exc}); is this Slurm 21.08 or newer?"
        ) from None
    errors = [e for e in data.get("errors") or [] if isinstance(e, dict) and e.get("error_number")]
    if errors:
        raise SchedulerUnavailableError(f"`{what}` reported: {errors[0].get('error') or errors[0]}")
    out = []
    for job in data.get("jobs") or []:
        obs = observation_from_slurm(job)
        if obs is not None:
            out.append(obs)
    return out


def _run(argv: Sequence[str]) -> str:
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=60, check=False)
    except FileNotFoundError:
        raise SchedulerUnavailableError(
            f"`{argv[0]}` is not installed here; run `ranksight scheduler --slurm` on a Slurm login node"
        ) from None
    except subprocess.TimeoutExpired:
        raise SchedulerUnavailableError(
            f"`{' '.join(argv)}` did not answer within 60 s; is slurmctld up?"
        ) from None
    if done.returncode != 0:
        first = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise SchedulerUnavailableError(
            f"`{' '.join(argv)}` failed: {first} (is slurmctld reachable? SLURM_CONF={os.environ.get('SLURM_CONF', 'default')})"
        )
    return done.stdout


class SlurmSource:
    """Polls `squeue --json`; jobs can be limited to some users, accounts or partitions."""

    name = "slurm"

    def __init__(
        self,
        *,
        users: Iterable[str] = (),
        accounts: Iterable[str] = (),
        partitions: Iterable[str] = (),
        runner: Runner = _run,
    ) -> None:
        self._users = set(users)
        self._accounts = set(accounts)
        self._partitions = set(partitions)
        self._runner = runner
        self._sacct_ok = True

    def _wanted(self, job: dict[str, Any]) -> bool:
        return (
            (not self._users or job.get("user_name") in self._users)
            and (not self._accounts or job.get("account") in self._accounts)
            and (not self._partitions or job.get("partition") in self._partitions)
        )

    def poll(self) -> list[JobObservation]:
        """Every job slurmctld holds now (filtered)."""
        text = self._runner(["squeue", "--json"])
        try:
            jobs = json.loads(text).get("jobs") or []
        except (json.JSONDecodeError, AttributeError):
            jobs = None
        if jobs is None:
            return parse_slurm_json(text)
        wanted = {str(j.get("job_id")) for j in jobs if self._wanted(j)}
        return [o for o in parse_slurm_json(text) if o.job_id in wanted]

    def lookup(self, job_ids: Sequence[str]) -> list[JobObservation]:
        """Final states of purged jobs from accounting (`sacct`); empty when accounting is off."""
        if not job_ids or not self._sacct_ok:
            return []
        try:
            text = self._runner(["sacct", "--json", "-X", "-j", ",".join(job_ids)])
            return parse_slurm_json(text, "sacct --json")
        except SchedulerUnavailableError as exc:
            self._sacct_ok = False
            log.warning("no Slurm accounting (%s): jobs purged before their end was seen are dropped", exc)
            return []
