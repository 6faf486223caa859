"""Routing: ordered routes, the job's own team, the default, and validation that names the bad key."""

from __future__ import annotations

from pathlib import Path

import pytest

from streams.alerting.routing import Router, load_router
from streams.errors import RoutingError

ALERT = {
    "rule": "xid_error",
    "category": "infra",
    "severity": "critical",
    "team": "llm",
    "node": "gpu-a-01",
    "job_id": "j",
    "labels": {"tier": "prod"},
}


def _router(routes: list[dict[str, object]], default: dict[str, str] | None = None) -> Router:
    return Router.from_dict(
        {"routes": routes, "default": default or {"team": "{job.team}", "receiver": "default"}}
    )


def test_the_first_matching_route_decides() -> None:
    router = _router(
        [
            {
                "match": {"category": "infra", "labels.tier": "prod"},
                "team": "infra-oncall",
                "receiver": "pager",
            },
            {"match": {"category": "infra"}, "team": "infra", "receiver": "mail"},
        ]
    )
    assert router.route(ALERT) == ("infra-oncall", "pager")
    assert router.route({**ALERT, "labels": {"tier": "dev"}}) == ("infra", "mail")


def test_regex_matchers_must_match_the_whole_value() -> None:
    router = _router([{"match_re": {"node": "gpu-a-.*"}, "team": "rack-a", "receiver": "r"}])
    assert router.route(ALERT) == ("rack-a", "r")
    assert router.route({**ALERT, "node": "xgpu-a-01"}) == ("llm", "default")


def test_unmatched_alerts_go_to_the_jobs_team_or_the_fallback_team() -> None:
    router = _router([], {"team": "{job.team}", "fallback_team": "platform", "receiver": "d"})
    assert router.route(ALERT) == ("llm", "d")
    assert router.route({**ALERT, "team": "", "job_id": ""}) == ("platform", "d")


def test_continue_delivers_to_every_matching_team() -> None:
    router = _router(
        [
            {"match": {"category": "infra"}, "team": "infra", "receiver": "pager", "continue": True},
            {"match": {"rule": "xid_error"}, "team": "{job.team}", "receiver": "slack"},
        ]
    )
    assert router.route_all(ALERT) == [("infra", "pager"), ("llm", "slack")]


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"routez": []}, "routez"),
        ({"routes": [{"match": {"rule": "x"}, "team": "t", "receiver": "r", "contnue": True}]}, "contnue"),
        ({"routes": [{"match": {"rulez": "x"}, "team": "t", "receiver": "r"}]}, "rulez"),
        ({"routes": [{"match": {"rule": "x"}, "receiver": "r"}]}, "team"),
        ({"routes": [{"match_re": {"rule": "("}, "team": "t", "receiver": "r"}]}, "match_re.rule"),
        ({"default": {"teem": "x"}}, "teem"),
    ],
)
def test_invalid_routing_is_rejected_naming_the_bad_key(data: dict[str, object], needle: str) -> None:
    with pytest.raises(RoutingError, match=needle):
        Router.from_dict(data)


def test_the_shipped_routing_file_pages_infrastructure_operations_and_informs_the_jobs_team() -> None:
    """An XID (infra) pages infrastructure operations; the job's team gets a copy at its inform receiver."""
    assert load_router().route_all(ALERT) == [
        ("infrastructure-operations", "infra-pager"),
        ("llm", "platform-chat"),  # llm is not listed in the ownership file: other_teams' receivers
    ]


def test_a_missing_routing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(RoutingError, match="does not exist"):
        load_router(tmp_path / "nope.yaml")
