"""State keys shared by both runtimes and earlier versions, the worker's Kafka settings, in-flight tracking."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from streams.runtime.changelog import changelog_topic, key_name, state_key
from streams.runtime.options import WorkerOptions, kafka_config
from streams.runtime.side_path import InFlight


def test_state_keys_are_written_as_faust_tables_wrote_them() -> None:
    # Faust JSON-encodes str table keys: the same bytes let a group switch runtimes.
    assert state_key("engine@3") == json.dumps("engine@3").encode() == b'"engine@3"'
    assert key_name(b'"engine@3"') == "engine@3"
    assert key_name(b'"gpu-node-07"') == "gpu-node-07"
    # A key some other writer left raw still reads as its text.
    assert key_name(b"engine@3") == "engine@3"
    assert changelog_topic("g", "engine-snapshot") == "g-engine-snapshot-changelog"


def test_kafka_config_carries_the_security_settings(tmp_path: Path) -> None:
    plain = kafka_config(WorkerOptions(bootstrap="b:9092", workdir=tmp_path))
    assert plain == {"bootstrap.servers": "b:9092", "security.protocol": "PLAINTEXT"}
    sasl = kafka_config(
        WorkerOptions(
            bootstrap="b:9093",
            workdir=tmp_path,
            security_protocol="SASL_SSL",
            sasl_mechanism="SCRAM-SHA-512",
            sasl_username="rs",
            sasl_password="pw",
        )
    )
    assert sasl["security.protocol"] == "SASL_SSL"
    assert (sasl["sasl.mechanism"], sasl["sasl.username"], sasl["sasl.password"]) == (
        "SCRAM-SHA-512",
        "rs",
        "pw",
    )


def test_a_send_stays_in_flight_until_delivered_and_read_past() -> None:
    clock = [100.0]
    flight = InFlight("rs.internal.telemetry-by-job")
    read: dict[str, int] = {}
    first = flight.add(1_000, 2, clock[0])
    second = flight.add(2_000, 2, clock[0])
    assert flight.oldest(read.get, {2}, clock[0]) == 1_000  # not delivered yet
    InFlight.delivered(first, 10)
    InFlight.delivered(second, 11)
    clock[0] += 60  # time alone does not end it on a partition this worker reads
    assert flight.oldest(read.get, {2}, clock[0]) == 1_000
    read["rs.internal.telemetry-by-job:2"] = 10
    assert flight.oldest(read.get, {2}, clock[0]) == 2_000
    read["rs.internal.telemetry-by-job:2"] = 11
    assert flight.oldest(read.get, {2}, clock[0]) is None
    assert not flight.sent  # done sends are dropped


def test_a_failed_send_or_another_workers_partition_does_not_hold_forever() -> None:
    clock = [100.0]
    flight = InFlight("rs.internal.bindings")
    failed = flight.add(1_000, 0, clock[0])
    elsewhere = flight.add(3_000, 5, clock[0])  # partition 5 is read by another worker: a time bound
    InFlight.delivered(failed, None)
    del elsewhere
    none: dict[str, Any] = {}
    assert flight.oldest(none.get, {0}, clock[0]) == 3_000
    clock[0] += 1.0
    assert flight.oldest(none.get, {0}, clock[0]) is None
