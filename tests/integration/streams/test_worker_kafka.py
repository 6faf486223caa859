"""Simulator -> Kafka -> `ranksight worker` (a real subprocess) -> rs.alerts, including a SIGKILL mid-run."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from producers.simulator import load_scenario, simulate
from schemas.files import parse_ts, write_container
from schemas.records import Event
from schemas.topics import ALERTS
from sinks.clickhouse import close_all, connect
from sinks.consumer import SinkConsumer
from sinks.ddl import migrate
from streams.offline.replay import replay_offline
from streams.runtime.options import DEFAULT_APP_ID, SOURCE_TOPICS
from tests.integration.streams.harness import (
    RANKSIGHT,
    AlertReader,
    Worker,
    group_lag,
    pairs,
    publish,
    recent,
)

SCENARIO = "nan_loss"


@pytest.fixture(scope="module")
def scenario_events() -> tuple[list[Event], list[dict[str, Any]]]:
    sim = simulate(recent(load_scenario(SCENARIO)), seed=0)
    return list(sim.events()), sim.labels


@pytest.fixture(scope="module")
def offline_alerts(
    scenario_events: tuple[list[Event], list[dict[str, Any]]], tmp_path_factory: pytest.TempPathFactory
) -> list[dict[str, Any]]:
    path = tmp_path_factory.mktemp("offline") / "events.avro"
    write_container(path, scenario_events[0])
    return [e.record for e in replay_offline([path]) if e.type == "Alert"]


def test_worker_publishes_the_labelled_alert_to_the_team(
    kafka_bootstrap: str,
    topics: dict[str, str],
    topic_prefix: str,
    any_worker: Worker,
    scenario_events: tuple[list[Event], list[dict[str, Any]]],
) -> None:
    worker = any_worker
    events, labels = scenario_events
    label = labels[0]
    publish(kafka_bootstrap, topic_prefix, events)
    started = time.monotonic()
    worker.start()
    reader = AlertReader(kafka_bootstrap, topics[ALERTS])
    try:

        def resolved(records: list[dict[str, Any]]) -> bool:
            return any(r["rule"] == label["alert"] and r["status"] == "resolved" for r in records)

        assert reader.poll_until(resolved, 150), worker.log()
    finally:
        reader.close()
    print(f"first run: labelled alert resolved after {time.monotonic() - started:.1f} s")
    firing = [r for r in reader.records if r["rule"] == label["alert"] and r["status"] == "firing"]
    assert firing, reader.records
    alert = firing[0]
    assert alert["job_id"] == label["job_id"]
    assert alert["team"] == label["team"]
    assert alert["starts_at"] - parse_ts(label["start"]) <= 120_000
    # Healthy phases fire nothing else: only the labelled rule and the ones it may co-fire.
    allowed = {label["alert"], *label["also"]}
    assert {r["rule"] for r in reader.records} <= allowed, reader.records


def _restored(worker: Worker, limit_s: float = 150) -> bool:
    """Whether the restarted worker says it restored a snapshot (it may still be joining the group
    when the alerts are all out: the two stages' alerts can all be sent before the kill)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if "restored engine snapshot" in (worker.home / "worker-2.log").read_text():
            return True
        time.sleep(0.5)  # poll interval of the log check
    return False


def test_worker_killed_mid_run_loses_and_duplicates_no_alert(
    kafka_bootstrap: str,
    topics: dict[str, str],
    topic_prefix: str,
    any_worker: Worker,
    scenario_events: tuple[list[Event], list[dict[str, Any]]],
    offline_alerts: list[dict[str, Any]],
    group_id: str,
    tmp_path: Path,
) -> None:
    worker = any_worker
    expected = pairs(offline_alerts)
    assert expected, "the offline replay of the scenario raised no alert"
    publish(kafka_bootstrap, topic_prefix, scenario_events[0])
    # Checkpoints every 5,000 records of a partition (the default, 50,000, is more than this
    # scenario's 46,784): the kill lands after several, not only racing the first alert's.
    every = ("--checkpoint-events", "5000")
    worker.start(*every)
    reader = AlertReader(kafka_bootstrap, topics[ALERTS])
    try:
        # Kill as soon as the first alert is out: the rest of the run is still to come.
        assert reader.poll_until(lambda rs: len(rs) >= 1, 150), worker.log()
        worker.kill()
        before = len(reader.records)
        restarted = time.monotonic()
        worker.start(*every)
        assert reader.poll_until(lambda rs: pairs(rs) >= expected, 150), (
            expected - pairs(reader.records),
            worker.log(),
        )
        # Anything else still in flight arrives within a few seconds.
        reader.poll_until(lambda rs: False, 5)
    finally:
        reader.close()
    print(
        f"killed after {before} alerts; recovered in {time.monotonic() - restarted:.1f} s; "
        f"{len(reader.records)} records, {len({(r['alert_id'], r['status']) for r in reader.records})} distinct"
    )
    assert pairs(reader.records) == expected
    # At-least-once with deterministic ids: re-deliveries share (alert_id, status), so consumers collapse them.
    distinct = {(r["alert_id"], r["status"]) for r in reader.records}
    assert len(distinct) == len(expected)
    assert _restored(worker), worker.log()
    # Through the ClickHouse sink (chDB): the alerts table collapses re-deliveries to one row each.
    client = connect(f"chdb://{tmp_path / 'chdb'}")
    try:
        migrate(client, ttl_days=None)  # simulated time is months old: no TTL
        SinkConsumer({"bootstrap.servers": kafka_bootstrap}, client, [topics[ALERTS]], group_id).run(
            idle_exit_s=5
        )
        rows = client.query("SELECT fingerprint, status FROM alerts FINAL").result_rows
    finally:
        close_all()
    assert {(fp, st) for fp, st in rows} == expected
    assert len(rows) == len(expected)


def test_a_group_moves_from_faust_to_direct_keeping_its_state(
    kafka_bootstrap: str,
    topics: dict[str, str],
    topic_prefix: str,
    tmp_path: Path,
    scenario_events: tuple[list[Event], list[dict[str, Any]]],
    offline_alerts: list[dict[str, Any]],
) -> None:
    """Both runtimes keep the same state in the same changelog topics: a group stopped on one resumes
    on the other from its checkpoints (a crashed member must first leave: the two runtimes' group
    protocols cannot share a group, so its session must time out)."""
    expected = pairs(offline_alerts)
    worker = Worker(kafka_bootstrap, topic_prefix, tmp_path, "faust")
    publish(kafka_bootstrap, topic_prefix, scenario_events[0])
    worker.start()
    reader = AlertReader(kafka_bootstrap, topics[ALERTS])
    try:
        assert reader.poll_until(lambda rs: len(rs) >= 1, 150), worker.log()
        worker.stop()  # SIGTERM: Faust commits what it acked and leaves the group
        worker.start(runtime="direct")
        assert reader.poll_until(lambda rs: pairs(rs) >= expected, 150), (
            expected - pairs(reader.records),
            worker.log(),
        )
        reader.poll_until(lambda rs: False, 5)
    finally:
        worker.stop()
        reader.close()
    assert pairs(reader.records) == expected
    assert len({(r["alert_id"], r["status"]) for r in reader.records}) == len(expected)
    assert _restored(worker), worker.log()


def test_a_worker_of_the_other_runtime_is_refused_while_the_group_runs(
    kafka_bootstrap: str, topics: dict[str, str], topic_prefix: str, tmp_path: Path
) -> None:
    """Kafka cannot mix the runtimes' assignors in one group (a Faust worker would wait in its join
    forever): the second worker says so in one sentence and exits."""
    running = Worker(kafka_bootstrap, topic_prefix, tmp_path / "direct", "direct")
    (tmp_path / "direct").mkdir()
    running.start()
    try:
        deadline = time.monotonic() + 60
        log = running.home / "worker-1.log"
        while time.monotonic() < deadline and "assigned partitions" not in log.read_text(errors="replace"):
            time.sleep(0.2)  # until the group has its first member
        assert "assigned partitions" in log.read_text(errors="replace"), running.log()
        env = {**running.env, "RANKSIGHT_HOME": str(tmp_path / "faust")}
        second = subprocess.run(
            [RANKSIGHT, "worker", "--runtime", "faust"], env=env, capture_output=True, text=True, timeout=120
        )
    finally:
        running.stop()
    assert second.returncode != 0, second.stdout + second.stderr
    message = " ".join(second.stderr.split())
    assert "running the direct runtime" in message and "--runtime direct" in message, message
    assert "Traceback" not in second.stderr


def test_a_backlog_far_past_the_held_limits_drains(
    kafka_bootstrap: str,
    topics: dict[str, str],
    topic_prefix: str,
    any_worker: Worker,
    scenario_events: tuple[list[Event], list[dict[str, Any]]],
    offline_alerts: list[dict[str, Any]],
) -> None:
    """Issue 18.6 on each runtime: one job's backlog (one partition, ~47k records) with the held
    limits far below it. The default runtime pauses the partitions that run ahead (--align-pause-at
    300): nothing is late, the alerts are the offline replay's. The Faust adapter never pauses; past
    --max-held 5000 its oldest held records leave (some late for the engine, so its alerts may
    differ): it drains all the same."""
    worker = any_worker
    expected = pairs(offline_alerts)
    publish(kafka_bootstrap, topic_prefix, scenario_events[0])
    limits = ["--align-pause-at", "300"] if worker.runtime == "direct" else ["--max-held", "5000"]
    worker.start(*limits)
    reader = AlertReader(kafka_bootstrap, topics[ALERTS])
    group = topic_prefix + DEFAULT_APP_ID
    try:
        if worker.runtime == "direct":
            assert reader.poll_until(lambda rs: pairs(rs) >= expected, 300), worker.log()
        # Drained: the group committed every source record (progress, not time).
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and group_lag(
            kafka_bootstrap, group, [topics[t] for t in SOURCE_TOPICS]
        ):
            time.sleep(0.5)  # poll interval of the progress check
        assert group_lag(kafka_bootstrap, group, [topics[t] for t in SOURCE_TOPICS]) == 0, worker.log()
        reader.poll_until(lambda rs: False, 3)
    finally:
        reader.close()
        worker.stop()
    if worker.runtime == "direct":
        assert pairs(reader.records) == expected
    assert "Traceback" not in worker.log(), worker.log()
