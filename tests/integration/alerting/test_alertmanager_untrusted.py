"""Labels are not control, against Debian's real Alertmanager and a real broker: job labels reach
Alertmanager only when allowlisted, renamed to its syntax, never as `inhibited_by`, `receiver` or a
routing key; an alert Alertmanager refuses (400) is dead-lettered once with the reason and the
forwarder goes on and commits past it."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
from confluent_kafka import Consumer, Producer, TopicPartition

from schemas.codec import Codec
from schemas.records import Event
from schemas.topics import ALERTS, DEADLETTER, key_for
from streams.alerting.alertmanager import AlertForwarder, AlertmanagerClient
from streams.alerting.delivery import forward_topic
from tests.integration.alerting.conftest import Alertmanager
from tests.integration.alerting.test_remediate_kafka import _alert

CODEC = Codec()
NOW = int(time.time() * 1000)
CONFIG = """
route: {receiver: nobody, group_wait: 1h}
receivers: [{name: nobody}, {name: muted}]
"""


def _am(start_alertmanager: Any, tmp_path: Path) -> Alertmanager:
    config = tmp_path / "am.yml"
    config.write_text(CONFIG)
    am: Alertmanager = start_alertmanager(config)
    return am


def _hostile(job: str) -> dict[str, Any]:
    """A firing alert whose job claims labels that would mute or reroute it."""
    return {
        **_alert(job),
        "labels": {
            "inhibited_by": "someone-elses-cause",
            "receiver": "muted",
            "team": "nobody",
            "severity": "info",
            "ranksight.dev/remediate": "true",  # not Alertmanager syntax: was a 400 for the job
            "tier": "gold",
        },
    }


def _refused(job: str) -> dict[str, Any]:
    """A resolution that claims to end before it started: Alertmanager refuses it (400)."""
    return {**_alert(job, "resolved"), "starts_at": NOW - 60_000, "ends_at": NOW - 120_000, "ts": NOW}


def _labels_in_alertmanager(am: Alertmanager) -> dict[str, dict[str, str]]:
    alerts = httpx.get(f"{am.url}/api/v2/alerts", timeout=10).json()
    return {a["labels"]["job_id"]: a["labels"] for a in alerts}


def test_only_allowlisted_job_labels_reach_alertmanager_renamed_and_never_as_control(
    start_alertmanager: Any, tmp_path: Path
) -> None:
    am = _am(start_alertmanager, tmp_path)
    client = AlertmanagerClient(am.url)
    forwarder = AlertForwarder(client.post, job_labels=("ranksight.dev/remediate", "tier"))
    try:
        assert forwarder.handle_batch([_hostile("job-a")]) == 1
    finally:
        client.close()
    assert forwarder.take_refused() == []  # the documented label no longer gets the job's alerts refused
    labels = _labels_in_alertmanager(am)["job-a"]
    assert labels["ranksight_dev_remediate"] == "true" and labels["tier"] == "gold"
    assert "inhibited_by" not in labels and labels["receiver"] == "platform-pager"
    assert labels["team"] == "platform" and labels["severity"] == "warning"


def test_a_refused_alert_is_dead_lettered_once_and_the_forwarder_commits_past_it(
    start_alertmanager: Any, tmp_path: Path, kafka_bootstrap: str, topics: dict[str, str], group_id: str
) -> None:
    am = _am(start_alertmanager, tmp_path)
    conf = {"bootstrap.servers": kafka_bootstrap}
    records = [_alert("job-ok-1"), _refused("job-bad"), _alert("job-ok-2")]

    def publish(_: Any) -> None:
        """Once the forwarder is rebuilt (at the end of the topic): the records arrive live."""
        producer = Producer({**conf, "enable.idempotence": True})
        for record in records:
            value = CODEC.encode(Event("Alert", record))
            producer.produce(topics[ALERTS], key=key_for(ALERTS, record), value=value)
        assert producer.flush(30) == 0

    posted: list[list[str]] = []  # the job ids of each post
    client = AlertmanagerClient(am.url)

    def post(alerts: list[dict[str, Any]]) -> None:
        posted.append([a["labels"]["job_id"] for a in alerts])
        client.post(alerts)

    warnings: list[str] = []
    forwarder = AlertForwarder(post, resend_s=1.0)
    try:
        stats = forward_topic(
            conf,
            topics[ALERTS],
            group_id,
            forwarder,
            CODEC.decode,
            idle_exit_s=3.5,  # the resend ticks (every 1 s) run meanwhile
            warn=warnings.append,
            on_rebuilt=publish,
            deadletter_topic=topics[DEADLETTER],
        )
    finally:
        client.close()

    assert stats.received == 3 and stats.deadlettered == 1
    assert set(_labels_in_alertmanager(am)) == {"job-ok-1", "job-ok-2"}  # the others went on
    # Posted with its batch, then alone to find it; never again at the resend ticks that followed.
    assert sum("job-bad" in p for p in posted) == 2 and len(posted) >= 4, posted
    assert any("refused alert zombie_job of job job-bad" in w for w in warnings), warnings
    # Committed past it: every record of the alert topic.
    consumer = Consumer({**conf, "group.id": group_id, "enable.auto.commit": False})
    try:
        parts = consumer.list_topics(topics[ALERTS], timeout=10).topics[topics[ALERTS]].partitions
        tps = [TopicPartition(topics[ALERTS], p) for p in parts]
        ends = {tp.partition: consumer.get_watermark_offsets(tp, timeout=10)[1] for tp in tps}
        committed = {tp.partition: tp.offset for tp in consumer.committed(tps, timeout=10)}
        assert {p: o for p, o in committed.items() if ends[p]} == {p: e for p, e in ends.items() if e}
        # One dead letter, the refused record as it was read, the reason in its headers.
        meta = consumer.list_topics(topics[DEADLETTER], timeout=10).topics[topics[DEADLETTER]]
        dls = [TopicPartition(topics[DEADLETTER], p, 0) for p in meta.partitions]
        assert sum(consumer.get_watermark_offsets(tp, timeout=10)[1] for tp in dls) == 1
        consumer.assign(dls)
        letters = []
        deadline = time.monotonic() + 30
        while not letters and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                letters.append(msg)
    finally:
        consumer.close()
    headers = dict(letters[0].headers() or [])
    assert headers["x-component"] == b"alerts-forward"
    assert b"start time must be before end time" in headers["x-error"], headers
    assert CODEC.decode(letters[0].value()).record["job_id"] == "job-bad"
