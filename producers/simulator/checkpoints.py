"""A job's checkpoints as the simulator writes them: started, completed, verified or not, retention, restore tests."""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

from producers.simulator.common import (
    _CKPT,
    _NEVER,
    _Effect,
    _end_of,
)

if TYPE_CHECKING:
    from producers.simulator.jobrun import JobRun


__all__ = ["checkpoint", "restore_tests"]


def restore_tests(run: JobRun, t: float) -> None:
    """Restore-test faults: from their start, the latest verified checkpoint is restored and resumed once."""
    pending = getattr(run, "_restore_faults", None)
    if pending is None:  # looked up once per job: this runs after every step
        kinds = ("restore_test_failure", "restore_test_passed")
        pending = run._restore_faults = [(k, hit) for k in kinds if (hit := run._one(k)) is not None]
    for kind, found in pending:
        if found[0] in run.e.effects or t < found[1].start or run.last_verified is None:
            continue
        i, spec = found
        ckpt_id, step = run.last_verified
        ok = kind == "restore_test_passed"
        took = 180.0  # restore into a sandbox, resume 20 steps
        run.e.emit(
            t + took,
            "RestoreTest",
            job_id=run.job.id,
            run_id=run.run_id,
            checkpoint_id=ckpt_id,
            step=step,
            restored_model=True,
            restored_optimizer=ok,
            restored_scheduler=True,
            restored_data_position=True,
            steps_resumed=20 if ok else 0,
            loss_before=2.1,
            loss_after=2.11 if ok else None,
            loss_tolerance=0.05,
            code_version=run.job.model_version,
            runtime_version="torch 2.4.0 cuda 12.4",
            passed=ok,
            error=None if ok else str(spec.params["error"]),
            duration_s=took,
        )
        run.e.effects[i] = _Effect(t + took, None, {"checkpoint_id": ckpt_id})


def checkpoint(
    run: JobRun,
    t: float,
    dur: float,
    outcome: str,
    *,
    error: str | None = None,
    stuck_until: float | None = None,
) -> tuple[float, float]:
    """Start a checkpoint at `t`; the next step carries its blocking time. Returns (started, ended)."""
    job, e, rng = run.job, run.e, run.rng
    step = run.step
    ckpt_id = f"{run.run_id}-step{step:07d}"
    uri = f"{job.checkpoint.uri}/{job.id}/step_{step:07d}"
    common = {
        "job_id": job.id,
        "run_id": run.run_id,
        "rank": None,
        "checkpoint_id": ckpt_id,
        "step": step,
    }
    e.emit(t, "CheckpointEvent", **common, phase="started", uri=uri, version="dcp-2")
    keep = _retention(run, t)
    if outcome == "ok":
        blocking = dur
        nbytes = int(job.checkpoint.bytes * (1 + rng.gauss(0, 0.002)))
        deleted: list[str] = []
        if keep is not None:
            # Retention keeps the newest `keep` checkpoints: saving this one deletes the oldest.
            run.retained.append(ckpt_id)
            deleted, run.retained = run.retained[:-keep], run.retained[-keep:]
        e.emit(
            t + dur,
            "CheckpointEvent",
            **common,
            phase="completed",
            uri=uri,
            bytes=nbytes,
            duration_s=round(dur, 3),
            version="dcp-2",
            retention_keep=keep,
            deleted=deleted,
        )
        verify = dur + rng.uniform(4.0, 12.0)
        checksum = hashlib.sha256(f"{ckpt_id}/{nbytes}".encode()).hexdigest()
        verify += _verify_delay(run, t)
        failure = _verify_failure(run, t + verify)
        if failure is not None:
            e.emit(
                t + verify, "CheckpointEvent", **common, phase="verify_failed", uri=uri, bytes=nbytes,
                duration_s=round(verify, 3), version="dcp-2", error=failure,
            )  # fmt: skip
            run.unverified.append(ckpt_id)
            for node in job.nodes:
                e._add_disk_write(node, t, dur, nbytes / len(job.nodes))
            for r in run.layout:
                e._spread(r.node, r.gpu_index, _CKPT, t, dur)
            run.pending_ckpt_s += dur
            return t, t + dur
        if _unverified(run, t + verify) or _retention_unverified(run, t + verify):
            # the verifier is gone when the check would run
            run.unverified.append(ckpt_id)
            for node in job.nodes:
                e._add_disk_write(node, t, dur, nbytes / len(job.nodes))
            for r in run.layout:
                e._spread(r.node, r.gpu_index, _CKPT, t, dur)
            run.pending_ckpt_s += dur
            return t, t + dur
        e.emit(
            t + verify,
            "CheckpointEvent",
            **common,
            phase="verified",
            uri=uri,
            bytes=nbytes,
            duration_s=round(verify, 3),
            version="dcp-2",
            checksum=checksum,
        )
        run.last_verified = (ckpt_id, step)
        run.last_verified_at = t + verify
        run.unverified = []
        for node in job.nodes:
            e._add_disk_write(node, t, dur, nbytes / len(job.nodes))
        ended = t + dur
    elif outcome == "failed":
        blocking = dur * rng.uniform(0.3, 0.6)
        e.emit(
            t + blocking,
            "CheckpointEvent",
            **common,
            phase="failed",
            uri=uri,
            duration_s=round(blocking, 3),
            version="dcp-2",
            error=error,
        )
        ended = t + blocking
    else:  # stuck: the in-loop snapshot returns, the background upload never finishes
        blocking = dur * 0.25
        run.ckpt_stuck = True
        ended = _NEVER
        if stuck_until is not None and stuck_until < e.sc.duration:
            e.emit(
                stuck_until,
                "CheckpointEvent",
                **common,
                phase="failed",
                uri=uri,
                duration_s=round(stuck_until - t, 3),
                version="dcp-2",
                error="checkpoint upload abandoned: no progress",
            )
            ended = stuck_until
    for r in run.layout:
        e._spread(r.node, r.gpu_index, _CKPT, t, blocking)
    run.pending_ckpt_s += blocking
    return t, ended


def _retention(run: JobRun, t: float) -> int | None:
    """The retention policy (checkpoints kept) of a job with a retention fault; marks when it exposes the job.

    A checkpoint starting while `keep - 1` (at least one) newer checkpoints wait unverified will,
    when it completes, delete the latest verified one: that is when the exposure begins.
    """
    found = run.e._faults(run.job.id, "checkpoint_retention_unverified", "checkpoint_retention_tight")
    if not found:
        return None
    i, f = found[0]
    keep = int(f.params["keep"])
    waiting = [c for c in run.unverified if c in run.retained]
    exposed = waiting and len(waiting) >= max(1, keep - 1) and f.start <= t
    if f.type == "checkpoint_retention_unverified" and run.last_verified is not None and exposed:
        run.e.effects.setdefault(i, _Effect(t, f.end, {"keep": keep, "unverified": list(waiting)}))
    return keep


def _retention_unverified(run: JobRun, t: float) -> bool:
    """True once a checkpoint_retention_unverified fault started: checkpoints are no longer verified."""
    return any(
        f.start <= t < _end_of(f) for _, f in run.e._faults(run.job.id, "checkpoint_retention_unverified")
    )


def _verify_delay(run: JobRun, t: float) -> float:
    """Extra seconds a slow verification takes (checkpoint_verify_slow)."""
    extra = 0.0
    for i, f in run._active("checkpoint_verify_slow", t):
        run.e.effects.setdefault(i, _Effect(t, f.end, {}))
        extra += float(f.params["delay"])
    return extra


def _verify_failure(run: JobRun, t: float) -> str | None:
    """The error of a verification that fails at `t` (checkpoint_verify_failure), else None."""
    for i, f in run._active("checkpoint_verify_failure", t):
        eff = run.e.effects.setdefault(i, _Effect(t, f.end, {"failed_verifications": 0}))
        eff.detail["failed_verifications"] += 1
        return str(f.params["error"])
    return None


def _unverified(run: JobRun, t: float) -> bool:
    """True while a checkpoint_unverified fault holds: checkpoints complete, no verification follows."""
    found = run._active("checkpoint_unverified", t)
    for i, f in found:
        verified_at = run.last_verified_at if run.last_verified_at is not None else run.job.start
        run.e.effects.setdefault(i, _Effect(verified_at, f.end, {}))
    return bool(found)
