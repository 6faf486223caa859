"""Kafka publishers for the producer commands (`simulate --to-kafka`, `publish`, `agent`, the demo).

Every producer spools to `<home>/spool/<producer>` while Kafka is unreachable, so the next run of
any producer (or `ranksight spool drain`) finds and sends what an earlier run could not; and each
says "spooled", not "published", for events that only reached the disk.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from producers.publisher import KafkaPublisher, Publisher, SpoolDrain, drain_spools
from ranksight.broker import check_broker
from ranksight.errors import KafkaUnreachableError
from ranksight.settings import Settings
from ranksight.signals import StopSignals
from schemas.codec import Codec

__all__ = [
    "drain_other_spools",
    "finish",
    "open_kafka_publisher",
    "outcome_exit",
    "outcome_line",
    "progress_verb",
    "settle",
]


def drain_other_spools(
    settings: Settings, *, exclude: tuple[str, ...] = (), codec: Codec | None = None, timeout: float = 30.0
) -> list[SpoolDrain]:
    """Send what other producers' spools hold, when Kafka answers; [] when nothing waits or it does not."""
    from producers.spool import list_spools

    waiting = [s for s in list_spools(settings.spool_root) if s.events and s.name not in exclude]
    if not waiting:
        return []
    try:
        check_broker(settings, timeout=3.0)
    except KafkaUnreachableError:
        return []
    return drain_spools(
        settings.spool_root,
        settings.kafka_config(),
        codec=codec,
        topic_prefix=settings.topic_prefix,
        exclude=exclude,
        timeout=timeout,
    )


def open_kafka_publisher(
    settings: Settings,
    producer: str,
    *,
    codec: Codec | None = None,
    topic_prefix: str | None = None,
    spool_dir: Path | None = None,
    **knobs: Any,
) -> KafkaPublisher:
    """A publisher to the resolved Kafka that spools to `<home>/spool/<producer>` (or `spool_dir`)."""
    return KafkaPublisher(
        settings.kafka_config(),
        codec=codec,
        topic_prefix=settings.topic_prefix if topic_prefix is None else topic_prefix,
        spool_dir=spool_dir or settings.spool_root / producer,
        **knobs,
    )


def settle(publisher: Publisher, timeout: float) -> int:
    """Wait for delivery up to `timeout`, but not once Kafka is known to be away; returns what is pending."""
    deadline = time.monotonic() + timeout
    while True:
        pending = publisher.flush(min(0.5, max(0.0, deadline - time.monotonic())))
        if pending == 0 or publisher.stats.get("outage") or time.monotonic() >= deadline:
            return pending


def finish(publisher: Publisher, timeout: float, stop: StopSignals | None = None) -> int:
    """Deliver what is pending for up to `timeout`, then close; returns what was not delivered.

    Once a stop was asked for (SIGINT/SIGTERM) the whole of it fits in what is left of the stop
    budget: what Kafka has not acknowledged by then stays in the spool, never lost."""

    def budget(seconds: float) -> float:
        if stop is None or not stop.requested:
            return seconds
        return min(seconds, stop.remaining(floor=0.2))

    left = settle(publisher, budget(timeout) * (0.7 if stop is not None and stop.requested else 1.0))
    publisher.close(budget(5.0))
    return left


def progress_verb(stats: dict[str, Any]) -> str:
    """'spooled' while events go to disk (Kafka unreachable or the spool still draining), else 'published'."""
    return "spooled" if stats.get("outage") or stats.get("spool_events") else "published"


def outcome_exit(
    publisher: KafkaPublisher,
    sent: int,
    bootstrap: str,
    *,
    stop: StopSignals | None = None,
    total: int | None = None,
    what: str = "",
) -> None:
    """Print the run's last line (after `finish`); exit non-zero when it did not do its job.

    Exit 1 when Kafka took none of the events (all of them only reached the spool: a script must
    not go on as if they were published), 128 + signal when SIGINT/SIGTERM stopped the run early,
    else return (0)."""
    import typer

    from ranksight.console import console, fail

    line = what + outcome_line(publisher, sent, bootstrap)
    if stop is not None and stop.requested:
        of = f" of {total:,}" if total is not None else ""
        console.print(
            f"stopped by {stop.signal_name} after {sent:,}{of} events: {line}",
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(stop.exit_code)
    if sent and not publisher.stats.get("delivered"):
        fail(
            f"{what}Kafka at {bootstrap} took none of the {sent:,} events: they wait in "
            f"{publisher.spool.directory}; start Kafka (`ranksight kafka up`) or check KAFKA_BOOTSTRAP, then "
            "run `ranksight spool drain` (or any producer) to send them"
        )
    console.print(line, highlight=False, soft_wrap=True)


def outcome_line(publisher: KafkaPublisher, sent: int, bootstrap: str) -> str:
    """The last line of a producer run, after `close()`: how many events reached Kafka, how many only the disk."""
    kept = len(publisher.spool)
    if not kept:
        return f"published {sent:,} events to {bootstrap}"
    return (
        f"spooled {kept:,} of {sent:,} events to {publisher.spool.directory} (Kafka at {bootstrap} did not "
        "take them); the next run of any producer, or `ranksight spool drain`, sends them"
    )
