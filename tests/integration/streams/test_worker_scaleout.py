"""Two `ranksight worker` processes in one group split the jobs; one is killed; no alert is lost or re-fired."""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka.partitioner import DefaultPartitioner
from confluent_kafka import Consumer, TopicPartition

from infra.errors import KafkaSetupError
from infra.kafka.topics import delete_topics
from producers.simulator import load_scenario, simulate
from schemas.files import write_container
from schemas.records import Event
from schemas.topics import ALERTS, partition_for
from streams.offline.replay import replay_offline
from streams.runtime.options import DEFAULT_RUNTIME, SOURCE_TOPICS
from tests.integration.streams.harness import AlertReader, Worker, group_lag, publish, recent

SCENARIO = "mixed"  # three jobs of three teams on four nodes, six labelled faults
_ASSIGNED = re.compile(r"assigned partitions \[([\d, ]*)\]")


@pytest.fixture(scope="module")
def mixed_events() -> list[Event]:
    return list(simulate(recent(load_scenario(SCENARIO)), seed=0).events())


@pytest.fixture(scope="module")
def mixed_offline(
    mixed_events: list[Event], tmp_path_factory: pytest.TempPathFactory
) -> list[dict[str, Any]]:
    path = tmp_path_factory.mktemp("offline-mixed") / "events.avro"
    write_container(path, mixed_events)
    return [e.record for e in replay_offline([path]) if e.type == "Alert"]


class TwoWorkers:
    """Two workers of the same group (same prefix, same group id), each with its own state dir."""

    def __init__(self, bootstrap: str, prefix: str, home: Path, runtime: str) -> None:
        (home / "a").mkdir()
        (home / "b").mkdir()
        self.workers = [Worker(bootstrap, prefix, home / d, runtime) for d in ("a", "b")]

    def partitions(self, w: Worker) -> set[int] | None:
        """The partitions `w` says it holds now (its last assignment line), None before the first."""
        found = _ASSIGNED.findall(_full_log(w))
        if not found:
            return None
        return {int(p) for p in found[-1].split(",") if p.strip()}

    def stop(self) -> None:
        for w in self.workers:
            w.stop()


@pytest.fixture
def two_workers(
    kafka_bootstrap: str, topic_prefix: str, topics: dict[str, str], tmp_path: Path
) -> Iterator[TwoWorkers]:
    pair = TwoWorkers(kafka_bootstrap, topic_prefix, tmp_path, DEFAULT_RUNTIME)
    try:
        yield pair
    finally:
        pair.stop()
        # The worker's own topics of this test (the `topics` fixture removes the canonical ones).
        group = f"{topic_prefix}ranksight-detect"
        with contextlib.suppress(KafkaSetupError):
            delete_topics(
                kafka_bootstrap,
                [
                    f"{topic_prefix}rs.internal.bindings",
                    f"{topic_prefix}rs.internal.telemetry-by-job",
                    f"{group}-engine-snapshot-changelog",
                    f"{group}-node-routes-changelog",
                    f"{group}-__assignor-__leader",
                ],
            )


def _full_log(w: Worker) -> str:
    return "".join((w.home / f"worker-{i}.log").read_text(errors="replace") for i in range(1, w.runs + 1))


def _wait(cond: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def test_publisher_and_aiokafka_put_a_key_on_the_same_partition(
    kafka_bootstrap: str, topics: dict[str, str], topic_prefix: str
) -> None:
    # Through the real publisher (librdkafka) and read back: the partition the broker stored it on.
    keys = [f"job-{i}" for i in range(40)] + [f"node-{i:02d}" for i in range(1, 40)]
    events = [
        Event("JobStateChanged", {"ts": 1, "job_id": k, "state": "running", "restart_count": 0}) for k in keys
    ]
    publish(kafka_bootstrap, topic_prefix, events)
    topic = topics["rs.training.events"]
    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": "p", "log_level": 0})
    try:
        meta = consumer.list_topics(topic, timeout=10).topics[topic]
        n = len(meta.partitions)
        consumer.assign([TopicPartition(topic, p, 0) for p in meta.partitions])
        landed: dict[str, int] = {}
        deadline = time.monotonic() + 30
        while len(landed) < len(keys) and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                landed[(msg.key() or b"").decode()] = msg.partition() or 0
    finally:
        consumer.close()
    assert len(landed) == len(keys)
    # aiokafka's partitioner (what Faust's sends use) and ours agree with where librdkafka put them.
    aio = DefaultPartitioner()
    parts = list(range(n))
    assert {k: aio(k.encode(), parts, parts) for k in keys} == landed
    assert {k: partition_for(k.encode(), n) for k in keys} == landed
    assert len(set(landed.values())) == n  # the keys really spread over every partition


def test_two_workers_split_the_jobs_and_survive_losing_one(
    kafka_bootstrap: str,
    topics: dict[str, str],
    topic_prefix: str,
    two_workers: TwoWorkers,
    mixed_events: list[Event],
    mixed_offline: list[dict[str, Any]],
) -> None:
    expected = {(r["fingerprint"], r["status"]) for r in mixed_offline}
    expected_ids = {(r["alert_id"], r["status"]) for r in mixed_offline}
    assert len(expected) >= 10, expected
    a, b = two_workers.workers
    # The end of the finite input is flushed in rounds, each after `--finish-idle` of quiet (rank
    # stage, then job stage). It must stay above the group's 10 s session timeout, as the default
    # (20 s) does: with 2 s the survivor took its own quiet input for the end of the stream before
    # the dead worker's partitions were reassigned, and the victim's job lost its last alerts
    # (failed under load in `make test`, passed alone).
    a.start("--finish-idle", "12")
    b.start("--finish-idle", "12")
    started = time.monotonic()

    def split() -> bool:
        pa, pb = two_workers.partitions(a), two_workers.partitions(b)
        return bool(pa) and bool(pb) and not (pa & pb) and len(pa | pb) == 6  # type: ignore[operator]

    def complete(rs: list[dict[str, Any]]) -> bool:
        return {(r["fingerprint"], r["status"]) for r in rs} >= expected

    # Known gap of the two stages (see below): a throughput_drop on the edge of its threshold can
    # also go missing after the failover (once in a full `make test` here: the mixed scenario's
    # vit-h-0302, which the offline replay raises or not depending on where its buckets fall).
    # Every other alert of the offline replay must fire and resolve: nothing lost.
    must = {e for e in expected if not e[0].startswith("throughput_drop/")}

    _wait(split, 90, "both workers to hold partitions:\n" + a.log() + b.log())
    joined_s = time.monotonic() - started
    publish(kafka_bootstrap, topic_prefix, mixed_events)
    published = time.monotonic()
    reader = AlertReader(kafka_bootstrap, topics[ALERTS])
    try:
        assert reader.poll_until(lambda rs: len(rs) >= 1, 120), a.log() + b.log()
        first = reader.records[0]
        # Kill the worker running the job of the first alert: the rest of that job is still to come.
        part = partition_for(first["job_id"].encode(), 6)
        victim, survivor = (a, b) if part in (two_workers.partitions(a) or set()) else (b, a)
        victim.kill()
        killed = time.monotonic()
        _wait(
            lambda: two_workers.partitions(survivor) == set(range(6)),
            60,
            "the survivor to take every partition:\n" + survivor.log(),
        )
        rebalanced_s = time.monotonic() - killed
        # Wait on progress, not on machine speed: until every alert is in, or until the group has
        # committed every source record (outputs are delivered before their offsets are committed,
        # so then a missing alert was lost, not late).
        group = f"{topic_prefix}ranksight-detect"
        sources = [topics[t] for t in SOURCE_TOPICS]
        deadline = time.monotonic() + 900  # only against a hang
        finished = False
        while not complete(reader.records) and time.monotonic() < deadline:
            finished = group_lag(kafka_bootstrap, group, sources) == 0
            # The sources' offsets reach their end at the first finishing round; the job stage's
            # last alerts come a round or two (12 s of quiet each) later.
            reader.poll_until(complete, 90 if finished else 5)
            if finished:
                break
        assert must <= {(r["fingerprint"], r["status"]) for r in reader.records}, (
            "lost" if finished else "late (no progress to zero lag)",
            expected - {(r["fingerprint"], r["status"]) for r in reader.records},
            survivor.log(),
        )
        reader.poll_until(lambda rs: False, 5)  # anything else in flight
    finally:
        reader.close()
    got = {(r["fingerprint"], r["status"]) for r in reader.records}
    got_ids = {(r["alert_id"], r["status"]) for r in reader.records}
    print(
        f"joined in {joined_s:.1f} s; all alerts {time.monotonic() - published:.1f} s after publishing; "
        f"survivor took over in {rebalanced_s:.1f} s; {len(reader.records)} records, {len(got_ids)} distinct"
    )
    # Only throughput_drop alerts can be missing here (asserted above); which ones is printed.
    print(f"offline alerts not raised live: {sorted(expected - got)}")
    # Known gap of the two stages (issue 19, docs/worker.md "Known limits"): a worker killed mid-run
    # can move a job-level alert's start (a new alert_id for the same fingerprint) or add or drop a
    # throughput_drop, when the restored rank stage's summaries differ from what the dead one sent
    # (its telemetry re-keyed by the side path arrives in another order). The ids that did not
    # change are the offline ones; what changed is printed.
    moved = {f for f, _ in got} - {f for f, _ in expected}
    print(
        f"alerts not in the offline replay: {sorted(moved)}; ids not in it: {sorted(got_ids - expected_ids)}"
    )
    assert all(f.startswith("throughput_drop/") for f in moved), moved
    assert "restored engine snapshot" in _full_log(survivor)
    # Each partition's snapshot lives on the same changelog partition (it moves with the partition).
    changelog = f"{topic_prefix}ranksight-detect-engine-snapshot-changelog"
    keys = _keys_by_partition(kafka_bootstrap, changelog)
    assert keys, "no snapshot in the changelog"
    for partition, names in keys.items():
        # The rank stage's engine and the job stage's (of rs.internal.summaries' partition).
        assert names == {f"engine@{partition}", f"jobs@{partition}"}, keys


def _keys_by_partition(bootstrap: str, topic: str) -> dict[int, set[str]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "changelog-reader", "log_level": 0})
    out: dict[int, set[str]] = {}
    try:
        meta = consumer.list_topics(topic, timeout=10).topics[topic]
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in meta.partitions
        }
        consumer.assign([TopicPartition(topic, p, 0) for p in meta.partitions])
        left = sum(ends.values())
        deadline = time.monotonic() + 30
        while left > 0 and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                # Faust stores str table keys JSON-encoded.
                out.setdefault(msg.partition() or 0, set()).add(json.loads(msg.key() or b'""'))
                left -= 1
    finally:
        consumer.close()
    return out
