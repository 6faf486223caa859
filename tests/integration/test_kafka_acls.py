"""Who may write what, on a secured broker with KRaft's StandardAuthorizer (docs/security.md).

One SASL_SSL broker (SCRAM users admin, ranksight-agent, ranksight-sdk, ranksight-worker,
ranksight-remediate; admin is the only super user). `ranksight kafka acls --apply`, run as admin,
creates the model's bindings through the admin API. Then each principal produces to every topic:
the agent is accepted on telemetry only, the SDK on training records only, and neither may write
alerts, remediation decisions, derived windows, dead letters or the worker's internal topics; the
worker may write alerts and remediate its decisions.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import Producer

from infra.kafka.local import BrokerSecurity, LocalKafka, ensure_jars
from infra.kafka.tls import make_pki
from schemas.topics import (
    ACTIONS,
    ALERTS,
    DEADLETTER,
    DERIVED_JOB,
    SCHEDULER_STATES,
    TELEMETRY_GPU,
    TELEMETRY_JOB,
    TRAINING_EVENTS,
    TRAINING_STEPS,
)
from tests.integration.stopping import RANKSIGHT

ROLES = ("agent", "sdk", "scheduler", "worker", "remediate")
INTERNAL = "rs.internal.jobs"  # one of the worker's internal topics (streams.runtime.options.CONTROL)


@dataclass(frozen=True)
class Cluster:
    broker: LocalKafka
    ca: Path
    passwords: dict[str, str]

    def env(self, user: str, prefix: str) -> dict[str, str]:
        return {
            "PATH": "/usr/bin:/bin",
            **({"PYTHONPATH": os.environ["PYTHONPATH"]} if "PYTHONPATH" in os.environ else {}),
            "KAFKA_BOOTSTRAP": self.broker.bootstrap,
            "RANKSIGHT_TOPIC_PREFIX": prefix,
            "RANKSIGHT_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "RANKSIGHT_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
            "RANKSIGHT_KAFKA_SASL_USERNAME": user,
            "RANKSIGHT_KAFKA_SASL_PASSWORD": self.passwords[user],
            "RANKSIGHT_KAFKA_SSL_CA_LOCATION": str(self.ca),
        }

    def producer(self, user: str) -> Producer:
        conf = self.broker.client_config(username=user, password=self.passwords[user])
        return Producer({**conf, "message.timeout.ms": 20_000, "log_level": 0})


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    folder = tmp_path_factory.mktemp("acls")
    pki = make_pki(folder / "pki")
    users = ["admin", *(f"ranksight-{role}" for role in ROLES)]
    passwords = {user: "pw-" + secrets.token_urlsafe(12) for user in users}
    security = BrokerSecurity(
        pki.keystore, pki.keystore_password, passwords, ca_location=pki.ca_pem, super_users=("admin",)
    )
    broker = LocalKafka(folder / "kafka", libs=ensure_jars(), security=security)
    broker.start()
    try:
        yield Cluster(broker, pki.ca_pem, passwords)
    finally:
        broker.stop()


def _ranksight(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([RANKSIGHT, *args], env=env, capture_output=True, text=True, timeout=120)


def _write(cluster: Cluster, user: str, topics: list[str]) -> dict[str, str]:
    """Produce one record to each topic as `user`: topic -> "ok" or the error Kafka answered."""
    producer = cluster.producer(user)
    answers: dict[str, str] = {}

    def delivered(err: object, msg: object, topic: str) -> None:
        answers[topic] = "ok" if err is None else err.name()  # type: ignore[attr-defined]

    for topic in topics:
        producer.produce(topic, b"a claim", on_delivery=lambda err, msg, t=topic: delivered(err, msg, t))
    assert producer.flush(40) == 0
    return answers


def test_a_producer_principal_may_write_its_own_topics_and_is_refused_on_alerts_states_and_decisions(
    cluster: Cluster,
) -> None:
    prefix = f"a{uuid.uuid4().hex[:6]}."
    admin = cluster.env("admin", prefix)
    made = _ranksight(admin, "kafka", "topics")
    assert made.returncode == 0, made.stderr
    # The worker creates its internal topics itself; here the admin makes one to probe.
    from infra.kafka.topics import TopicSpec, create_topics

    create_topics(
        cluster.broker.bootstrap,
        [TopicSpec(INTERNAL, 1, 3_600_000)],
        prefix=prefix,
        conf=cluster.broker.client_config(username="admin", password=cluster.passwords["admin"]),
    )
    applied = _ranksight(admin, "kafka", "acls", "--apply")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert "ACL bindings in place" in applied.stdout
    again = _ranksight(admin, "kafka", "acls", "--apply")  # idempotent
    assert again.returncode == 0, again.stderr

    names = [
        TELEMETRY_GPU,
        TELEMETRY_JOB,
        TRAINING_STEPS,
        TRAINING_EVENTS,
        SCHEDULER_STATES,
        ALERTS,
        ACTIONS,
        DERIVED_JOB,
        DEADLETTER,
        INTERNAL,
    ]
    topics = [prefix + n for n in names]
    refused = "TOPIC_AUTHORIZATION_FAILED"
    agent = _write(cluster, "ranksight-agent", topics)
    assert agent == {prefix + n: ("ok" if n in (TELEMETRY_GPU, TELEMETRY_JOB) else refused) for n in names}, (
        agent
    )
    sdk = _write(cluster, "ranksight-sdk", topics)
    assert sdk == {
        prefix + n: ("ok" if n in (TRAINING_STEPS, TRAINING_EVENTS) else refused) for n in names
    }, sdk
    # Job states the detectors believe (`--job-states scheduler`): the scheduler watcher's word only.
    scheduler = _write(cluster, "ranksight-scheduler", topics)
    assert scheduler == {prefix + n: ("ok" if n == SCHEDULER_STATES else refused) for n in names}, scheduler
    worker = _write(cluster, "ranksight-worker", [prefix + ALERTS, prefix + INTERNAL, prefix + ACTIONS])
    assert worker == {prefix + ALERTS: "ok", prefix + INTERNAL: "ok", prefix + ACTIONS: refused}, worker
    remediate = _write(cluster, "ranksight-remediate", [prefix + ACTIONS, prefix + ALERTS])
    assert remediate == {prefix + ACTIONS: "ok", prefix + ALERTS: refused}, remediate


def test_applying_acls_needs_an_admin_principal(cluster: Cluster) -> None:
    done = _ranksight(cluster.env("ranksight-agent", "x."), "kafka", "acls", "--apply")
    assert done.returncode != 0
    assert "may not create ACLs" in done.stderr and "Traceback" not in done.stderr, done.stderr
