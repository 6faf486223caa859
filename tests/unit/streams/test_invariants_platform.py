"""The platform rules: restart loops (`restart_loop`) and long pending times (`long_pending`)."""

from __future__ import annotations

from schemas.records import Event
from streams.detectors.base import Detector, Finding, Topology
from streams.detectors.long_pending import LongPendingDetector
from streams.detectors.restart_loop import RestartLoopDetector
from tests.unit.streams.builders import T0, job_started, job_state
from tests.unit.streams.sections import SectionRules

JOB = "job-1"
MIN = 60_000


def drive(det: Detector, events: list[Event], until: int | None = None) -> list[Finding]:
    out: list[Finding] = []
    last = T0
    for ev in events:
        det.topology.observe(ev)
        out += det.observe(ev)
        out += det.advance(ev.record["ts"])
        last = ev.record["ts"]
    if until is not None:
        for wm in range(last + 10_000, until + 1, 10_000):
            out += det.advance(wm)
    return out


def rule(findings: list[Finding], name: str) -> list[Finding]:
    return [f for f in findings if f.rule == name]


def restart(ts: int, n: int, *, with_state: bool = True, failed: bool = False) -> list[Event]:
    """One restart as a scheduler reports it: (failed,) restarting with the count, then the new run."""
    out: list[Event] = []
    if failed:
        out.append(job_state(JOB, ts, "failed", restart_count=n - 1))
    if with_state:
        out.append(job_state(JOB, ts + 500, "restarting", restart_count=n))
    out.append(job_started(JOB, ts + 20_000, run_id=f"{JOB}-run-{n + 1}"))
    out.append(job_state(JOB, ts + 20_050, "running", restart_count=n, run_id=f"{JOB}-run-{n + 1}"))
    return out


def test_three_restarts_within_thirty_minutes_fire_a_loop_counting_each_restart_once() -> None:
    events = [job_started(JOB, T0)]
    for i in range(4):
        events += restart(T0 + (7 + 2 * i) * MIN, i + 1)
    det = RestartLoopDetector(Topology())
    found = rule(drive(det, events, until=T0 + 30 * MIN), "restart_loop")
    assert found[0].active and found[0].ts == T0 + 11 * MIN + 500 and found[0].observed == 3.0
    assert found[0].category == "platform" and found[0].key == (JOB,)
    # Running for five minutes after the last restart ends the loop.
    resolved = [f for f in found if not f.active]
    assert len(resolved) == 1 and resolved[0].ts >= T0 + 13 * MIN + 300_000


def test_restarts_seen_only_as_new_runs_are_counted() -> None:
    events = [job_started(JOB, T0)]
    for i in range(3):
        events.append(job_started(JOB, T0 + (i + 1) * 2 * MIN, run_id=f"{JOB}-run-{i + 2}"))
    assert rule(drive(RestartLoopDetector(Topology()), events), "restart_loop")[0].active


def test_a_failed_run_between_restarts_keeps_the_count() -> None:
    # The engine ends a job (forget_job) on `failed`; the restart history must survive it.
    det = RestartLoopDetector(Topology())
    events = [job_started(JOB, T0)]
    found: list[Finding] = []
    found += drive(det, events)
    for i in range(3):
        for ev in restart(T0 + (i + 1) * 3 * MIN, i + 1, failed=True):
            found += drive(det, [ev])
            if ev.type == "JobStateChanged" and ev.record["state"] == "failed":
                det.forget_job(JOB)
    assert rule(found, "restart_loop")


def test_two_restarts_are_not_a_loop_and_restarts_spread_over_hours_are_not_either() -> None:
    events = [job_started(JOB, T0), *restart(T0 + 5 * MIN, 1), *restart(T0 + 10 * MIN, 2)]
    assert rule(drive(RestartLoopDetector(Topology()), events), "restart_loop") == []
    spread = [job_started(JOB, T0)]
    for i in range(4):
        spread += restart(T0 + (i + 1) * 40 * MIN, i + 1)
    assert rule(drive(RestartLoopDetector(Topology()), spread), "restart_loop") == []


def test_pending_longer_than_ten_minutes_fires_and_resolves_when_the_job_runs() -> None:
    other = job_started("job-other", T0)  # keeps event time moving while job-1 waits
    events = [other, job_state(JOB, T0 + MIN, "pending")]
    det = LongPendingDetector(Topology())
    found = rule(drive(det, events, until=T0 + 15 * MIN), "long_pending")
    assert found[0].active and T0 + 11 * MIN < found[0].ts <= T0 + 11 * MIN + 10_000
    assert found[0].since == T0 + 11 * MIN and found[0].key == (JOB,)
    later = rule(drive(det, [job_started(JOB, T0 + 17 * MIN)]), "long_pending")
    assert [f.active for f in later] == [False]


def test_short_pending_raises_nothing() -> None:
    events = [job_state(JOB, T0, "pending"), job_started(JOB, T0 + 9 * MIN)]
    assert drive(SectionRules("platform", Topology()), events, until=T0 + 60 * MIN) == []
