"""librdkafka's log lines and errors, one line per state change: a dead broker is refused every backoff.

With Kafka away librdkafka reports the same "Connect to ... failed: Connection refused" every few
hundred milliseconds on every client (194 lines in 12 s from one sink). `RepeatFilter` is a
`logging.Filter` that lets a line through only when it differs from the previous line of the same
source (facility, client and broker thread), ignoring the numbers that change between repeats;
the next line that does get through says how many repeats were suppressed before it.

Every confluent-kafka client the project builds gets it through `quiet_kafka_conf` (a `logger`
and an `error_cb` on a filtered logger), or, for a client that brings its own logger (the sink's
consumer), through `quiet_logger(name)` on that logger.
"""

from __future__ import annotations

import logging
import re
import threading
from typing import Any

__all__ = ["RepeatFilter", "quiet_kafka_conf", "quiet_logger"]

# "FAIL [rdkafka#producer-1] [thrd:127.0.0.1:1/bootstrap]: <message>": who says it, then what.
_SOURCE = re.compile(r"^(\S+ \[[^\]]*\](?: \[thrd:[^\]]*\])?:?)\s*(.*)$", re.DOTALL)
# librdkafka's own repeat counter and timings change between otherwise identical lines.
_OWN_COUNT = re.compile(r",? ?\d+ identical error\(s\) suppressed")
_NUMBER = re.compile(r"\d+")


def _source_and_state(text: str) -> tuple[str, str]:
    match = _SOURCE.match(text)
    source, rest = (match.group(1), match.group(2)) if match else (text.split(" ", 1)[0], text)
    return source, _NUMBER.sub("N", _OWN_COUNT.sub("", rest))


class RepeatFilter(logging.Filter):
    """Passes a record only when its source's state changed; the next passed record counts the repeats."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._state: dict[str, str] = {}
        self._repeats: dict[str, int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        """False for a repeat of the source's current state; True (with a repeat count) otherwise."""
        text = record.getMessage()
        source, state = _source_and_state(text)
        with self._lock:
            if self._state.get(source) == state:
                self._repeats[source] = self._repeats.get(source, 0) + 1
                return False
            self._state[source] = state
            repeats = self._repeats.pop(source, 0)
        if repeats:
            record.msg = (
                f"{text} (the previous message repeated {repeats} more time{'s' if repeats > 1 else ''})"
            )
            record.args = None
        return True

    def suppressed(self) -> int:
        """Repeats held back and not yet reported."""
        with self._lock:
            return sum(self._repeats.values())


def quiet_logger(name: str) -> logging.Logger:
    """The logger `name` with one `RepeatFilter` attached (idempotent)."""
    logger = logging.getLogger(name)
    if not any(isinstance(f, RepeatFilter) for f in logger.filters):
        logger.addFilter(RepeatFilter())
    return logger


class _ErrorCallback:
    """A confluent-kafka `error_cb` that logs through a filtered logger."""

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger

    def __call__(self, err: Any) -> None:
        self._logger.warning("%s [error_cb]: %s", err.name(), err.str())


def quiet_kafka_conf(conf: dict[str, Any], name: str = "ranksight.kafka") -> dict[str, Any]:
    """`conf` plus a filtered `logger` and `error_cb` (kept when `conf` already has its own)."""
    logger = quiet_logger(name)
    return {"logger": logger, "error_cb": _ErrorCallback(logger), **conf}
