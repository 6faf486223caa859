"""Ownership on shared nodes: a node fault pages infrastructure operations once per affected job and
informs every affected job's team, each with its own alert."""

from __future__ import annotations

from typing import Any

from schemas.records import Event
from streams.offline.detection import DetectionEngine
from tests.unit.streams.builders import T0, gpu_sample, host_sample, job_started, job_state, step


def _bound(job: str, rank: int, node: str, gpu: int) -> Event:
    return Event(
        "RankBound",
        {
            "ts": T0,
            "job_id": job,
            "run_id": f"{job}-run-1",
            "rank": rank,
            "local_rank": rank,
            "node": node,
            "gpu_index": gpu,
            "gpu_uuid": f"GPU-{node}-{gpu}",
            "pid": 2000 + 10 * gpu + rank,
        },
    )


def _shared_node() -> list[Event]:
    """job-a (team-a) on GPUs 0-3 and job-b (team-b) on GPUs 4-7 of node-01; job-c (team-c) alone on node-02."""
    events = [
        job_started("job-a", T0, world_size=4, team="team-a"),
        job_started("job-b", T0, world_size=4, team="team-b"),
        job_started("job-c", T0, world_size=4, team="team-c", nodes=2),
    ]
    events[2].record["nodes"] = ["node-02"]
    events += [job_state(j, T0, "running") for j in ("job-a", "job-b", "job-c")]
    events += [_bound("job-a", r, "node-01", r) for r in range(4)]
    events += [_bound("job-b", r, "node-01", 4 + r) for r in range(4)]
    events += [_bound("job-c", r, "node-02", r) for r in range(4)]
    return events


def _steps(seconds: int) -> list[Event]:
    return [
        step(job, r, s, T0 + s * 1000, node="node-02" if job == "job-c" else "node-01")
        for s in range(1, seconds + 1)
        for job in ("job-a", "job-b", "job-c")
        for r in range(4)
    ]


INFRA = "infrastructure-operations"


def _firing(events: list[Event]) -> list[dict[str, Any]]:
    """Every firing copy the engine routes."""
    events = sorted(events, key=lambda e: e.record["ts"])
    return [
        e.record
        for e in DetectionEngine().run(events)
        if e.type == "Alert" and e.record["status"] == "firing"
    ]


def _alerts(events: list[Event]) -> list[dict[str, Any]]:
    """The copies that reach the affected jobs' teams (infra alerts: informed, not paged).

    Each of them is an alert of its own that infrastructure operations is paged with too."""
    firing = _firing(events)
    paged = {a["alert_id"] for a in firing if a["team"] == INFRA and a["receiver"] == "infra-pager"}
    informed = [a for a in firing if a["team"] != INFRA]
    assert all(a["alert_id"] in paged for a in informed if a["category"] == "infra"), "infra alert not paged"
    return informed


def _host(node: str, ts: int, **kw: Any) -> Event:
    ev = host_sample(node, ts)
    ev.record.update(kw)
    return ev


def test_a_host_oom_on_a_shared_node_reaches_every_job_on_it_with_its_identity() -> None:
    events = _shared_node() + _steps(40)
    events += [_host(n, T0 + s * 1000) for s in range(5, 40, 5) for n in ("node-01", "node-02")]
    events.append(_host("node-01", T0 + 30_500, oom_kills=1))
    alerts = [a for a in _alerts(events) if a["rule"] == "host_memory_pressure"]
    assert sorted((a["job_id"], a["team"], a["node"]) for a in alerts) == [
        ("job-a", "team-a", "node-01"),
        ("job-b", "team-b", "node-01"),
    ]
    assert len({a["fingerprint"] for a in alerts}) == 2
    assert {a["run_id"] for a in alerts} == {"job-a-run-1", "job-b-run-1"}


def test_a_host_oom_on_a_node_with_one_job_reaches_only_that_job() -> None:
    events = _shared_node() + _steps(40)
    events += [_host(n, T0 + s * 1000) for s in range(5, 40, 5) for n in ("node-01", "node-02")]
    events.append(_host("node-02", T0 + 30_500, oom_kills=1))
    alerts = [a for a in _alerts(events) if a["rule"] == "host_memory_pressure"]
    assert [(a["job_id"], a["team"]) for a in alerts] == [("job-c", "team-c")]


def test_an_xid_on_a_shared_node_names_the_gpus_job_and_reaches_the_co_located_job_too() -> None:
    """The job holding the GPU gets it with its rank; recovering the GPU (a reset or a node drain)
    stops the other job on the node too, so its team gets its own alert; job-c, elsewhere, nothing."""
    events = _shared_node() + _steps(20)
    xid = gpu_sample("node-01", 5, T0 + 10_000)
    xid.record["xid"] = 79
    events.append(xid)
    alerts = [a for a in _alerts(events) if a["rule"] == "xid_error"]
    assert sorted((a["job_id"], a["team"], a["rank"], a["gpu_index"]) for a in alerts) == [
        ("job-a", "team-a", None, 5),
        ("job-b", "team-b", 1, 5),
    ]
    assert len({a["fingerprint"] for a in alerts}) == 2
    shared = next(a for a in alerts if a["job_id"] == "job-a")
    assert "job job-b" in shared["summary"] and "stops job job-a" in shared["summary"]


def test_an_xid_on_an_unbound_gpu_goes_to_the_job_the_agent_attributed_it_to() -> None:
    events = _shared_node()[:6] + _steps(20)  # jobs started, no RankBound at all
    events = [e for e in events if e.type != "StepCompleted" or e.record["job_id"] != "job-c"]
    # The node's agent knows its jobs (it attributes their GPUs): its host samples name them.
    events += [_host("node-01", T0 + s * 1000, job_ids=["job-a", "job-b"]) for s in range(5, 20, 5)]
    xid = gpu_sample("node-01", 6, T0 + 10_000)
    xid.record.update(xid=48, job_id="job-b")
    plain = gpu_sample("node-01", 2, T0 + 10_000)
    plain.record.update(xid=48)  # no attribution and no binding: the platform's route
    alerts = [a for a in _firing([*events, xid, plain]) if a["rule"] == "xid_error"]
    alerts = [a for a in alerts if a["team"] != INFRA or not a["job_id"]]
    # GPU 6 is job-b's (the agent said so); GPU 2 belongs to no known job: infrastructure operations alone.
    # Each also reaches the other jobs running on node-01 (never job-c, which runs elsewhere).
    by_gpu = {
        gpu: sorted((a["job_id"], a["team"]) for a in alerts if a["gpu_index"] == gpu) for gpu in (2, 6)
    }
    assert by_gpu[6][0] == ("job-a", "team-a") and ("job-b", "team-b") in by_gpu[6]
    assert ("", INFRA) in by_gpu[2]
    assert all(job != "job-c" for job, _ in by_gpu[2] + by_gpu[6])


def test_missing_telemetry_from_a_shared_node_reaches_both_jobs_and_resolves_for_both() -> None:
    events = _shared_node() + _steps(200)
    for s in range(5, 200, 5):
        events.append(_host("node-02", T0 + s * 1000))
        if not 60 <= s < 150:
            events.append(_host("node-01", T0 + s * 1000))
    out = DetectionEngine().run(sorted(events, key=lambda e: e.record["ts"]))
    alerts = [
        e.record
        for e in out
        if e.type == "Alert" and e.record["rule"] == "telemetry_missing" and e.record["team"] != INFRA
    ]
    firing = sorted((a["job_id"], a["team"]) for a in alerts if a["status"] == "firing")
    resolved = sorted((a["job_id"], a["team"]) for a in alerts if a["status"] == "resolved")
    assert firing == resolved == [("job-a", "team-a"), ("job-b", "team-b")]


def test_host_sample_job_ids_name_jobs_the_topology_does_not_know_on_the_node() -> None:
    # job-c's ranks are bound on node-02 only, but the node-01 agent reports it runs there too.
    events = _shared_node() + _steps(40)
    events += [
        _host(n, T0 + s * 1000, job_ids=["job-c"] if n == "node-01" else [])
        for s in range(5, 40, 5)
        for n in ("node-01", "node-02")
    ]
    events.append(_host("node-01", T0 + 30_500, oom_kills=1, job_ids=["job-c"]))
    alerts = [a for a in _alerts(events) if a["rule"] == "host_memory_pressure"]
    assert sorted(a["job_id"] for a in alerts) == ["job-a", "job-b", "job-c"]
