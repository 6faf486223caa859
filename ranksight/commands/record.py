"""`ranksight record`, `ranksight replay-kafka`, `ranksight publish`: Kafka history by time, and files back to Kafka.

The offline `ranksight replay FILES` lives in `replay.py`; these are its Kafka counterparts.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import typer

from ranksight.console import console, err_console, fail, user_errors
from ranksight.signals import StopRequested, StopSignals, stop_signals
from schemas.topics import (
    ALERTS_REPLAY,
    SCHEDULER_STATES,
    TELEMETRY_GPU,
    TELEMETRY_HOST,
    TRAINING_EVENTS,
    TRAINING_STEPS,
)

__all__ = ["SOURCES", "parse_time", "publish", "record", "register", "replay_kafka"]

# The producers' topics and the scheduler's: a recording holds what the worker would read. The
# scheduler's topic is skipped where a cluster has none (it was added after the others).
SOURCES = f"{TELEMETRY_GPU},{TELEMETRY_HOST},{TRAINING_STEPS},{TRAINING_EVENTS},{SCHEDULER_STATES}"
_RELATIVE = re.compile(r"^-(\d+(?:\.\d+)?)([smhd])$")
_UNIT_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_time(value: str, now_ms: int | None = None) -> int:
    """`now`, `-30m`/`-2h`/`-1d` (before now), ISO-8601 (UTC unless an offset is given), or UTC ms."""
    from schemas.files import parse_ts

    now = int(time.time() * 1000) if now_ms is None else now_ms
    text = value.strip()
    if text == "now":
        return now
    m = _RELATIVE.match(text)
    if m:
        return now - int(float(m.group(1)) * _UNIT_MS[m.group(2)])
    if text.isdigit():
        return int(text)
    try:
        return parse_ts(text)
    except ValueError:
        raise typer.BadParameter(
            f"{value!r} is not a time: use now, -30m, 2026-11-30T07:00:00Z or UTC ms"
        ) from None


def _kafka() -> tuple[dict[str, Any], str]:
    from infra.kafka.quiet import quiet_kafka_conf
    from ranksight.broker import check_broker, kafka_settings

    with user_errors():
        settings = kafka_settings()
        check_broker(settings)
    return quiet_kafka_conf(settings.kafka_config()), settings.topic_prefix


def _topics(spec: str, prefix: str) -> list[str]:
    names = [t.strip() for t in spec.split(",") if t.strip()]
    if not names:
        fail("--topics is empty: name at least one topic")
    return [prefix + t for t in names]


def _optional(spec: str, prefix: str) -> frozenset[str]:
    """The default list's scheduler topic may be missing; a topic the user names may not."""
    return frozenset({prefix + SCHEDULER_STATES}) if spec == SOURCES else frozenset()


def record(
    out: Path = typer.Option(..., "-o", "--out", help="Avro container file to write."),
    start: str = typer.Option(
        ..., "--from", help="Start time: now, -30m, ISO-8601 or UTC ms (Kafka record time)."
    ),
    end: str = typer.Option("now", "--to", help="End time (inclusive)."),
    topics: str = typer.Option(SOURCES, "--topics", help="Comma-separated topics (the prefix is added)."),
) -> None:
    """Write the events of a time range of Kafka topics to a file, sorted by event time."""
    from schemas.files import format_ts
    from streams.offline.kafka_replay import record_range

    conf, prefix = _kafka()
    start_ms, end_ms = parse_time(start), parse_time(end)
    names = _topics(topics, prefix)
    console.print(
        f"reading {', '.join(names)} from {format_ts(start_ms)} to {format_ts(end_ms)}", highlight=False
    )
    # A bounded read: SIGINT/SIGTERM (also when started with SIGINT ignored) end it where it is.
    with user_errors(), stop_signals(name="record", interrupt=True):
        stats = record_range(
            conf, names, start_ms, end_ms, out, progress=console.print, optional=_optional(topics, prefix)
        )
    console.print(
        f"wrote {stats.events} events to {out} ({stats.partitions} partitions, {stats.undecodable} undecodable skipped)"
    )


def replay_kafka(
    start: str = typer.Option(
        ..., "--from", help="Start time: now, -30m, ISO-8601 or UTC ms (Kafka record time)."
    ),
    end: str = typer.Option("now", "--to", help="End time (inclusive)."),
    topics: str = typer.Option(
        SOURCES, "--topics", help="Comma-separated source topics (the prefix is added)."
    ),
    alerts_topic: str = typer.Option(
        ALERTS_REPLAY, "--alerts-topic", help="Where replay alerts go (prefix added)."
    ),
    config: Path | None = typer.Option(
        None, "--config", help="Detector thresholds YAML to try (default: shipped)."
    ),
    routing: Path | None = typer.Option(None, "--routing", help="Alert routing YAML (default: shipped)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the alerts, publish nothing."),
) -> None:
    """Re-run detection over a time range of Kafka history with a separate engine; alerts to rs.alerts.replay."""
    from ranksight.commands.alerts import alert_line
    from schemas.files import format_ts
    from streams.alerting.routing import load_router
    from streams.config import load_config
    from streams.offline.detection import DetectionEngine
    from streams.offline.kafka_replay import replay_kafka as run

    conf, prefix = _kafka()
    start_ms, end_ms = parse_time(start), parse_time(end)
    names = _topics(topics, prefix)
    with user_errors(), stop_signals(name="replay-kafka", interrupt=True):
        engine = DetectionEngine(load_config(config), load_router(routing))
        console.print(
            f"replaying {', '.join(names)} from {format_ts(start_ms)} to {format_ts(end_ms)}", highlight=False
        )
        stats, alerts = run(
            conf,
            names,
            start_ms,
            end_ms,
            engine=engine,
            alerts_topic=prefix + alerts_topic,
            progress=console.print,
            publish=not dry_run,
            optional=_optional(topics, prefix),
        )
    for a in alerts:
        console.print(alert_line(a.record), highlight=False, soft_wrap=True)
    where = "not published (dry run)" if dry_run else f"published to {prefix + alerts_topic}"
    console.print(f"{stats.events} events, {stats.alerts} alert records {where}")


def publish(
    src: Path = typer.Argument(..., help="Avro container file of events (e.g. from `ranksight simulate`)."),
    speed: float = typer.Option(
        0.0, "--speed", min=0.0, help="Event-time pacing: 1 = real time, 0 = as fast as possible."
    ),
) -> None:
    """Publish a file of events to Kafka (telemetry by node, training by job)."""
    from ranksight.broker import check_broker, kafka_settings
    from ranksight.producing import (
        drain_other_spools,
        finish,
        open_kafka_publisher,
        outcome_exit,
        progress_verb,
    )
    from streams.offline.kafka_replay import publish_file

    # SIGINT/SIGTERM stop before the next event (or pacing wait); what was handed to Kafka is
    # flushed, or spooled, within the stop budget.
    with user_errors(), stop_signals(name="publish") as stop:
        settings = kafka_settings()
        assert settings.kafka_bootstrap is not None
        check_broker(settings, allow_unreachable=True)  # refused credentials: one sentence; away: spool
        drain_other_spools(settings, exclude=("publish",))
        publisher = open_kafka_publisher(settings, "publish")
        stoppable = _Stoppable(publisher, stop)
        pace = f"paced at {speed:g}x event time" if speed > 0 else "as fast as Kafka takes them"
        err_console.print(
            f"[dim]publishing {src} to {settings.kafka_bootstrap}, {pace}; Ctrl-C to stop[/]", highlight=False
        )
        try:
            publish_file(
                src,
                stoppable,
                speed=speed,
                sleep=stop.sleep,
                progress=lambda line: console.print(
                    line.replace("published", progress_verb(publisher.stats), 1)
                ),
            )
        except StopRequested:
            pass
        finally:
            finish(publisher, 60.0, stop)
        outcome_exit(publisher, stoppable.count, settings.kafka_bootstrap, stop=stop, what=f"{src}: ")


class _Stoppable:
    """A publisher that raises `StopRequested` before the next event once a stop was asked for."""

    def __init__(self, publisher: Any, stop: StopSignals) -> None:
        self._publisher = publisher
        self._stop = stop
        self.count = 0

    def publish(self, event: Any) -> None:
        """Publish one event, unless a signal asked the run to stop."""
        self._stop.check()
        self._publisher.publish(event)
        self.count += 1


def register(app: typer.Typer) -> None:
    """Add `record`, `replay-kafka` and `publish`."""
    app.command("record")(record)
    app.command("replay-kafka")(replay_kafka)
    app.command("publish")(publish)
