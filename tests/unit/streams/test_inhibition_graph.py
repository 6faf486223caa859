"""Issue 20.2: the inhibition graph, walked edge by edge.

For every edge of the shipped graph (`inhibit_rules` in streams/alerting/routing.yaml) and every
cause -> symptom pair on it: the symptom alone fires unmuted; with its cause firing first it fires
muted; firing before its cause it is muted when the cause fires; a cause outside the edge's scope
(another GPU, node or job) mutes nothing. The alert records are the tracker's own (the records the
engine publishes), grouped by the grouper the engine runs, with the rules the engine loads.
The rendered Alertmanager configuration is checked the same way: its inhibit rules, evaluated as
Alertmanager evaluates them, mute each pair's labels, and none mutes a symptom out of scope.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from streams.alerting.alertmanager import to_alertmanager
from streams.alerting.amconfig import MUTED_RECEIVER, render_alertmanager_config
from streams.alerting.grouping import (
    AlertGrouper,
    InhibitRule,
    edge_for,
    graph_cycle,
    graph_levels,
    muted_by_text,
)
from streams.alerting.lifecycle import AlertTracker
from streams.alerting.ownership import load_ownership
from streams.alerting.routing import DEFAULT_ROUTING_PATH, Router, load_router
from streams.detectors import ALL_DETECTORS
from streams.detectors.base import Finding, Topology
from streams.errors import RoutingError
from tests.unit.streams.builders import T0, job_started, rank_bound

ROUTER = load_router()
RULES = ROUTER.inhibit_rules
EDGES = [(cause, symptom, rule) for rule in RULES for cause in rule.causes for symptom in rule.symptoms]

# Where each rule's detector puts its alert: the identity fields its findings carry.
GPU_FAULTS = {"xid_error", "ecc_uncorrectable", "gpu_throttling"}
NODE_FAULTS = {"host_memory_pressure", "telemetry_missing"}
RANK_ALERTS = {"straggler", "rank_hang", "gpu_imbalance", "rank_failed"}
NODE_ALERTS = {"network_degradation"}  # job-wide, naming the node whose links degraded
JOB_ALERTS = {
    "job_stall",
    "zombie_job",
    "evaluation_stuck",
    "baseline_deviation",
    "throughput_drop",
    "dependency_timeout",
}


def _topology() -> Topology:
    """Job j1: rank 3 on node-01 GPU 3, rank 9 on node-02 GPU 1. Job j2 elsewhere on node-01."""
    topo = Topology()
    for ev in (
        job_started("j1", T0, world_size=16, nodes=2),
        rank_bound("j1", 3, T0),
        rank_bound("j1", 9, T0),
        job_started("j2", T0, world_size=8),
        rank_bound("j2", 6, T0),
    ):
        topo.observe(ev)
    return topo


def _finding(rule: str, ts: int, *, active: bool = True, job: str = "j1", where: str = "here") -> Finding:
    """A finding as `rule`'s detector raises it; `where="elsewhere"` puts it on a GPU, node or job j1 does not use there."""
    gpu = {"here": 3, "elsewhere": 5}[where]
    node = {"here": "node-01", "elsewhere": "node-03"}[where]
    if rule in GPU_FAULTS:
        node = "node-01"  # another GPU of the same node: a GPU fault is not a node fault
        ident: dict[str, Any] = {"node": node, "gpu_uuid": f"GPU-{node}-{gpu}", "gpu_index": gpu}
    elif rule in NODE_FAULTS | NODE_ALERTS:
        ident = {"node": node}
    elif rule in RANK_ALERTS:
        ident = {"node": "node-01", "rank": 3, "gpu_uuid": "GPU-node-01-3", "gpu_index": 3}
    elif rule in JOB_ALERTS:
        ident = {}
    else:
        raise AssertionError(f"rule {rule} of the graph has no identity in this test: add it")
    key = (job, *(str(v) for v in ident.values()))
    return Finding(rule=rule, key=key, active=active, ts=ts, job_id=job, sustain_ms=0, **ident)


class _Engine:
    """The engine's alert path: tracker -> grouper (annotate, in place) -> published records."""

    def __init__(self, rules: list[InhibitRule] = RULES) -> None:
        self.topology = _topology()
        self.tracker = AlertTracker()
        self.grouper = AlertGrouper(rules, self.topology)
        self.published: list[dict[str, Any]] = []

    def fire(self, finding: Finding) -> list[dict[str, Any]]:
        records = self.tracker.observe(finding, self.topology)
        self.grouper.annotate(records)
        self.published += records
        return records

    def latest(self, rule: str) -> dict[str, Any]:
        """The newest published record of `rule`."""
        return [r for r in self.published if r["rule"] == rule][-1]


def _scope_out(cause: str, rule: InhibitRule) -> dict[str, Any]:
    """Where a cause must be to be out of the edge's scope."""
    if rule.scope == "job":
        return {"job": "j2"}
    return {"where": "elsewhere"}


def test_the_graph_names_only_real_rules_has_the_issue_s_edges_and_no_cycle() -> None:
    known = {r for cls in ALL_DETECTORS for r in cls.rules}
    named = {r for cause, symptom, _ in EDGES for r in (cause, symptom)}
    assert named <= known, sorted(named - known)
    pairs = {(c, s): rule.scope for c, s, rule in EDGES}
    for cause, symptom, scope in [
        ("rank_hang", "job_stall", "job"),
        ("rank_hang", "zombie_job", "job"),
        ("ecc_uncorrectable", "xid_error", "gpu"),
        ("gpu_throttling", "straggler", "gpu"),
        ("straggler", "throughput_drop", "job"),
        ("network_degradation", "throughput_drop", "job"),
        ("job_stall", "throughput_drop", "job"),
    ]:
        assert pairs.get((cause, symptom)) == scope, (cause, symptom)
    # The general symptom never mutes its specific cause.
    assert ("job_stall", "rank_hang") not in pairs and ("xid_error", "ecc_uncorrectable") not in pairs
    assert graph_cycle(RULES) is None
    levels = graph_levels(RULES)
    assert all(levels[c] < levels[s] for c, s, _ in EDGES)


@pytest.mark.parametrize(("cause", "symptom", "rule"), EDGES, ids=[f"{c}->{s}" for c, s, _ in EDGES])
def test_each_edge_mutes_its_symptom_only_with_its_cause_in_scope(
    cause: str, symptom: str, rule: InhibitRule
) -> None:
    # The symptom alone fires and is a page.
    alone = _Engine()
    (record,) = alone.fire(_finding(symptom, T0 + 60_000))
    assert record["status"] == "firing" and record["inhibited_by"] is None

    # The cause fires first: the symptom fires muted, in the cause's group.
    engine = _Engine()
    (root,) = engine.fire(_finding(cause, T0 + 10_000))
    (muted,) = engine.fire(_finding(symptom, T0 + 60_000))
    assert muted["inhibited_by"] == root["alert_id"] and muted["group_key"] == root["group_key"]
    # Its resolution carries the mute.
    (end,) = engine.fire(_finding(symptom, T0 + 90_000, active=False))
    assert end["inhibited_by"] == root["alert_id"]

    # The symptom fires first: when the cause fires, the symptom's record is re-sent muted.
    late = _Engine()
    (first,) = late.fire(_finding(symptom, T0 + 10_000))
    out = late.fire(_finding(cause, T0 + 60_000))
    assert [r["rule"] for r in out] == [cause, symptom], out
    update = out[1]
    assert update["alert_id"] == first["alert_id"] and update["starts_at"] == first["starts_at"]
    assert update["status"] == "firing" and update["ts"] == T0 + 60_000
    assert update["inhibited_by"] == out[0]["alert_id"] and update["group_key"] == out[0]["group_key"]
    (end,) = late.fire(_finding(symptom, T0 + 90_000, active=False))
    assert end["inhibited_by"] == out[0]["alert_id"]

    # A cause out of the edge's scope mutes nothing, before or after.
    apart = _Engine()
    apart.fire(_finding(cause, T0 + 10_000, **_scope_out(cause, rule)))
    (record,) = apart.fire(_finding(symptom, T0 + 60_000))
    assert record["inhibited_by"] is None
    apart2 = _Engine()
    apart2.fire(_finding(symptom, T0 + 10_000))
    assert len(apart2.fire(_finding(cause, T0 + 60_000, **_scope_out(cause, rule)))) == 1


def test_a_resolved_stall_still_mutes_the_throughput_drop_of_the_steps_that_spanned_it() -> None:
    """job_stall -> throughput_drop has after_s: the step that spanned the stall closes after it resolved."""
    (edge,) = [r for c, s, r in EDGES if (c, s) == ("job_stall", "throughput_drop")]
    assert edge.after_ms > 0
    engine = _Engine()
    (stall,) = engine.fire(_finding("job_stall", T0 + 10_000))
    ended = T0 + 400_000
    engine.fire(_finding("job_stall", ended, active=False))
    (drop,) = engine.fire(_finding("throughput_drop", ended + edge.after_ms - 1_000))
    assert drop["inhibited_by"] == stall["alert_id"]
    # A drop beginning later than that is news.
    later = _Engine()
    later.fire(_finding("job_stall", T0 + 10_000))
    later.fire(_finding("job_stall", ended, active=False))
    (drop,) = later.fire(_finding("throughput_drop", ended + edge.after_ms + 1_000))
    assert drop["inhibited_by"] is None
    # Edges without after_s stop explaining when the cause resolves.
    assert not [
        r for c, s, r in EDGES if (c, s) == ("host_memory_pressure", "throughput_drop") and r.after_ms
    ]
    host = _Engine()
    (cause,) = host.fire(_finding("host_memory_pressure", T0 + 10_000))
    (while_firing,) = host.fire(_finding("throughput_drop", T0 + 20_000))
    assert while_firing["inhibited_by"] == cause["alert_id"]
    host.fire(_finding("throughput_drop", T0 + 30_000, active=False))
    host.fire(_finding("host_memory_pressure", T0 + 60_000, active=False))
    (drop,) = host.fire(_finding("throughput_drop", T0 + 61_000))
    assert drop["inhibited_by"] is None


def test_a_resolved_straggler_still_mutes_the_throughput_drop_of_the_windows_that_spanned_it() -> None:
    """A GPU slow for 150 s: the straggler resolved, the job's drop over the windows it spanned fired 5 s later."""
    (edge,) = [r for c, s, r in EDGES if (c, s) == ("straggler", "throughput_drop")]
    engine = _Engine()
    (straggler,) = engine.fire(_finding("straggler", T0 + 10_000))
    engine.fire(_finding("straggler", T0 + 160_000, active=False))
    (drop,) = engine.fire(_finding("throughput_drop", T0 + 165_000))
    assert drop["inhibited_by"] == straggler["alert_id"]
    later = _Engine()
    later.fire(_finding("straggler", T0 + 10_000))
    later.fire(_finding("straggler", T0 + 160_000, active=False))
    (drop,) = later.fire(_finding("throughput_drop", T0 + 160_000 + edge.after_ms + 1_000))
    assert drop["inhibited_by"] is None


def test_a_cause_never_mutes_the_alert_that_mutes_it_and_chains_fold_into_the_root_group() -> None:
    engine = _Engine()
    (thr,) = engine.fire(_finding("gpu_throttling", T0 + 10_000))
    (strag,) = engine.fire(_finding("straggler", T0 + 20_000))
    (drop,) = engine.fire(_finding("throughput_drop", T0 + 30_000))
    assert strag["inhibited_by"] == thr["alert_id"]
    # The drop is explained by both (the GPU fault, the straggler): one root group either way.
    assert drop["inhibited_by"] in (thr["alert_id"], strag["alert_id"])
    assert drop["group_key"] == strag["group_key"] == thr["group_key"]


def test_grouper_state_keeps_open_symptoms_so_a_restored_engine_mutes_them_later() -> None:
    first = _Engine()
    (sym,) = first.fire(_finding("job_stall", T0 + 10_000))
    restored = _Engine()
    restored.tracker.load_state(first.tracker.state())
    restored.grouper.load_state(first.grouper.state())
    out = restored.fire(_finding("rank_hang", T0 + 40_000))
    assert [r["rule"] for r in out] == ["rank_hang", "job_stall"]
    assert out[1]["alert_id"] == sym["alert_id"] and out[1]["inhibited_by"] == out[0]["alert_id"]


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ({"inhibit_rules": [{"cause": "a", "mutes": ["b"], "scope": "rack"}]}, "scope"),
        ({"inhibit_rules": [{"cause": "a", "mutes": ["b"]}]}, "scope"),
        ({"inhibit_rules": [{"cause": "a", "mutes": "b c", "scope": "job"}]}, "not a rule name"),
        ({"inhibit_rules": [{"cause": "a", "mutes": ["a"], "scope": "job"}]}, "cannot mute itself"),
        ({"inhibit_rules": [{"cause": "a", "mutes": ["b"], "scope": "job", "after_s": -1}]}, "after_s"),
        ({"inhibit_rules": [{"cause": "a", "mutes": ["b"], "scope": "job", "when": 1}]}, "unknown key"),
        (
            {
                "inhibit_rules": [
                    {"cause": "a", "mutes": ["b"], "scope": "job"},
                    {"cause": "b", "mutes": ["c"], "scope": "job"},
                    {"cause": "c", "mutes": ["a"], "scope": "gpu"},
                ]
            },
            r"cycle \(a -> b -> c -> a\)",
        ),
    ],
)
def test_a_bad_edge_is_one_sentence_naming_it(bad: dict[str, Any], says: str) -> None:
    with pytest.raises(RoutingError, match=says):
        Router.from_dict(bad, source="r.yaml")


# -- the rendered Alertmanager configuration -------------------------------------------------------

_MATCHER = re.compile(r'^(?P<label>[A-Za-z_][A-Za-z0-9_]*)(?P<op>=~|!~|!=|=)"(?P<value>(?:[^"\\]|\\.)*)"$')


def _holds(matcher: str, labels: dict[str, str]) -> bool:
    """One Alertmanager matcher against a label set (a missing label is ""; regexes fully anchored)."""
    m = _MATCHER.match(matcher)
    assert m, matcher
    value = m["value"].replace('\\"', '"').replace("\\\\", "\\")
    have = labels.get(m["label"], "")
    hit = re.fullmatch(value, have) is not None if m["op"] in ("=~", "!~") else have == value
    return hit == (m["op"] in ("=", "=~"))


def _mutes(config: dict[str, Any], source: dict[str, str], target: dict[str, str]) -> bool:
    """Alertmanager's inhibition: some rule whose source and target matchers hold and whose `equal` labels agree."""
    for rule in config["inhibit_rules"]:
        sides = all(_holds(m, source) for m in rule["source_matchers"]) and all(
            _holds(m, target) for m in rule["target_matchers"]
        )
        if sides and all(source.get(name, "") == target.get(name, "") for name in rule.get("equal", [])):
            return True
    return False


def _labels(finding: Finding, team: str = "team-a") -> dict[str, str]:
    record = AlertTracker()._record(
        finding, {"starts_at": finding.ts}, "firing", finding.ts, None, _topology()
    )
    labels: dict[str, str] = to_alertmanager({**record, "team": team, "receiver": "x"})["labels"]
    return labels


RENDERED = render_alertmanager_config(load_ownership(DEFAULT_ROUTING_PATH.parent / "ownership.yaml"), RULES)


@pytest.mark.parametrize(("cause", "symptom", "rule"), EDGES, ids=[f"{c}->{s}" for c, s, _ in EDGES])
def test_the_rendered_alertmanager_config_mutes_each_edge_in_scope_only(
    cause: str, symptom: str, rule: InhibitRule
) -> None:
    config = RENDERED.config
    target = _labels(_finding(symptom, T0))
    # Another team's copy of the cause mutes this team's symptom too: inhibition is global.
    assert _mutes(config, _labels(_finding(cause, T0), team="infra"), target), (cause, symptom)
    own_label = (rule.scope == "gpu" and symptom in RANK_ALERTS) or (
        rule.scope == "node" and symptom in RANK_ALERTS | NODE_ALERTS
    )
    if rule.scope == "job" or own_label:
        # Alertmanager compares labels: a symptom without the scope's label (a job-level one) is
        # muted by a fault of its own job anywhere (the engine checks the job's bindings).
        assert not _mutes(config, _labels(_finding(cause, T0, **_scope_out(cause, rule))), target)
    assert not _mutes(config, target, _labels(_finding(cause, T0))) or (symptom, cause) in {
        (c, s) for c, s, _ in EDGES
    }


def test_the_rendered_config_routes_what_the_engine_muted_to_a_receiver_that_notifies_nobody() -> None:
    config = RENDERED.config
    first = config["route"]["routes"][0]
    assert first == {"matchers": ['inhibited_by=~".+"'], "receiver": MUTED_RECEIVER}
    assert {"name": MUTED_RECEIVER} in config["receivers"]
    muted = _labels(_finding("job_stall", T0))
    assert "inhibited_by" not in muted
    record = AlertTracker()._record(
        _finding("job_stall", T0), {"starts_at": T0}, "firing", T0, None, _topology()
    )
    labels = to_alertmanager({**record, "team": "t", "receiver": "x", "inhibited_by": "abc"})["labels"]
    assert labels["inhibited_by"] == "abc" and _holds(first["matchers"][0], labels)
    assert RENDERED.warnings == ()


def test_pages_word_a_muted_alert_by_its_edge() -> None:
    """What the fleet and job pages show for a muted alert (issue 20.4)."""
    assert (
        muted_by_text(RULES, "gpu_throttling", "straggler")
        == "straggler, muted by gpu_throttling on the same GPU"
    )
    assert muted_by_text(RULES, "rank_hang", "job_stall") == "job_stall, muted by rank_hang in the same job"
    assert muted_by_text(RULES, "host_memory_pressure", "straggler").endswith("on the same node")
    assert edge_for(RULES, "job_stall", "rank_hang") is None
    assert muted_by_text(RULES, "job_stall", "rank_hang") == "rank_hang, muted by job_stall"


def test_a_watchdog_timeout_long_after_a_hang_is_muted_by_it_while_its_incident_is_open_and_after() -> None:
    """Issue 33.2: rank 3 hangs; the job stalls (muted, same incident); 10 min later the NCCL
    watchdog on the other ranks times out (dependency_timeout) and ranks exit (rank_failed): both
    are the hang's consequences, muted by it although the hang itself resolved when the job ended
    -- the incident was still open (the stall fires), and the edge's after_s covers the watchdog
    timeout after the incident closed."""
    (edge,) = [r for c, s, r in EDGES if (c, s) == ("rank_hang", "dependency_timeout")]
    engine = _Engine()
    (hang,) = engine.fire(_finding("rank_hang", T0 + 100_000))
    (stall,) = engine.fire(_finding("job_stall", T0 + 101_000))
    assert stall["inhibited_by"] == hang["alert_id"]
    engine.fire(_finding("rank_hang", T0 + 200_000, active=False))
    # The stall still fires: the incident is open, longer after the hang's end than after_s.
    late = T0 + 200_000 + edge.after_ms + 60_000
    (timeout,) = engine.fire(_finding("dependency_timeout", late))
    assert timeout["inhibited_by"] == hang["alert_id"] and timeout["group_key"] == hang["group_key"]
    engine.fire(_finding("job_stall", late + 50_000, active=False))
    engine.fire(_finding("dependency_timeout", late + 51_000, active=False))
    # The incident closed at late + 51 s: an exit up to after_s later is still the hang's.
    (exit_,) = engine.fire(_finding("rank_failed", late + 51_000 + edge.after_ms - 5_000))
    assert exit_["inhibited_by"] == hang["alert_id"]
    # Past that it is news.
    later = _Engine()
    later.fire(_finding("rank_hang", T0 + 100_000))
    later.fire(_finding("rank_hang", T0 + 200_000, active=False))
    (news,) = later.fire(_finding("dependency_timeout", T0 + 200_000 + edge.after_ms + 5_000))
    assert news["inhibited_by"] is None
