"""Issue 33 (from 38.5): a cause reported just after its job was marked failed still pages.

A SIGKILL'd rank's fault often arrives after a peer's error already ended the job (rank 0 saw the
gloo reset first and the launcher reported `failed`). Within `engine.late_cause_grace_s` of the
failed state such a cause (rank_failed, xid_error, ecc_uncorrectable) fires; nothing can clear
it in a job that is over, so it resolves when event time passes the end of that grace.
"""

from __future__ import annotations

from schemas.records import Event
from streams.config import load_config
from streams.offline.detection import DetectionEngine
from tests.unit.streams.builders import T0, job_state, training_job

FAILED = T0 + 60_000


def _fault(rank: int, ts: int, kind: str = "exit", exit_code: int | None = 137) -> Event:
    return Event(
        "RankFault",
        {
            "ts": ts,
            "job_id": "job-1",
            "run_id": "job-1-run-1",
            "rank": rank,
            "node": "node-01",
            "kind": kind,
            "detail": "killed by signal 9 (SIGKILL)" if kind == "exit" else "watchdog timeout",
            "exit_code": exit_code,
        },
    )


def _stream(*late: Event) -> list[Event]:
    """job-1 runs 60 s and fails; job-2 keeps event time moving for three more minutes."""
    events = [e for e in training_job("job-1", seconds=59) if e.record["ts"] < FAILED]
    events += [job_state("job-1", FAILED, "failed", reason="rank 0: gloo connection reset")]
    events += training_job("job-2", seconds=240)
    return sorted([*events, *late], key=lambda e: e.record["ts"])


def _failed_alerts(out: list[Event]) -> list[dict[str, object]]:
    return [
        e.record
        for e in out
        if e.type == "Alert"
        and e.record["job_id"] == "job-1"
        and e.record["rule"] == "rank_failed"
        and e.record["team"] == "team-a"
    ]


def _engine(**knobs: object) -> DetectionEngine:
    return DetectionEngine(load_config(None, {"engine": knobs} if knobs else None))


def test_a_killed_ranks_fault_170_ms_after_failed_pages_and_resolves_at_the_end_of_the_grace() -> None:
    out = _engine().run(_stream(_fault(1, FAILED + 170)))
    alerts = _failed_alerts(out)
    assert [a["status"] for a in alerts] == ["firing", "resolved"]
    assert alerts[0]["rank"] == 1 and alerts[0]["starts_at"] == FAILED + 170
    assert "exited" in str(alerts[0]["summary"]) and "137" in str(alerts[0]["summary"])
    assert alerts[1]["ends_at"] == FAILED + 60_000  # the grace after the failed state


def test_without_the_grace_the_late_fault_is_dropped_as_before() -> None:
    assert _failed_alerts(_engine(late_cause_grace_s=0).run(_stream(_fault(1, FAILED + 170)))) == []


def test_a_fault_past_the_grace_and_a_late_symptom_do_not_page() -> None:
    late = _fault(2, FAILED + 61_000)
    symptom = _fault(3, FAILED + 500, kind="collective_timeout", exit_code=None)
    out = _engine().run(_stream(late, symptom))
    assert _failed_alerts(out) == []
    assert not [e for e in out if e.type == "Alert" and e.record["job_id"] == "job-1"]


def test_a_restored_engine_still_resolves_the_late_cause() -> None:
    events = _stream(_fault(1, FAILED + 170))
    whole = _engine().run(events)
    cut = next(i for i, e in enumerate(events) if e.record["ts"] > FAILED + 10_000)
    first = _engine()
    out = [x for e in events[:cut] for x in first.process(e)]
    restored = DetectionEngine.restore(first.snapshot(), load_config(None))
    out += [x for e in events[cut:] for x in restored.process(e)] + restored.finish()
    assert _failed_alerts(out) == _failed_alerts(whole)
    assert [a["status"] for a in _failed_alerts(out)] == ["firing", "resolved"]
