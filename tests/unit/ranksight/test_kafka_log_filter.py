"""librdkafka's repeated lines print once per state change, with the count of repeats held back."""

from __future__ import annotations

import logging

import pytest

from infra.kafka.quiet import RepeatFilter, quiet_kafka_conf, quiet_logger


def _refused(client: str, after_ms: int, suppressed: int = 0) -> str:
    tail = f", {suppressed} identical error(s) suppressed" if suppressed else ""
    return (
        f"FAIL [{client}] [thrd:127.0.0.1:1/bootstrap]: 127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 "
        f"failed: Connection refused (after {after_ms}ms in state CONNECT{tail})"
    )


@pytest.fixture
def logger() -> logging.Logger:
    log = logging.getLogger(f"test.quiet.{id(object())}")
    log.addFilter(RepeatFilter())
    log.propagate = True
    return log


def test_two_hundred_refusals_print_one_line(
    logger: logging.Logger, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger=logger.name):
        for n in range(200):
            logger.warning("%s", _refused("rdkafka#consumer-1", n % 7, suppressed=n % 3))
    assert len(caplog.records) == 1


def test_a_state_change_prints_with_the_count_of_repeats(
    logger: logging.Logger, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger=logger.name):
        for n in range(5):
            logger.warning("%s", _refused("rdkafka#consumer-1", n))
        logger.warning(
            "FAIL [rdkafka#consumer-1] [thrd:127.0.0.1:1/bootstrap]: 127.0.0.1:1/bootstrap: timed out"
        )
        logger.warning("%s", _refused("rdkafka#consumer-1", 0))
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 3
    assert messages[1].endswith("timed out (the previous message repeated 4 more times)")
    assert "repeated" not in messages[2]  # the timeout was said once: nothing held back


def test_sources_are_tracked_apart(logger: logging.Logger, caplog: pytest.LogCaptureFixture) -> None:
    """A producer and a consumer refused by the same broker each say it once."""
    with caplog.at_level(logging.WARNING, logger=logger.name):
        for n in range(10):
            logger.warning("%s", _refused("rdkafka#producer-1", n))
            logger.warning("%s", _refused("rdkafka#consumer-2", n))
    assert len(caplog.records) == 2


def test_error_callbacks_go_through_the_same_filter(caplog: pytest.LogCaptureFixture) -> None:
    class _Err:
        def name(self) -> str:
            return "_TRANSPORT"

        def str(self) -> str:
            return "127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: Connection refused (after 3ms)"

    conf = quiet_kafka_conf({"bootstrap.servers": "127.0.0.1:1"}, name="test.quiet.errors")
    with caplog.at_level(logging.WARNING, logger="test.quiet.errors"):
        for _ in range(50):
            conf["error_cb"](_Err())
    assert len(caplog.records) == 1
    assert conf["logger"] is quiet_logger("test.quiet.errors")
    assert len([f for f in conf["logger"].filters if isinstance(f, RepeatFilter)]) == 1


def test_a_real_client_against_a_closed_port_logs_once(
    caplog: pytest.LogCaptureFixture, closed_port: int
) -> None:
    """A real librdkafka producer retrying a refused broker for a while: one line per kind, not dozens."""
    from confluent_kafka import Producer

    conf = quiet_kafka_conf(
        {
            "bootstrap.servers": f"127.0.0.1:{closed_port}",
            "reconnect.backoff.ms": 10,
            "reconnect.backoff.max.ms": 10,
        },
        name="test.quiet.real",
    )
    producer = Producer(conf)
    with caplog.at_level(logging.DEBUG, logger="test.quiet.real"):
        # Wait on progress: until librdkafka has retried many times (the filter counts the repeats).
        repeat_filter = next(f for f in conf["logger"].filters if isinstance(f, RepeatFilter))
        for _ in range(400):
            producer.poll(0.05)
            if repeat_filter.suppressed() >= 20:
                break
    assert repeat_filter.suppressed() >= 20
    assert len(caplog.records) <= 4, [r.getMessage() for r in caplog.records]


def test_the_sink_filters_its_consumers_librdkafka_logger(home: object) -> None:
    """sinks.consumer logs librdkafka through `sinks.kafka`; the sink command filters that logger."""
    from typer.testing import CliRunner

    from ranksight.cli import app

    CliRunner().invoke(app, ["sink"])  # fails (no Kafka) after setting up its logging
    assert any(isinstance(f, RepeatFilter) for f in logging.getLogger("sinks.kafka").filters)
