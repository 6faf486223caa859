"""Ask Kafka again while it is still getting ready: one helper for every caller that must wait.

A topic the caller has just created has no partition leader for a moment, and a fresh broker answers
group requests with "coordinator loading" while it creates `__consumer_offsets`. librdkafka does not
flag every one of these retriable, so the codes are named here. The caller gets its answer, or one
error saying what could not be done and why, after `wait_s`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["ELECTING", "STARTING", "ask_again"]

T = TypeVar("T")
log = logging.getLogger("ranksight.kafka")

# Names of `confluent_kafka.KafkaError` codes (looked up there, so importing this needs no client).
# A partition whose leader is still being elected, or whose topic the client's metadata lacks yet.
ELECTING = (
    "_UNKNOWN_PARTITION",
    "NOT_LEADER_FOR_PARTITION",
    "LEADER_NOT_AVAILABLE",
    "UNKNOWN_TOPIC_OR_PART",
    "_TIMED_OUT",
)
# A group coordinator that is still starting (a fresh broker).
STARTING = ("NOT_COORDINATOR", "COORDINATOR_LOAD_IN_PROGRESS", "COORDINATOR_NOT_AVAILABLE", "_TIMED_OUT")


def ask_again(
    call: Callable[[], T],
    what: str,
    error: Callable[[str], Exception],
    *,
    codes: tuple[str, ...] = ELECTING,
    wait_s: float = 60.0,
    pause_s: float = 0.5,
) -> T:
    """`call()`, asked again every `pause_s` while Kafka answers a retriable error or one of `codes`
    (for up to `wait_s`); otherwise `error("cannot <what> (<Kafka's reason>)")` is raised."""
    from confluent_kafka import KafkaError, KafkaException

    waiting = {getattr(KafkaError, name) for name in codes}
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return call()
        except KafkaException as exc:
            reason = exc.args[0] if exc.args else None
            retry = reason is not None and (reason.retriable() or reason.code() in waiting)
            text = reason.str() if reason is not None else str(exc)
            if not retry or time.monotonic() > deadline:
                raise error(f"cannot {what} ({text})") from exc
            log.info("cannot %s yet (%s); asking again", what, text)
            time.sleep(pause_s)
