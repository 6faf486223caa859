"""A backlog of telemetry that no agent attributed to a job reaches the right engines, in time.

An older agent (or one that knows no jobs) publishes GPU and host samples without `job_id` /
`job_ids`; the worker re-keys them on its side path (`route`) while `detect` drains the training
records. In a catch-up `route` has far more to read than `detect`, so `detect` must hold its
engines until the side path has forwarded that far, or the samples arrive late and their alerts
(XID, host memory) are lost. The worker's alerts must equal the offline replay's.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from producers.simulator import load_scenario, simulate
from schemas.files import write_container
from schemas.records import Event
from schemas.topics import ALERTS, WORKER_SOURCES
from streams.offline.replay import replay_offline
from streams.runtime.options import DEFAULT_APP_ID, DEFAULT_RUNTIME
from tests.integration.streams.harness import AlertReader, Worker, group_lag, publish, recent


def _unattributed(event: Event) -> Event:
    if event.type == "GpuSample":
        return Event(event.type, {**event.record, "job_id": None, "run_id": None})
    if event.type == "HostSample":
        return Event(event.type, {**event.record, "job_ids": []})
    return event


def test_a_backlog_of_unattributed_telemetry_raises_the_offline_replays_alerts(
    kafka_bootstrap: str, topics: dict[str, str], topic_prefix: str, tmp_path: Path
) -> None:
    worker = Worker(kafka_bootstrap, topic_prefix, tmp_path, DEFAULT_RUNTIME)
    events = [_unattributed(e) for e in simulate(recent(load_scenario("mixed")), seed=0).events()]
    write_container(tmp_path / "events.avro", events)
    offline = [e.record for e in replay_offline([tmp_path / "events.avro"]) if e.type == "Alert"]
    expected = {(a["fingerprint"], a["status"]) for a in offline}
    # The telemetry-borne ones are what this is about.
    assert {a["rule"] for a in offline} >= {"xid_error", "host_memory_pressure"}, expected

    publish(kafka_bootstrap, topic_prefix, events)  # all of it first: a catch-up
    worker.start()
    reader = AlertReader(kafka_bootstrap, topics[ALERTS])
    group = topic_prefix + DEFAULT_APP_ID
    sources = [topic_prefix + t for t in WORKER_SOURCES]
    started = time.monotonic()

    def got(records: list[dict[str, Any]]) -> set[tuple[str, str]]:
        return {(r["fingerprint"], r["status"]) for r in records}

    try:
        # Wait on progress: every alert in, or the group has committed every source record (outputs
        # are delivered before their offsets are committed, so then a missing alert was lost).
        deadline = time.monotonic() + 600  # only against a hang
        while not got(reader.records) >= expected and time.monotonic() < deadline:
            if group_lag(kafka_bootstrap, group, sources) == 0:
                reader.poll_until(lambda rs: got(rs) >= expected, 10)
                break
            reader.poll_until(lambda rs: got(rs) >= expected, 5)
        reader.poll_until(lambda rs: False, 3)  # anything else in flight
    finally:
        reader.close()
        worker.stop()
    print(f"all {len(expected)} alert states after {time.monotonic() - started:.1f} s")
    assert got(reader.records) == expected, (got(reader.records) ^ expected, worker.log()[-3000:])
