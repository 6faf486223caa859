"""No alert storms: alerts that share a cause share a group, and a root cause inhibits its symptoms."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from schemas.records import Event
from streams.alerting.grouping import AlertGrouper
from streams.alerting.routing import Router, load_router
from streams.detectors.base import Topology
from streams.errors import RoutingError
from streams.offline.detection import DetectionEngine
from tests.unit.streams.builders import T0, gpu_sample, job_started, job_state, rank_bound, step, training_job

RANKS = 16  # two nodes of 8


def _job_with_slow_rank(slow_rank: int, seconds: int = 240) -> list[Event]:
    events = [job_started("job-1", T0, world_size=RANKS, nodes=2), job_state("job-1", T0, "running")]
    events += [rank_bound("job-1", r, T0) for r in range(RANKS)]
    for i in range(1, seconds + 1):
        extra = 0.85 * 0.8 if i >= 30 else 0.0  # synchronous: the others wait for the slow rank
        for r in range(RANKS):
            slow = r == slow_rank
            compute = 0.85 + (extra if slow else 0.0)
            comm = 0.12 + (0.0 if slow else extra)
            events.append(
                step("job-1", r, i, T0 + i * 1000, compute=compute, comm=comm, step_time=1.0 + extra)
            )
    return events


def _xid(node: str, gpu: int, ts: int) -> Event:
    ev = gpu_sample(node, gpu, ts)
    ev.record["xid"] = 79
    return ev


def _firing(events: list[Event], router: Router | None = None) -> list[dict[str, Any]]:
    out = DetectionEngine(router=router).run(sorted(events, key=lambda e: e.record["ts"]))
    return [e.record for e in out if e.type == "Alert" and e.record["status"] == "firing"]


def test_a_node_fault_inhibits_the_straggler_on_that_node_and_shares_its_group() -> None:
    alerts = _firing([*_job_with_slow_rank(3), _xid("node-01", 3, T0 + 20_000)])
    xid = next(a for a in alerts if a["rule"] == "xid_error")
    straggler = next(a for a in alerts if a["rule"] == "straggler")
    assert straggler["inhibited_by"] == xid["alert_id"] and xid["inhibited_by"] is None
    assert straggler["group_key"] == xid["group_key"] == f"node:node-01@{T0 + 20_000}"


def test_a_node_fault_does_not_inhibit_a_straggler_on_another_node() -> None:
    alerts = _firing([*_job_with_slow_rank(11), _xid("node-01", 3, T0 + 20_000)])
    straggler = next(a for a in alerts if a["rule"] == "straggler")
    xid = next(a for a in alerts if a["rule"] == "xid_error")
    assert straggler["rank"] == 11 and straggler["inhibited_by"] is None
    assert straggler["group_key"].startswith("job:job-1@") and straggler["group_key"] != xid["group_key"]


def test_a_hung_rank_mutes_the_job_stall_it_explains() -> None:
    """The specific cause (rank 2 hung) mutes the general symptom (the job stalled), never the reverse."""
    events = training_job(seconds=100)
    events += [step("job-1", r, 101, T0 + 101_000) for r in (0, 1, 3)]  # rank 2 never finishes step 101
    events += [gpu_sample("node-01", 0, T0 + s * 1000) for s in range(100, 200, 5)]  # event time moves on
    alerts = _firing(events)
    stall = [a for a in alerts if a["rule"] == "job_stall"]
    hang = next(a for a in alerts if a["rule"] == "rank_hang")
    assert hang["rank"] == 2 and hang["inhibited_by"] is None
    assert stall and all(a["inhibited_by"] == hang["alert_id"] for a in stall)
    assert stall[0]["group_key"] == hang["group_key"] == f"job:job-1@{hang['starts_at']}"


def test_a_job_stall_without_a_hung_rank_pages() -> None:
    events = training_job(seconds=100)  # every rank stops after step 100
    events += [gpu_sample("node-01", 0, T0 + s * 1000) for s in range(100, 200, 5)]
    alerts = _firing(events)
    stall = [a for a in alerts if a["rule"] == "job_stall"]
    assert stall and all(a["inhibited_by"] is None for a in stall)
    assert not [a for a in alerts if a["rule"] == "rank_hang"]


def test_without_inhibit_rules_nothing_is_inhibited_but_alerts_are_still_grouped() -> None:
    alerts = _firing([*_job_with_slow_rank(3), _xid("node-01", 3, T0 + 20_000)], router=Router())
    assert {a["rule"] for a in alerts} >= {"xid_error", "straggler"}
    assert all(a["inhibited_by"] is None and a["group_key"] for a in alerts)


def _record(fp: str, rule: str, status: str, ts: int, **kw: Any) -> dict[str, Any]:
    rec = {
        "alert_id": f"id-{fp}",
        "fingerprint": fp,
        "rule": rule,
        "status": status,
        "starts_at": ts,
        "job_id": "job-1",
        "node": None,
        "rank": None,
        "labels": {},
    }
    rec.update(kw)
    return rec


def test_a_group_stays_open_while_a_member_fires_and_the_next_incident_opens_a_new_one() -> None:
    grouper = AlertGrouper(load_router().inhibit_rules, Topology())
    a = _record("straggler/job-1/3", "straggler", "firing", 100)
    b = _record("network_degradation/job-1", "network_degradation", "firing", 130)
    grouper.annotate([a])
    grouper.annotate([b])
    assert a["group_key"] == b["group_key"] == "job:job-1@100"
    end_a = _record("straggler/job-1/3", "straggler", "resolved", 100)
    grouper.annotate([end_a])
    assert end_a["group_key"] == "job:job-1@100"
    c = _record("gpu_imbalance/job-1/GPU-x", "gpu_imbalance", "firing", 200)
    grouper.annotate([c])
    assert c["group_key"] == "job:job-1@100"  # b still fires: same incident
    grouper.annotate([_record("network_degradation/job-1", "network_degradation", "resolved", 130)])
    grouper.annotate([_record("gpu_imbalance/job-1/GPU-x", "gpu_imbalance", "resolved", 200)])
    d = _record("straggler/job-1/5", "straggler", "firing", 900)
    grouper.annotate([d])
    assert d["group_key"] == "job:job-1@900"


def test_a_resolved_symptom_carries_the_root_it_was_inhibited_by_and_the_state_round_trips() -> None:
    topo = Topology()
    topo.observe(rank_bound("job-1", 3, T0))
    grouper = AlertGrouper(load_router().inhibit_rules, topo)
    root = _record(
        "xid_error/node-01/GPU-node-01-3", "xid_error", "firing", 10, node="node-01", gpu_uuid="GPU-node-01-3"
    )
    sym = _record(
        "straggler/job-1/3", "straggler", "firing", 50, node="node-01", rank=3, gpu_uuid="GPU-node-01-3"
    )
    grouper.annotate([sym, root])  # the root is registered first even when listed second
    assert sym["inhibited_by"] == root["alert_id"]
    clone = AlertGrouper(load_router().inhibit_rules, topo)
    clone.load_state(grouper.state())
    end = _record(
        "straggler/job-1/3", "straggler", "resolved", 50, node="node-01", rank=3, gpu_uuid="GPU-node-01-3"
    )
    clone.annotate([end])
    assert end["inhibited_by"] == root["alert_id"] and end["group_key"] == sym["group_key"]


def test_a_network_degradation_without_a_node_is_inhibited_by_a_fault_on_a_node_of_its_job() -> None:
    topo = Topology()
    topo.observe(rank_bound("job-1", 9, T0))  # rank 9 on node-02
    grouper = AlertGrouper(load_router().inhibit_rules, topo)
    root = _record("host_memory_pressure/node-02/job-1", "host_memory_pressure", "firing", 10, node="node-02")
    net = _record("network_degradation/job-1", "network_degradation", "firing", 50)
    other = _record("network_degradation/job-2", "network_degradation", "firing", 50, job_id="job-2")
    grouper.annotate([root, net, other])
    assert net["inhibited_by"] == root["alert_id"] and other["inhibited_by"] is None


def test_drop_inhibited_routes_an_inhibited_alert_nowhere() -> None:
    router = Router.from_dict({"drop_inhibited": True, "inhibit_rules": []})
    assert router.route_all({"team": "t", "inhibited_by": "abc"}) == []
    assert router.route_all({"team": "t", "inhibited_by": None}) == [("t", "default")]


def test_the_shipped_routing_file_has_the_documented_inhibition_graph() -> None:
    rules = load_router().inhibit_rules
    assert [(r.causes, r.scope) for r in rules] == [
        (("rank_hang",), "job"),
        (("evaluation_stuck",), "job"),
        (("ecc_uncorrectable",), "gpu"),
        (("xid_error", "ecc_uncorrectable", "gpu_throttling"), "gpu"),
        (("host_memory_pressure", "telemetry_missing"), "node"),
        (("straggler", "network_degradation", "baseline_deviation"), "job"),
        (("rank_hang", "ecc_uncorrectable", "xid_error", "rank_failed"), "job"),
        (("rank_hang", "ecc_uncorrectable", "xid_error"), "job"),
        (("job_stall",), "job"),
    ]
    assert all(r.why for r in rules)


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ({"inhibit_rules": [{"source_match": {"rule": "x"}}]}, "needs a source and a target"),
        (
            {
                "inhibit_rules": [
                    {"source_match": {"rule": "x"}, "target_match": {"rule": "y"}, "scope": "rack"}
                ]
            },
            "scope",
        ),
        (
            {"inhibit_rules": [{"source_match": {"colour": "x"}, "target_match": {"rule": "y"}}]},
            "cannot match on",
        ),
        (
            {"inhibit_rules": [{"source_match_re": {"rule": "("}, "target_match": {"rule": "y"}}]},
            "invalid regular",
        ),
        ({"inhibit_rules": [{"sauce_match": {"rule": "x"}}]}, "unknown key"),
    ],
)
def test_a_bad_inhibit_rule_is_one_sentence_naming_it(bad: dict[str, Any], says: str, tmp_path: Path) -> None:
    with pytest.raises(RoutingError, match=says):
        Router.from_dict(bad, source="r.yaml")


def test_a_slow_storage_server_under_one_node_is_one_group_not_a_storm() -> None:
    """Ranks 0-3 (on node-01, behind one storage server) of a 16-rank job wait 20x longer for data from minute 8."""
    events = [job_started("job-1", T0, world_size=RANKS, nodes=2), job_state("job-1", T0, "running")]
    events += [rank_bound("job-1", r, T0) for r in range(RANKS)]
    for i in range(1, 900):
        for r in range(RANKS):
            slow = r < 4 and i >= 480
            extra = 0.57 if i >= 480 else 0.0  # synchronous: the others wait for the slow ranks
            events.append(
                step(
                    "job-1",
                    r,
                    i,
                    T0 + i * 1000,
                    data_wait=0.6 if slow else 0.03,
                    comm=0.12 if slow else 0.12 + extra,
                    step_time=1.0 + extra,
                )
            )
    alerts = _firing(events)
    assert len(alerts) >= 4, [a["summary"] for a in alerts]
    assert len({a["group_key"] for a in alerts}) == 1
    paged = [a for a in alerts if not a["inhibited_by"]]
    assert {a["rule"] for a in paged} == {"straggler"} and {a["rank"] for a in paged} == {0, 1, 2, 3}


def test_a_gpu_fault_mutes_only_its_own_gpu_while_a_host_fault_mutes_every_job_on_the_node() -> None:
    topo = Topology()
    for ev in (rank_bound("job-a", 3, T0), rank_bound("job-b", 6, T0)):
        topo.observe(ev)
    rules = load_router().inhibit_rules

    def straggler(job: str, rank: int) -> dict[str, Any]:
        gpu = f"GPU-node-01-{rank}"
        return _record(
            f"straggler/{job}/{rank}",
            "straggler",
            "firing",
            50,
            job_id=job,
            node="node-01",
            rank=rank,
            gpu_uuid=gpu,
        )

    grouper = AlertGrouper(rules, topo)
    xid = _record(
        "xid_error/node-01/GPU-node-01-3",
        "xid_error",
        "firing",
        10,
        job_id="job-a",
        node="node-01",
        gpu_uuid="GPU-node-01-3",
    )
    own, other = straggler("job-a", 3), straggler("job-b", 6)
    drop = _record("throughput_drop/job-a", "throughput_drop", "firing", 60, job_id="job-a")
    grouper.annotate([xid, own, other, drop])
    assert own["inhibited_by"] == drop["inhibited_by"] == xid["alert_id"] and other["inhibited_by"] is None

    grouper = AlertGrouper(rules, topo)
    oom = _record(
        "host_memory_pressure/node-01/job-a",
        "host_memory_pressure",
        "firing",
        10,
        job_id="job-a",
        node="node-01",
    )
    own, other = straggler("job-a", 3), straggler("job-b", 6)
    grouper.annotate([oom, own, other])
    assert own["inhibited_by"] == other["inhibited_by"] == oom["alert_id"]
    assert own["group_key"] == other["group_key"] == "node:node-01@10"


def test_a_restored_engine_links_a_symptom_to_a_root_that_fired_before_the_snapshot() -> None:
    events = sorted([*_job_with_slow_rank(3), _xid("node-01", 3, T0 + 20_000)], key=lambda e: e.record["ts"])
    whole = DetectionEngine().run(events)
    cut = next(
        i for i, e in enumerate(events) if e.record["ts"] >= T0 + 40_000
    )  # the XID fired, the straggler not yet
    first = DetectionEngine()
    out = [x for e in events[:cut] for x in first.process(e)]
    restored = DetectionEngine.restore(first.snapshot())
    out += [x for e in events[cut:] for x in restored.process(e)] + restored.finish()
    assert [e.record for e in out] == [e.record for e in whole]
    linked = [e.record for e in out if e.type == "Alert" and e.record["inhibited_by"]]
    assert linked and min(a["ts"] for a in linked) > events[cut].record["ts"]
