"""The ownership file: owners per category and cluster, informed job teams, and the ownership invariant."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
import yaml

from streams.alerting.ownership import CATEGORIES, SEVERITIES, Ownership, load_ownership
from streams.alerting.routing import Router, load_router
from streams.detectors import rules_of
from streams.errors import RoutingError

OWNERSHIP: dict[str, Any] = {
    "teams": {
        "infra-ops": {"page": "infra-pager", "inform": "infra-chat"},
        "platform": {"page": "platform-pager"},
        "noc": {"page": "noc-pager"},
        "llm": {"page": "llm-pager", "inform": "llm-chat", "escalate": "llm-lead"},
    },
    "other_teams": {"page": "platform-pager", "inform": "platform-chat"},
    "owners": {"infra": "infra-ops", "platform": "platform", "model": "{job.team}", "data": "{job.team}"},
    "clusters": {"east": {"infra": "noc"}},
    "inform_job_team": ["infra"],
    "fallback_team": "platform",
}


def _alert(**kw: Any) -> dict[str, Any]:
    return {
        "rule": "xid_error",
        "category": "infra",
        "severity": "critical",
        "team": "llm",
        "cluster": "west",
        **kw,
    }


def _router(**changes: Any) -> Router:
    return Router(ownership=Ownership.from_dict({**OWNERSHIP, **changes}))


def test_infra_pages_infrastructure_operations_and_informs_the_jobs_team() -> None:
    deliveries = _router().explain(_alert())
    assert [(d.team, d.receiver, d.kind) for d in deliveries] == [
        ("infra-ops", "infra-pager", "page"),
        ("llm", "llm-chat", "inform"),
    ]
    assert "owners.infra" in deliveries[0].why and "informed, not paged" in deliveries[1].why


def test_the_provider_owns_infra_on_its_cluster() -> None:
    deliveries = _router().explain(_alert(cluster="east"))
    assert [(d.team, d.receiver) for d in deliveries] == [("noc", "noc-pager"), ("llm", "llm-chat")]
    assert "clusters.east.infra" in deliveries[0].why


def test_model_and_data_alerts_page_the_jobs_team_only() -> None:
    for category in ("model", "data"):
        deliveries = _router().explain(_alert(rule="nonfinite_loss", category=category))
        assert [(d.team, d.receiver, d.kind) for d in deliveries] == [("llm", "llm-pager", "page")]


def test_platform_alerts_page_the_platform_and_inform_the_job_team_only_when_asked() -> None:
    alert = _alert(rule="job_stall", category="platform")
    assert _router().route_all(alert) == [("platform", "platform-pager")]
    informed = _router(inform_job_team=["infra", "platform"]).route_all(alert)
    assert informed == [("platform", "platform-pager"), ("llm", "llm-chat")]


def test_an_unlisted_job_team_gets_the_other_teams_receivers_and_a_jobless_alert_the_fallback_team() -> None:
    assert _router().route_all(_alert(category="model", team="vision")) == [("vision", "platform-pager")]
    assert _router().route_all(_alert(category="model", team="")) == [("platform", "platform-pager")]


def test_info_alerts_never_page() -> None:
    assert _router().route_all(_alert(category="model", severity="info")) == [("llm", "llm-chat")]


def test_an_explicit_route_comes_first_and_continue_adds_ownership() -> None:
    ownership = Ownership.from_dict(OWNERSHIP)
    route = {
        "match": {"rule": "xid_error"},
        "team": "platform",
        "receiver": "platform-pager",
        "continue": True,
    }
    router = Router.from_dict({"routes": [route]})
    router.ownership = ownership  # the file is read by path in `load_router`; the object is the same
    assert router.route_all(_alert()) == [
        ("platform", "platform-pager"),
        ("infra-ops", "infra-pager"),
        ("llm", "llm-chat"),
    ]
    assert "routes[0] matched (rule=xid_error)" in router.explain(_alert())[0].why


def test_a_routing_file_names_its_ownership_file_relative_to_itself(tmp_path: Path) -> None:
    (tmp_path / "own.yaml").write_text(yaml.safe_dump(OWNERSHIP))
    (tmp_path / "routing.yaml").write_text(yaml.safe_dump({"ownership": "own.yaml", "routes": []}))
    assert load_router(tmp_path / "routing.yaml").route(_alert()) == ("infra-ops", "infra-pager")


def test_an_explicit_route_to_a_receiver_the_ownership_file_does_not_name_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "own.yaml").write_text(yaml.safe_dump(OWNERSHIP))
    route = {"match": {"rule": "x"}, "team": "platform", "receiver": "nobody"}
    (tmp_path / "routing.yaml").write_text(yaml.safe_dump({"ownership": "own.yaml", "routes": [route]}))
    with pytest.raises(RoutingError, match=r"routes\[0\].receiver 'nobody' is not a receiver"):
        load_router(tmp_path / "routing.yaml")


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        (
            {"owners": {"infra": "infra-ops", "platform": "platform", "model": "{job.team}"}},
            "category 'data'",
        ),
        ({"owners": {**OWNERSHIP["owners"], "infra": "ghost"}}, "owners.infra: team 'ghost'"),
        ({"clusters": {"east": {"gpu": "noc"}}}, "unknown category 'gpu'"),
        ({"teams": {**OWNERSHIP["teams"], "x": {"inform": "a"}}}, "teams.x: `page`"),
        ({"fallback_team": "ghost"}, "fallback_team"),
        ({"inform_job_team": ["hardware"]}, "inform_job_team"),
        ({"receivers": {"unused": {}}}, "receivers.unused is configured but no team uses it"),
        ({"alertmanager": {"repeat_interval": {"critical": "soon"}}}, "repeat_interval.critical"),
        ({"ownerz": {}}, "ownerz"),
    ],
)
def test_a_bad_ownership_file_is_rejected_naming_the_key(change: dict[str, Any], needle: str) -> None:
    with pytest.raises(RoutingError, match=needle):
        Ownership.from_dict({**OWNERSHIP, **change})


# -- the ownership invariant -------------------------------------------------------------------------


def test_no_shipped_rule_can_produce_a_critical_alert_that_reaches_no_receiver() -> None:
    """Walk every rule of every detector with every category and severity (the detectors choose both
    per finding, so each rule is tried with all), on a listed, an unlisted and no job team, on a plain
    cluster and on every cluster the ownership file overrides: each alert reaches a receiver the
    ownership file names (so the rendered Alertmanager configuration has it), and a critical or
    warning one pages someone."""
    router = load_router()
    ownership = router.ownership
    assert ownership is not None, "the shipped routing file must name an ownership file"
    known = set(ownership.all_receivers())
    paging = ownership.page_receivers()
    rules = sorted(rules_of())
    assert {"xid_error", "job_stall", "zombie_job", "nonfinite_loss"} <= set(rules)
    job_teams = [next(iter(ownership.teams)), "a-team-nobody-listed", ""]
    clusters = ["", "some-cluster", *ownership.clusters]
    checked = 0
    for rule, category, severity, team, cluster in itertools.product(
        rules, CATEGORIES, SEVERITIES, job_teams, clusters
    ):
        alert = {"rule": rule, "category": category, "severity": severity, "team": team, "cluster": cluster}
        routed = router.route_all(alert)
        where = f"{rule} ({category}, {severity}, team {team!r}, cluster {cluster!r})"
        assert routed, f"{where} reaches no receiver"
        assert all(team and receiver in known for team, receiver in routed), f"{where}: {routed}"
        if severity != "info":
            assert any(receiver in paging for _, receiver in routed), f"{where} pages nobody: {routed}"
        checked += 1
    assert checked == len(rules) * len(CATEGORIES) * len(SEVERITIES) * len(job_teams) * len(clusters)


def test_the_shipped_ownership_routes_infra_to_infrastructure_operations_and_platform_to_platform() -> None:
    ownership = load_ownership()
    assert ownership.owner_of("infra", "")[0] == "infrastructure-operations"
    assert ownership.owner_of("platform", "")[0] == "platform"
    assert ownership.owner_of("model", "")[0] == ownership.owner_of("data", "")[0] == "{job.team}"
    assert ownership.owner_of("infra", "provider-east")[0] == "provider-noc"
    assert {"infra", "platform"} <= ownership.inform_job_team


def test_storage_layer_alerts_page_the_storage_owner_and_inform_the_jobs_team() -> None:
    """Issue 35.5: a data-category alert whose suspected layer is storage pages the storage owner."""
    ownership = load_ownership()
    alert = {
        "rule": "file_open_drop",
        "category": "data",
        "severity": "warning",
        "team": "llm-pretrain",
        "cluster": "",
        "suspected_layer": "storage",
    }
    page, inform = ownership.deliveries(alert)
    assert (page.team, page.kind) == ("infrastructure-operations", "page") and "layers.storage" in page.why
    assert (inform.team, inform.kind) == ("llm-pretrain", "inform")
    # The same rule with the data layer stays the job team's page; a provider cluster's agreement wins.
    [own] = ownership.deliveries({**alert, "suspected_layer": "data"})
    assert (own.team, own.kind) == ("llm-pretrain", "page")
    assert ownership.owner_of("infra", "provider-east", "storage")[0] == "provider-noc"


def test_a_layer_owner_must_be_a_listed_team() -> None:
    data = {
        "teams": {"platform": {"page": "p"}},
        "other_teams": {"page": "p"},
        "owners": {"infra": "platform", "platform": "platform", "model": "{job.team}", "data": "{job.team}"},
        "layers": {"storage": "nobody"},
    }
    with pytest.raises(RoutingError, match=r"layers\.storage names team 'nobody'"):
        Ownership.from_dict(data)
