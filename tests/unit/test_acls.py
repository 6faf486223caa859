"""The authorization model (infra.kafka.acls): who may write each topic, as docs/security.md states it."""

from __future__ import annotations

import pytest

from infra.errors import KafkaSetupError
from infra.kafka.acls import Principals, grants, render, writers


def test_who_may_write_each_topic() -> None:
    model = writers(grants(Principals(), prefix="p."))
    assert model == {
        "p.rs.telemetry.gpu": {"agent"},
        "p.rs.telemetry.host": {"agent"},
        "p.rs.telemetry.job": {"agent"},
        "p.rs.telemetry.unattributed": {"agent"},
        "p.rs.training.steps": {"sdk"},
        "p.rs.training.events": {"sdk"},
        "p.rs.scheduler.states": {"scheduler"},  # the job states a --job-states scheduler worker believes
        "p.rs.alerts": {"worker"},
        "p.rs.derived.rank": {"worker"},
        "p.rs.derived.job": {"worker"},
        "p.rs.deadletter": {"worker", "sink"},
        "p.rs.internal.*": {"worker"},
        "p.ranksight-detect*": {"worker"},  # changelogs
        "p.rs.actions": {"remediate"},
    }


def test_producers_and_readers_hold_no_grant_beyond_their_topics() -> None:
    model = grants(Principals())
    for role in ("agent", "sdk", "scheduler"):
        assert {g.operation for g in model if g.role == role} == {"WRITE", "DESCRIBE"}
        assert {g.resource for g in model if g.role == role} == {"TOPIC"}
        assert all(g.pattern == "LITERAL" for g in model if g.role == role)
    assert not [g for g in model if g.role == "reader" and g.operation not in ("READ", "DESCRIBE")]


def test_principals_are_named_per_role_and_a_bad_one_is_one_sentence() -> None:
    p = Principals.parse(["worker=User:detect", "sdk=User:CN=jobs,O=ml"])
    assert (p.worker, p.sdk, p.agent) == ("User:detect", "User:CN=jobs,O=ml", "User:ranksight-agent")
    assert "User:detect" in render(grants(p))
    for bad in ("janitor=User:x", "worker", "worker=detect", "worker=User:"):
        with pytest.raises(KafkaSetupError, match="--principal"):
            Principals.parse([bad])
