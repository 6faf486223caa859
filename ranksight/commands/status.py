"""`ranksight status`: the pipeline's health on one screen (lag per group and topic, rates, dead letters, firing alerts)."""

from __future__ import annotations

import re
import time
import uuid
from typing import Any

import typer

from ranksight.console import console, fail, user_errors

__all__ = ["is_throwaway_group", "register"]


def status(
    interval: float = typer.Option(
        2.0, "--interval", min=0.1, help="Seconds between the two end-offset readings the rates come from."
    ),
    max_alerts: int = typer.Option(20, "--max-alerts", min=0, help="Firing alerts listed (all are counted)."),
) -> None:
    """Consumer-group lag per topic, records/s per topic, dead letters kept, alerts firing now."""
    from confluent_kafka import KafkaException

    from ranksight.broker import check_broker, kafka_settings

    with user_errors():
        settings = kafka_settings()
        check_broker(settings)
    assert settings.kafka_bootstrap is not None
    try:
        _status(settings, interval, max_alerts)
    except KafkaException as exc:
        fail(f"Kafka at {settings.kafka_bootstrap} does not answer ({exc.args[0].str()}): is it running?")


def _status(settings: Any, interval: float, max_alerts: int) -> None:
    from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, TopicPartition
    from confluent_kafka.admin import AdminClient

    from infra.kafka.quiet import quiet_kafka_conf
    from schemas.codec import codec_from_settings
    from schemas.errors import DecodeError
    from schemas.topics import ALERTS, DEADLETTER, TOPICS
    from streams.status import firing_alerts, lag_by_topic, rates_by_topic

    prefix = settings.topic_prefix
    conf = quiet_kafka_conf(settings.kafka_config())
    admin = AdminClient({**conf, "log_level": 0})
    consumer = Consumer(
        {
            **conf,
            "group.id": f"ranksight-status-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "log_level": 0,
        }
    )
    try:
        meta = consumer.list_topics(timeout=10)
        ours = {prefix + t: t for t in TOPICS}
        tps = [
            (name, p)
            for name, t in sorted(meta.topics.items())
            if name in ours and t.error is None
            for p in sorted(t.partitions)
        ]
        if not tps:
            fail(
                f"no rs.* topics at {settings.kafka_bootstrap} (prefix {prefix!r}): run `ranksight kafka topics`"
            )

        def ends() -> tuple[dict[tuple[str, int], int], dict[tuple[str, int], int]]:
            lows, highs = {}, {}
            for name, p in tps:
                lows[(name, p)], highs[(name, p)] = consumer.get_watermark_offsets(
                    TopicPartition(name, p), timeout=10
                )
            return lows, highs

        _, before = ends()
        began = time.monotonic()
        time.sleep(interval)  # the rates are appends between two readings
        lows, after = ends()
        rates = rates_by_topic(before, after, time.monotonic() - began)

        groups = sorted(g.group_id for g in admin.list_consumer_groups(request_timeout=10).result().valid)
        lags: dict[str, dict[str, int]] = {}
        for group in groups:
            if is_throwaway_group(group):
                continue  # throw-away readers (status, tails) commit nothing
            request = [ConsumerGroupTopicPartitions(group)]
            answer = admin.list_consumer_group_offsets(request, request_timeout=10)[group].result()
            committed = {
                (tp.topic, tp.partition): tp.offset
                for tp in answer.topic_partitions or []
                if tp.topic in ours
            }
            if committed:
                lags[group] = lag_by_topic(committed, after)

        codec = codec_from_settings(settings.schema_registry_url)
        alert_topic = prefix + ALERTS
        alert_tps = [(n, p) for n, p in tps if n == alert_topic]
        records: list[dict[str, Any]] = []
        pending = {(n, p) for n, p in alert_tps if after[(n, p)] > lows[(n, p)]}
        consumer.assign([TopicPartition(n, p, lows[(n, p)]) for n, p in alert_tps])
        deadline = time.monotonic() + 30
        while pending and time.monotonic() < deadline:
            for msg in consumer.consume(1000, 0.5):
                if msg.error() is not None:
                    continue
                key = (msg.topic() or "", msg.partition() or 0)
                if (msg.offset() or 0) + 1 >= after.get(key, 0):
                    pending.discard(key)
                try:
                    records.append(codec.decode(msg.value() or b"").record)
                except DecodeError:
                    continue
    finally:
        consumer.close()

    deadletters = sum(after[k] - lows[k] for k in after if k[0] == prefix + DEADLETTER)
    firing = firing_alerts(records)
    out = console.print
    out(f"[bold]Kafka[/] {settings.kafka_bootstrap}  prefix {prefix!r}", highlight=False)
    out(f"{'topic':<28} {'records/s':>10} {'kept':>12}", highlight=False)
    for name in sorted({n for n, _ in tps}):
        kept = sum(after[k] - lows[k] for k in after if k[0] == name)
        out(f"{ours[name]:<28} {rates.get(name, 0.0):>10,.0f} {kept:>12,}", highlight=False)
    out("")
    if lags:
        out(f"{'consumer group':<40} {'topic':<28} {'lag':>10}", highlight=False)
        for group, by_topic in lags.items():
            for name, lag in sorted(by_topic.items()):
                out(f"{group:<40} {ours[name]:<28} {lag:>10,}", highlight=False)
    else:
        out("no consumer group has committed offsets on these topics (no sink or worker has run)")
    out("")
    out(f"dead letters: {deadletters:,} kept in {DEADLETTER}", highlight=False)
    out(f"firing alerts: {len(firing)}", highlight=False)
    print_firing(firing[-max_alerts:] if max_alerts else [])


def print_firing(records: list[Any]) -> None:
    """The firing alerts' lines, as `alerts tail` prints them (record strings shown literally)."""
    from ranksight.commands.alerts import alert_line

    for r in records:
        console.print("  " + alert_line(dict(r)), highlight=False, soft_wrap=True)


# `ranksight status` and `ranksight alerts tail` read with a group of their own, named so, and
# never commit. Not `ranksight-alerts-forward.*`: the forwarder's group commits and has a lag.
_THROWAWAY = re.compile(r"^ranksight-(status|alerts)-[0-9a-f]{8}$")


def is_throwaway_group(group: str) -> bool:
    """Whether `group` is a status or tail reader's own group (nothing committed, no lag to show)."""
    return _THROWAWAY.match(group) is not None


def register(app: typer.Typer) -> None:
    """Add the `status` command."""
    app.command("status")(status)
