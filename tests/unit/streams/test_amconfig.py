"""The rendered Alertmanager configuration: team and category routes, repeat intervals, escalation, inhibition,
and the runbook link and silences of the Alertmanager bridge."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx

from streams.alerting.alertmanager import read_silences, runbook_link, to_alertmanager
from streams.alerting.amconfig import matcher, render_alertmanager_config
from streams.alerting.grouping import InhibitRule
from streams.alerting.ownership import Ownership
from streams.alerting.routing import Route

OWNERSHIP: dict[str, Any] = {
    "teams": {
        "infra-ops": {"page": "infra-pager", "inform": "infra-chat"},
        "platform": {"page": "platform-pager"},
        "llm": {"page": "llm-pager", "inform": "llm-chat", "escalate": "llm-lead"},
    },
    "other_teams": {"page": "platform-pager", "inform": "platform-chat"},
    "owners": {"infra": "infra-ops", "platform": "platform", "model": "{job.team}", "data": "{job.team}"},
    "inform_job_team": ["infra"],
    "receivers": {"llm-pager": {"webhook_configs": [{"url": "http://hooks.invalid/llm"}]}},
    "alertmanager": {
        "group_by": {"infra": ["cluster", "node", "alertname"]},
        "repeat_interval": {"critical": "30m"},
        "escalation": {"after": "15m", "receiver": "duty-manager"},
    },
}


def _render(**kw: Any) -> dict[str, Any]:
    return render_alertmanager_config(Ownership.from_dict(OWNERSHIP), **kw).config


def _team_route(config: dict[str, Any], team: str) -> dict[str, Any]:
    return next(r for r in config["route"]["routes"] if r.get("matchers") == [f'team="{team}"'])


def _walk(route: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield route
    for child in route.get("routes", []):
        yield from _walk(child)


def test_each_team_is_routed_to_its_page_receiver_and_unlisted_teams_to_other_teams() -> None:
    config = _render()
    assert config["route"]["receiver"] == "platform-pager"
    assert _team_route(config, "llm")["receiver"] == "llm-pager"
    assert _team_route(config, "infra-ops")["receiver"] == "infra-pager"


def test_informational_copies_go_to_the_inform_receiver_before_escalation() -> None:
    children = _team_route(_render(), "llm")["routes"]
    assert children[0] == {
        "matchers": ['receiver="llm-chat"'],
        "receiver": "llm-chat",
        "repeat_interval": "24h",
    }
    escalations = [c for c in children if c.get("continue")]
    assert all(e["receiver"] == "llm-lead" and e["group_wait"] == "15m" for e in escalations)
    # A job team owns model and data alerts; its informed infra copies never escalate.
    assert [e["matchers"] for e in escalations] == [
        ['severity="critical"', 'category="model"'],
        ['severity="critical"', 'category="data"'],
    ]


def test_escalation_follows_cluster_ownership() -> None:
    """infra-ops owns infra everywhere but on the provider's cluster, where only the provider escalates."""
    ownership = {**OWNERSHIP, "teams": {**OWNERSHIP["teams"], "noc": {"page": "noc-pager"}}}
    ownership["clusters"] = {"east.1": {"infra": "noc"}}
    config = render_alertmanager_config(Ownership.from_dict(ownership)).config

    def escalated_infra(team: str) -> list[list[str]]:
        routes = _team_route(config, team)["routes"]
        return [r["matchers"] for r in routes if r.get("continue") and 'category="infra"' in r["matchers"]]

    # In Alertmanager's quoting the regex east\.1 (a literal dot) reads east\\.1.
    assert escalated_infra("infra-ops") == [
        ['severity="critical"', 'category="infra"', r'cluster!~"east\\.1"']
    ]
    assert escalated_infra("noc") == [['severity="critical"', 'category="infra"', r'cluster=~"east\\.1"']]


def test_category_routes_carry_group_by_and_severity_routes_their_repeat_interval() -> None:
    children = _team_route(_render(), "infra-ops")["routes"]
    infra = next(c for c in children if c.get("matchers") == ['category="infra"'])
    assert infra["group_by"] == ["cluster", "node", "alertname"]
    assert [(r["matchers"], r["repeat_interval"]) for r in infra["routes"]] == [
        (['severity="critical"'], "30m"),
        (['severity="warning"'], "4h"),
        (['severity="info"'], "24h"),
    ]


def test_every_receiver_named_anywhere_is_defined_once_with_its_integrations() -> None:
    config = _render()
    names = [r["name"] for r in config["receivers"]]
    assert len(names) == len(set(names))
    used = {r["receiver"] for r in _walk(config["route"]) if "receiver" in r}
    assert used <= set(names) and "duty-manager" in names
    llm = next(r for r in config["receivers"] if r["name"] == "llm-pager")
    assert llm["webhook_configs"] == [{"url": "http://hooks.invalid/llm"}]


def test_explicit_route_receivers_get_their_own_route_under_the_team() -> None:
    route = Route(team="platform", receiver="platform-chat", match={"rule": "clock_skew"})
    children = _team_route(_render(routes=[route]), "platform")["routes"]
    assert children[0]["matchers"] == ['receiver="platform-chat"']


def test_inhibit_rules_map_fields_to_labels_and_scopes_to_equal_labels() -> None:
    rules = [
        InhibitRule(
            source_match_re={"rule": re.compile("xid_error|ecc_uncorrectable")},
            target_match={"rule": "straggler"},
            scope="gpu",
        ),
        InhibitRule(
            source_match={"rule": "rank_hang"}, target_match={"rule": "job_stall"}, equal=("job_id",)
        ),
        InhibitRule(source_match={"suspected_layer": "gpu"}, target_match={"rule": "x"}),
        InhibitRule.edge(["rank_hang"], ["job_stall", "zombie_job"], "job"),
    ]
    rendered = render_alertmanager_config(Ownership.from_dict(OWNERSHIP), rules)
    assert rendered.config["inhibit_rules"] == [
        {
            "source_matchers": ['alertname=~"xid_error|ecc_uncorrectable"'],
            "target_matchers": ['alertname="straggler"', 'gpu_uuid=~".+"'],
            "equal": ["gpu_uuid"],
        },
        {
            "source_matchers": ['alertname=~"xid_error|ecc_uncorrectable"'],
            "target_matchers": ['alertname="straggler"', 'gpu_uuid=""'],
            "equal": ["job"],
        },
        {
            "source_matchers": ['alertname="rank_hang"'],
            "target_matchers": ['alertname="job_stall"'],
            "equal": ["job_id"],
        },
        {
            # A job-scoped edge: the same `job` label, which the target must have (equal holds on two blanks).
            "source_matchers": ['alertname=~"rank_hang"'],
            "target_matchers": ['alertname=~"job_stall|zombie_job"', 'job=~".+"'],
            "equal": ["job"],
        },
    ]
    assert rendered.warnings == ("inhibit_rules[2] left out: Alertmanager sees no label for suspected_layer",)
    assert "&id" not in rendered.text  # no YAML anchors: each rule reads on its own


def test_matcher_values_are_escaped() -> None:
    assert matcher("team", 'a"b\\c') == 'team="a\\"b\\\\c"'


# -- runbook links -----------------------------------------------------------------------------------


def test_a_relative_runbook_link_becomes_absolute_from_the_base_or_the_ui() -> None:
    record = {"rule": "zombie_job", "runbook_url": "docs/runbooks/zombie_job"}
    assert runbook_link(record) == "docs/runbooks/zombie_job"
    assert runbook_link(record, ui_url="http://ui:8080/") == "http://ui:8080/runbooks/zombie_job"
    assert (
        runbook_link(record, runbook_base_url="https://wiki/rb", ui_url="http://ui")
        == "https://wiki/rb/zombie_job"
    )
    absolute = {**record, "runbook_url": "https://runbooks.example/zombie_job"}
    assert runbook_link(absolute, ui_url="http://ui") == "https://runbooks.example/zombie_job"


def test_alertmanager_receives_the_absolute_runbook_link() -> None:
    record = {
        "rule": "zombie_job",
        "fingerprint": "zombie_job/j",
        "starts_at": 1_767_225_600_000,
        "runbook_url": "docs/runbooks/zombie_job",
        "status": "firing",
        "alert_id": "a1",
    }
    alert = to_alertmanager(record, ui_url="http://ui:8080")
    assert alert["annotations"]["runbook_url"] == "http://ui:8080/runbooks/zombie_job"
    assert alert["generatorURL"] == "http://ui:8080/alerts/a1"


# -- silences ----------------------------------------------------------------------------------------

_SILENCES = [
    {
        "id": "s-1",
        "status": {"state": "active"},
        "matchers": [
            {"name": "alertname", "value": "rank_hang", "isRegex": False, "isEqual": True},
            {"name": "rank", "value": "3|4", "isRegex": True, "isEqual": True},
        ],
        "createdBy": "oncall@example",
        "comment": "ack: looking at rank 3",
        "startsAt": "2026-01-01T00:00:00Z",
        "endsAt": "2026-01-01T02:00:00Z",
    },
    {"id": "s-0", "status": {"state": "expired"}, "matchers": [], "createdBy": "", "comment": ""},
]
_ALERTS = [
    {"labels": {"fingerprint": "rank_hang/j/3", "team": "platform"}, "status": {"silencedBy": ["s-1"]}},
    {"labels": {"fingerprint": "rank_hang/j/1", "team": "platform"}, "status": {"silencedBy": []}},
]


def test_silences_and_the_alerts_they_mute_are_read_from_the_v2_api() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        body = {"/api/v2/silences": _SILENCES, "/api/v2/alerts": _ALERTS}[request.url.path]
        return httpx.Response(200, json=body)

    client = httpx.Client(transport=httpx.MockTransport(answer))
    report = read_silences("http://am:9093", client=client)
    assert [s.id for s in report.active()] == ["s-1"]
    silence = report.active()[0]
    assert silence.matchers == (("alertname", "=", "rank_hang"), ("rank", "=~", "3|4"))
    assert silence.matches({"alertname": "rank_hang", "rank": "3"})
    assert not silence.matches({"alertname": "rank_hang", "rank": "33"})  # anchored, as Alertmanager
    assert report.silenced_by({"fingerprint": "rank_hang/j/3", "team": "platform"}) == ("s-1",)
    assert report.silenced_by({"fingerprint": "rank_hang/j/1", "team": "platform"}) == ()
    assert silence.as_dict()["comment"] == "ack: looking at rank 3"


def test_an_unreachable_alertmanager_is_one_sentence() -> None:
    import pytest

    from streams.alerting.alertmanager import AlertmanagerError

    with pytest.raises(AlertmanagerError, match="cannot reach Alertmanager"):
        read_silences("http://127.0.0.1:9", timeout_s=0.5)
