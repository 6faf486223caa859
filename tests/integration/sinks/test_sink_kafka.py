"""The sink end to end on the real broker and a real chDB: exact counts, dead letters, crash and restart."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import pytest
from clickhouse_connect.driver.client import Client
from confluent_kafka import Consumer, KafkaException, Message, Producer, TopicPartition

from schemas.codec import Codec
from schemas.eventtime import TimeBound
from schemas.records import RECORD_TYPES, Event
from schemas.topics import (
    DEADLETTER,
    TELEMETRY_GPU,
    TELEMETRY_HOST,
    TRAINING_EVENTS,
    TRAINING_STEPS,
    key_for,
    topic_for,
)
from sinks.clickhouse import close, connect
from sinks.consumer import SINK_TOPICS, SinkConsumer
from sinks.ddl import TABLE_NAMES, migrate
from sinks.errors import KafkaUnavailableError, SinkWriteError
from sinks.samples import sample_event, sample_events
from sinks.writer import ClickHouseSink
from streams.config import load_config

N = 300  # events per record type
RANKSIGHT = str(Path(sys.executable).with_name("ranksight"))


def _events(n: int, now_ms: int) -> list[Event]:
    return [event for record_type in RECORD_TYPES for event in sample_events(record_type, n, now_ms)]


def _produce(bootstrap: str, topics: dict[str, str], events: Iterable[Event]) -> int:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 10})
    codec = Codec()
    count = 0
    for event in events:
        canonical = topic_for(event.type)
        producer.produce(topics[canonical], key=key_for(canonical, event.record), value=codec.encode(event))
        producer.poll(0)
        count += 1
    assert producer.flush(30) == 0
    return count


def _headers(msg: Message) -> dict[str, bytes]:
    return {str(h[0]): h[1] if isinstance(h[1], bytes) else str(h[1]).encode() for h in msg.headers() or []}


def _counts(client: Client) -> dict[str, int]:
    return {t: int(client.query(f"SELECT count() FROM {t}").result_rows[0][0]) for t in TABLE_NAMES.values()}


def _sink(bootstrap: str, client: Client, topics: dict[str, str], group: str, **kw: object) -> SinkConsumer:
    return SinkConsumer(
        {"bootstrap.servers": bootstrap},
        client,
        [topics[t] for t in SINK_TOPICS],
        group,
        deadletter_topic=topics[DEADLETTER],
        **kw,  # type: ignore[arg-type]
    )


def _committed_and_end(bootstrap: str, group: str, names: Iterable[str]) -> tuple[int, int]:
    """Sum of the group's committed offsets and of the end offsets over every partition of `names`."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        partitions = [
            TopicPartition(name, p)
            for name in names
            for p in consumer.list_topics(name, timeout=10).topics[name].partitions
        ]
        for attempt in range(20):
            try:
                committed = sum(max(tp.offset, 0) for tp in consumer.committed(partitions, timeout=10))
                break
            except KafkaException:  # the group coordinator may still be moving on a young broker
                if attempt == 19:
                    raise
                time.sleep(0.5)
        end = sum(consumer.get_watermark_offsets(tp, timeout=10)[1] for tp in partitions)
        return committed, end
    finally:
        consumer.close()


def test_every_record_type_is_stored_exactly_once_and_offsets_are_committed(
    kafka_bootstrap: str, topics: dict[str, str], group_id: str, chdb: Client
) -> None:
    produced = _produce(kafka_bootstrap, topics, _events(N, int(time.time() * 1000)))
    sink = _sink(kafka_bootstrap, chdb, topics, group_id, batch_size=400, batch_interval_s=0.3)
    stats = sink.run(idle_exit_s=2.0)
    assert _counts(chdb) == dict.fromkeys(TABLE_NAMES.values(), N)
    assert stats["consumed"] == produced == stats["inserted_rows"]
    assert stats["deadlettered"] == 0
    committed, end = _committed_and_end(kafka_bootstrap, group_id, [topics[t] for t in SINK_TOPICS])
    assert committed == end == produced


def test_a_restart_after_insert_without_commit_stores_nothing_twice(
    kafka_bootstrap: str, topics: dict[str, str], group_id: str, chdb: Client
) -> None:
    """Rows inserted by a run that died before committing are skipped even when batches are cut differently."""
    produced = _produce(kafka_bootstrap, topics, _events(40, int(time.time() * 1000)))
    # A first "run": reads about half of the messages, inserts them in batches of 7, never commits.
    reader = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": group_id, "auto.offset.reset": "earliest",
                       "enable.auto.commit": False})  # fmt: skip
    reader.subscribe([topics[t] for t in SINK_TOPICS])
    first_run = ClickHouseSink(chdb, batch_size=7)
    codec, seen = Codec(), 0
    deadline = time.monotonic() + 30
    while seen < produced // 2 and time.monotonic() < deadline:
        for msg in reader.consume(100, 0.5):
            topic, partition, offset = msg.topic() or "", msg.partition() or 0, msg.offset() or 0
            first_run.add(topic, partition, offset, codec.decode(msg.value() or b""))
            seen += 1
            if first_run.is_full(topic, partition):
                first_run.flush(topic, partition)
    reader.close()  # leaves the group without a commit, as a crash would
    inserted_before = sum(first_run.stats.rows_by_table.values())
    assert 0 < inserted_before < produced

    stats = _sink(kafka_bootstrap, chdb, topics, group_id, batch_size=1000, batch_interval_s=0.3).run(
        idle_exit_s=2.0
    )
    assert _counts(chdb) == dict.fromkeys(TABLE_NAMES.values(), 40)
    assert stats["skipped_stored"] == inserted_before
    assert stats["inserted_rows"] == produced - inserted_before


def test_undecodable_and_invalid_messages_go_to_the_dead_letter_topic_with_headers(
    kafka_bootstrap: str, topics: dict[str, str], group_id: str, chdb: Client
) -> None:
    codec = Codec()
    now = int(time.time() * 1000)
    steps = topics[TRAINING_STEPS]
    good = [codec.encode(e) for e in sample_events("StepCompleted", 6, now)]
    unknown_fp = b"\xc3\x01" + bytes(8) + good[0][10:]
    bad_ts = codec.encode(Event("StepCompleted", sample_event("StepCompleted", 9, now).record | {"ts": 5}))
    sequence = [
        good[0],
        b"garbage bytes",
        good[1],
        unknown_fp,
        good[2],
        bad_ts,
        good[3],
        None,
        good[4],
        good[5],
        codec.encode(sample_event("HostSample", 0, now)),  # valid, but not a record of this topic
        good[5] + b"junk",  # a valid body followed by bytes that are not part of it
    ]
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True})
    for i, value in enumerate(sequence):
        producer.produce(steps, key=f"k{i}".encode(), value=value, partition=0)
    assert producer.flush(30) == 0

    stats = _sink(kafka_bootstrap, chdb, topics, group_id, batch_interval_s=0.3).run(idle_exit_s=2.0)
    assert stats["deadlettered"] == 6
    assert chdb.query("SELECT count(), groupArray(step) FROM steps").result_rows[0][0] == 6
    assert chdb.query("SELECT count() FROM host_samples").result_rows[0][0] == 0

    reader = Consumer(
        {"bootstrap.servers": kafka_bootstrap, "group.id": group_id + "-dlq", "auto.offset.reset": "earliest"}
    )
    reader.subscribe([topics[DEADLETTER]])
    letters: list[Message] = []
    deadline = time.monotonic() + 30
    while len(letters) < 6 and time.monotonic() < deadline:
        letters += [m for m in reader.consume(10, 0.5) if m.error() is None]
    reader.close()
    assert len(letters) == 6
    by_offset = {int(_headers(m)["x-source-offset"]): m for m in letters}
    assert sorted(by_offset) == [1, 3, 5, 7, 10, 11]
    for offset, msg in by_offset.items():
        headers = _headers(msg)
        assert headers["x-component"] == b"sink"
        assert headers["x-source-topic"] == steps.encode()
        assert headers["x-source-partition"] == b"0"
        assert msg.key() == f"k{offset}".encode()
        assert msg.value() == sequence[offset]
    assert _headers(by_offset[1])["x-error-type"] == b"DecodeError"
    assert _headers(by_offset[3])["x-error-type"] == b"UnknownSchemaError"
    assert _headers(by_offset[5])["x-error-type"] == b"InvalidRecordError"
    assert b"outside" in _headers(by_offset[5])["x-error"]
    assert _headers(by_offset[10])["x-error-type"] == b"InvalidRecordError"
    assert b"does not belong on rs.training.steps" in _headers(by_offset[10])["x-error"]
    assert b"unexpected byte" in _headers(by_offset[11])["x-error"]
    committed, end = _committed_and_end(kafka_bootstrap, group_id, [steps])
    assert committed == end == len(sequence)


YEAR_2199_MS = 7_226_582_400_000  # 2199-01-01T00:00:00Z: inside 2000..2200, far beyond any clock skew
YEAR_1970_MS = 86_400_000  # 1970-01-02: a clock reset to the epoch


def _read_letters(bootstrap: str, topic: str, group: str, expected: int) -> list[Message]:
    """The dead letters, read until `expected` arrived or 30 s passed (progress, not a sleep)."""
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest"})
    reader.subscribe([topic])
    letters: list[Message] = []
    deadline = time.monotonic() + 30
    while len(letters) < expected and time.monotonic() < deadline:
        letters += [m for m in reader.consume(100, 0.5) if m.error() is None]
    # A little longer: a dead letter sent twice would arrive right behind the others.
    letters += [m for m in reader.consume(100, 1.0) if m.error() is None]
    reader.close()
    return letters


def test_records_stamped_2199_or_1970_on_each_raw_topic_are_dead_lettered_once_by_the_sink(
    kafka_bootstrap: str, topics: dict[str, str], group_id: str, chdb: Client
) -> None:
    """The worker's time bound (`engine.max_clock_skew_s` of the shipped config) applies in the sink too."""
    engine = load_config(None)  # the shipped streams/detectors.yaml, as `ranksight sink` reads it
    bound = TimeBound(engine.max_clock_skew_ms, engine.max_record_age_ms)
    now = int(time.time() * 1000)
    raw_types = {"GpuSample": TELEMETRY_GPU, "HostSample": TELEMETRY_HOST, "StepCompleted": TRAINING_STEPS,
                 "CheckpointEvent": TRAINING_EVENTS}  # fmt: skip
    good = [e for record_type in raw_types for e in sample_events(record_type, 20, now)]
    bad = [
        Event(record_type, sample_event(record_type, 100 + i, now).record | {"ts": ts})
        for record_type in raw_types
        for i, ts in enumerate((YEAR_2199_MS, YEAR_1970_MS))
    ]
    # Bad records between good ones, on the partitions the good ones use.
    produced = _produce(kafka_bootstrap, topics, good[::2] + bad + good[1::2])
    sink = _sink(kafka_bootstrap, chdb, topics, group_id, batch_interval_s=0.3, time_bound=bound)
    stats = sink.run(idle_exit_s=2.0)

    assert stats["deadlettered"] == len(bad) == 8
    assert stats["time_rejected"] == {"clock_ahead": 4, "out_of_range": 4}
    assert stats["inserted_rows"] == len(good) == produced - len(bad)
    counts = _counts(chdb)
    for record_type in raw_types:
        table = TABLE_NAMES[record_type]
        assert counts[table] == 20, table
        # Nothing from 2199 or 1970 reached a table (no year-2199 partition, no job page spanning it).
        first, last = chdb.query(
            f"SELECT min(toUnixTimestamp64Milli(ts)), max(toUnixTimestamp64Milli(ts)) FROM {table}"
        ).result_rows[0]
        assert now - 1000 <= first and last <= now + 120_000, table
    letters = _read_letters(kafka_bootstrap, topics[DEADLETTER], group_id + "-dlq", len(bad))
    where = Counter((_headers(m)["x-source-topic"], int(_headers(m)["x-source-offset"])) for m in letters)
    assert len(letters) == len(bad) and set(where.values()) == {1}  # each exactly once
    codec = Codec()
    reasons: Counter[tuple[str, bytes]] = Counter()
    for msg in letters:
        headers = _headers(msg)
        assert headers["x-component"] == b"sink"
        assert headers["x-error-type"] == b"ImplausibleTimeError"
        event = codec.decode(msg.value())
        assert headers["x-source-topic"].decode() == topics[raw_types[event.type]]
        assert (event.record["ts"], headers["x-reject-reason"]) in (
            (YEAR_2199_MS, b"clock_ahead"),
            (YEAR_1970_MS, b"out_of_range"),
        )
        assert b"engine.max_clock_skew_s" in headers["x-error"]
        reasons[(event.type, headers["x-reject-reason"])] += 1
    assert reasons == {(t, r): 1 for t in raw_types for r in (b"clock_ahead", b"out_of_range")}
    committed, end = _committed_and_end(
        kafka_bootstrap, group_id, [topics[t] for t in set(raw_types.values())]
    )
    assert committed == end == produced


def test_a_record_ahead_of_its_own_kafka_time_is_judged_by_that_time_not_by_its_arrival(
    kafka_bootstrap: str, topics: dict[str, str], group_id: str, chdb: Client
) -> None:
    """A backlog read late: the reference is the record's Kafka timestamp, not the sink's clock."""
    now = int(time.time() * 1000)
    produced_at = now - 3_600_000  # produced an hour ago (CreateTime set by the producer)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True})
    codec = Codec()
    steps = topics[TRAINING_STEPS]
    ahead = sample_event("StepCompleted", 1, now).record | {"ts": produced_at + 600_000}  # 10 min ahead
    within = sample_event("StepCompleted", 2, now).record | {"ts": produced_at + 60_000}  # 1 min ahead
    for record in (ahead, within):
        producer.produce(steps, key=b"j", value=codec.encode(Event("StepCompleted", record)), partition=0,
                         timestamp=produced_at)  # fmt: skip
    assert producer.flush(30) == 0
    stats = _sink(
        kafka_bootstrap, chdb, topics, group_id, batch_interval_s=0.3, time_bound=TimeBound(300_000)
    ).run(idle_exit_s=2.0)
    assert stats["time_rejected"] == {"clock_ahead": 1} and stats["inserted_rows"] == 1
    assert chdb.query("SELECT step FROM steps").result_rows == [(within["step"],)]


def _sink_process(home: Path, bootstrap: str, prefix: str, *extra: str) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP": bootstrap,
        "RANKSIGHT_HOME": str(home),
        "RANKSIGHT_TOPIC_PREFIX": prefix,
    }
    env.pop("CLICKHOUSE_URL", None)
    command = [RANKSIGHT, "sink", "--group", "crash", "--batch-size", "40", "--batch-interval", "0.2",
               "--session-timeout", "6", "--progress-interval", "1", *extra]  # fmt: skip
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_sink_killed_mid_stream_and_restarted_stores_every_event_exactly_once(
    kafka_bootstrap: str, topics: dict[str, str], topic_prefix: str, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    now = int(time.time() * 1000)
    events = _events(N, now)
    half = len(events) // 2
    names = [topics[t] for t in SINK_TOPICS]
    _produce(kafka_bootstrap, topics, events[:half])

    first = _sink_process(home, kafka_bootstrap, topic_prefix)
    try:
        deadline = time.monotonic() + 60
        committed = 0
        while committed == 0 and time.monotonic() < deadline and first.poll() is None:
            time.sleep(0.2)
            committed, _ = _committed_and_end(kafka_bootstrap, topic_prefix + "crash", names)
        assert committed > 0, "the first sink never committed"
        # Keep it busy with the second half and kill it while it inserts.
        _produce(kafka_bootstrap, topics, events[half : half + half // 2])
        first.send_signal(signal.SIGKILL)
        first.wait(30)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    committed_at_kill, end = _committed_and_end(kafka_bootstrap, topic_prefix + "crash", names)
    assert committed_at_kill < end, "the sink had finished before it was killed"
    _produce(kafka_bootstrap, topics, events[half + half // 2 :])

    second = _sink_process(home, kafka_bootstrap, topic_prefix, "--idle-exit", "3")
    out, _ = second.communicate(timeout=180)
    assert second.returncode == 0, out
    print(out)
    dsn = f"chdb://{home / 'chdb'}"
    try:
        assert _counts(connect(dsn)) == dict.fromkeys(TABLE_NAMES.values(), N)
    finally:
        close(dsn)
    committed, end = _committed_and_end(kafka_bootstrap, topic_prefix + "crash", names)
    assert committed == end == len(events)


def test_the_sink_command_reads_the_bound_from_the_workers_config(
    kafka_bootstrap: str, topics: dict[str, str], topic_prefix: str, tmp_path: Path
) -> None:
    """`ranksight sink --config` takes engine.max_clock_skew_s from the file the worker reads."""
    now = int(time.time() * 1000)
    ahead = Event("StepCompleted", sample_event("StepCompleted", 1, now).record | {"ts": now + 120_000})
    on_time = sample_event("StepCompleted", 2, now)
    _produce(kafka_bootstrap, topics, [ahead, on_time])
    config = tmp_path / "detectors.yaml"
    config.write_text("engine:\n  max_clock_skew_s: 60\n")
    sink = _sink_process(
        tmp_path / "home", kafka_bootstrap, topic_prefix, "--idle-exit", "3", "--config", str(config)
    )
    out, _ = sink.communicate(timeout=180)
    assert sink.returncode == 0, out
    # Two minutes ahead is within the shipped 300 s, not within this file's 60 s.
    assert "sink stopped: inserted 1 rows" in out and "dead-lettered 1" in out, out


def test_unreachable_kafka_is_one_clear_error(chdb: Client) -> None:
    sink = SinkConsumer({"bootstrap.servers": "127.0.0.1:1"}, chdb, ["rs.training.steps"], "g")
    try:
        with pytest.raises(KafkaUnavailableError, match=r"127\.0\.0\.1:1.*KAFKA_BOOTSTRAP"):
            sink.check_kafka(timeout_s=2)
    finally:
        sink.close()


def test_sink_command_with_unreachable_kafka_prints_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "KAFKA_BOOTSTRAP": "127.0.0.1:1", "RANKSIGHT_HOME": str(tmp_path / "home")}
    env.pop("CLICKHOUSE_URL", None)
    done = subprocess.run([RANKSIGHT, "sink"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "error: Kafka at 127.0.0.1:1 does not answer" in done.stderr and "KAFKA_BOOTSTRAP" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert "Traceback" not in done.stderr


def test_sink_command_stops_cleanly_on_sigterm_with_everything_committed(
    kafka_bootstrap: str, topics: dict[str, str], topic_prefix: str, tmp_path: Path
) -> None:
    produced = _produce(kafka_bootstrap, topics, sample_events("StepCompleted", 200, int(time.time() * 1000)))
    names = [topics[t] for t in SINK_TOPICS]
    # A batch interval longer than the test: whatever is stored was flushed by the shutdown itself.
    sink = _sink_process(
        tmp_path / "home", kafka_bootstrap, topic_prefix, "--batch-size", "100000", "--batch-interval", "3600"
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and sink.poll() is None:
            line = sink.stdout.readline() if sink.stdout else ""
            if "consumed 200" in line:
                break
        sink.send_signal(signal.SIGTERM)
        out, _ = sink.communicate(timeout=60)
    finally:
        if sink.poll() is None:
            sink.kill()
            sink.wait()
    assert sink.returncode == 0, out
    assert "sink stopped: inserted 200 rows" in out
    committed, end = _committed_and_end(kafka_bootstrap, topic_prefix + "crash", names)
    assert committed == end == produced


def test_failed_inserts_pause_and_retry_without_committing_then_recover(
    kafka_bootstrap: str, topics: dict[str, str], group_id: str, chdb: Client
) -> None:
    produced = _produce(kafka_bootstrap, topics, sample_events("StepCompleted", 50, int(time.time() * 1000)))
    names = [topics[TRAINING_STEPS]]
    chdb.command("RENAME TABLE steps TO steps_away")  # every insert into `steps` now fails
    sink = _sink(kafka_bootstrap, chdb, topics, group_id, batch_interval_s=0.2, max_write_attempts=3)
    with pytest.raises(SinkWriteError, match="steps"):
        sink.run(idle_exit_s=20.0)
    assert sink.stats()["retries"] >= 2  # each failing partition retried twice before giving up
    assert _committed_and_end(kafka_bootstrap, group_id, names) == (0, produced)

    chdb.command("RENAME TABLE steps_away TO steps")
    stats = _sink(kafka_bootstrap, chdb, topics, group_id, batch_interval_s=0.2).run(idle_exit_s=2.0)
    assert stats["inserted_rows"] == produced
    assert _counts(chdb)["steps"] == produced
    assert _committed_and_end(kafka_bootstrap, group_id, names) == (produced, produced)


def test_sink_in_a_thread_and_queries_from_the_main_thread_share_one_client(
    kafka_bootstrap: str, topics: dict[str, str], group_id: str, chdb_dsn: str
) -> None:
    """The demo's shape: `run(stop=...)` in a thread, row counts read meanwhile through the same client."""
    produced = _produce(kafka_bootstrap, topics, sample_events("HostSample", 100, int(time.time() * 1000)))
    client = connect(chdb_dsn)
    migrate(client)
    stop = threading.Event()
    sink = _sink(kafka_bootstrap, connect(chdb_dsn), topics, group_id, batch_interval_s=0.2)
    worker = threading.Thread(target=sink.run, kwargs={"stop": stop})
    worker.start()
    try:
        deadline = time.monotonic() + 60
        while _counts(client)["host_samples"] < produced and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        stop.set()
        worker.join(30)
    assert not worker.is_alive()
    assert _counts(client)["host_samples"] == produced


def test_job_started_records_over_the_per_record_caps_are_dead_lettered_once_with_the_cap(
    kafka_bootstrap: str, topics: dict[str, str], group_id: str, chdb: Client
) -> None:
    """The issue's 19 JobStarted records of ~0.94 MB of labels (each under Kafka's 1 MB): the sink,
    which owns rs.training.events' dead letters, refuses each at decode, stores the good ones and
    commits past all of them."""
    uncapped = Codec(limits=None)
    now = int(time.time() * 1000)
    good = sample_events("JobStarted", 3, now)
    fat = []
    for i in range(19):
        record = sample_event("JobStarted", i, now).record | {"job_id": f"fat-{i}"}
        record["labels"] = {f"l{n}": "x" * 15_000 for n in range(63)}
        fat.append(uncapped.encode(Event("JobStarted", record)))
    assert all(900_000 < len(v) < 1_000_000 for v in fat)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True})
    for value in [*fat, *(uncapped.encode(e) for e in good)]:
        producer.produce(topics[TRAINING_EVENTS], key=b"job", value=value, partition=0)
    assert producer.flush(30) == 0

    stats = _sink(kafka_bootstrap, chdb, topics, group_id, batch_interval_s=0.3).run(idle_exit_s=2.0)
    assert stats["deadlettered"] == 19
    assert chdb.query("SELECT count() FROM job_started").result_rows[0][0] == 3
    letters = _read_letters(kafka_bootstrap, topics[DEADLETTER], group_id + "-dlq", 19)
    assert len(letters) == 19
    for msg in letters:
        headers = _headers(msg)
        assert headers["x-error-type"] == b"RecordTooLarge" and b"labels hold" in headers["x-error"]
    committed, end = _committed_and_end(kafka_bootstrap, group_id, [topics[TRAINING_EVENTS]])
    assert committed == end == 22
