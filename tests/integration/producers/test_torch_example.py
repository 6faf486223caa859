"""The PyTorch example (4 CPU ranks over gloo) reports every step to Kafka, the sink stores them in
ClickHouse, and an injected straggler shows up as communication wait on the other ranks.
Opt-in: RANKSIGHT_TORCH_TESTS=1 and torch installed."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from schemas.codec import Codec
from schemas.topics import DEADLETTER, TRAINING_EVENTS, TRAINING_STEPS
from sinks.clickhouse import close, connect
from sinks.consumer import SinkConsumer
from sinks.ddl import migrate

pytestmark = [
    pytest.mark.torch,
    # Decided before any fixture runs, so an opted-out run does not start a broker for nothing.
    pytest.mark.skipif(
        os.environ.get("RANKSIGHT_TORCH_TESTS") != "1",
        reason="set RANKSIGHT_TORCH_TESTS=1 to run the PyTorch example (needs torch: pip install -e .[torch])",
    ),
]

_EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "train_ddp.py"
RANKS, STEPS, STRAGGLER = 4, 30, 2


_KINDS = {"StepCompleted", "JobStarted", "RankBound", "CheckpointEvent", "JobStateChanged"}


def _consume(bootstrap: str, topics: list[str], group_id: str, timeout: float) -> list:
    """Everything on ``topics`` up to their ends as they are now (the example has exited, so all it
    sent is there): waits on offsets, not on what kinds happened to come first."""
    codec = Codec()
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": group_id, "auto.offset.reset": "earliest"}
    )
    try:
        parts = [
            TopicPartition(topic, p)
            for topic in topics
            for p in consumer.list_topics(topic, timeout=10).topics[topic].partitions
        ]
        ends = {(tp.topic, tp.partition): consumer.get_watermark_offsets(tp, timeout=10)[1] for tp in parts}
        for tp in parts:
            tp.offset = OFFSET_BEGINNING
        consumer.assign(parts)
        seen = {key: 0 for key in ends}
        events = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(seen[key] < end for key, end in ends.items()):
            msg = consumer.poll(0.5)
            if msg is None or msg.error() is not None:
                continue
            seen[(msg.topic(), msg.partition())] = msg.offset() + 1
            events.append(codec.decode(msg.value()))
    finally:
        consumer.close()
    return events


def test_example_reports_every_rank_step_and_the_straggler_makes_others_wait(
    kafka_bootstrap: str, topics: dict[str, str], topic_prefix: str, group_id: str, tmp_path: Path
) -> None:
    pytest.importorskip("torch")
    job_id = f"torch-{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP": kafka_bootstrap,
        "RANKSIGHT_TOPIC_PREFIX": topic_prefix,
        "RANKSIGHT_JOB_ID": job_id,
        "PYTHONPATH": str(_EXAMPLE.parents[1]),
    }
    run = subprocess.run(
        [
            sys.executable,
            str(_EXAMPLE),
            "--spawn",
            str(RANKS),
            "--steps",
            str(STEPS),
            "--to",
            "kafka",
            "--straggler-rank",
            str(STRAGGLER),
            "--straggler-delay",
            "0.05",
            "--checkpoint-every",
            "10",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]

    events = _consume(kafka_bootstrap, [topics[TRAINING_STEPS], topics[TRAINING_EVENTS]], group_id, 120)
    steps = [e.record for e in events if e.type == "StepCompleted" and e.record["job_id"] == job_id]
    assert sorted((r["rank"], r["step"]) for r in steps) == [
        (r, s) for r in range(RANKS) for s in range(STEPS)
    ]
    comm = defaultdict(list)
    for r in steps:
        if r["step"] >= 3:  # skip warm-up steps
            comm[r["rank"]].append(r["comm_s"])
    median = {rank: statistics.median(values) for rank, values in comm.items()}
    print(f"\nmedian comm_s per rank: { {k: round(v, 4) for k, v in sorted(median.items())} }")
    for rank in range(RANKS):
        if rank != STRAGGLER:
            assert median[rank] > median[STRAGGLER], median
    kinds = {e.type for e in events if e.record.get("job_id") == job_id}
    assert kinds >= _KINDS
    bound = [e.record for e in events if e.type == "RankBound" and e.record["job_id"] == job_id]
    assert sorted(r["rank"] for r in bound) == list(range(RANKS))

    # ... and through the real sink into ClickHouse (chDB): every step of every rank, once.
    dsn = f"chdb://{tmp_path / 'chdb'}"
    client = connect(dsn)
    try:
        migrate(client, ttl_days=None)
        sink = SinkConsumer(
            {"bootstrap.servers": kafka_bootstrap},
            client,
            [topics[TRAINING_STEPS], topics[TRAINING_EVENTS]],
            group_id + "-sink",
            deadletter_topic=topics[DEADLETTER],
        )
        try:
            sink.run(idle_exit_s=5)
        finally:
            sink.close()
        stored = client.query(
            f"SELECT rank, count(), uniqExact(step) FROM steps WHERE job_id = '{job_id}' GROUP BY rank ORDER BY rank"
        ).result_rows
        assert [tuple(row) for row in stored] == [(rank, STEPS, STEPS) for rank in range(RANKS)]
        assert int(client.command(f"SELECT count() FROM rank_bound WHERE job_id = '{job_id}'")) == RANKS
    finally:
        close(dsn)


@pytest.mark.parametrize(
    ("fault", "argv", "rule", "rank"),
    [
        (
            "straggler",
            ["--steps", "500", "--straggler-rank", "2", "--straggler-delay", "0.05"],
            "straggler",
            2,
        ),
        ("nan", ["--steps", "40", "--nan-at-step", "20"], "nonfinite_loss", None),
        # 75 s: longer than the 60 s stall floor; the SDK's heartbeat keeps event time moving.
        (
            "hang",
            ["--steps", "30", "--hang-rank", "1", "--hang-at-step", "15", "--hang-seconds", "75"],
            "rank_hang",
            1,
        ),
    ],
)
def test_each_example_fault_raises_its_alert_in_offline_replay(
    tmp_path: Path, fault: str, argv: list[str], rule: str, rank: int | None
) -> None:
    """What the example emits, replayed offline through the detectors: each injected fault fires its rule."""
    pytest.importorskip("torch")
    from streams.config import load_config
    from streams.offline.detection import DetectionEngine
    from streams.offline.replay import merged_events

    out = tmp_path / "events.avro"
    env = {**os.environ, "PYTHONPATH": str(_EXAMPLE.parents[1]), "RANKSIGHT_JOB_ID": f"example-{fault}"}
    run = subprocess.run(
        [
            sys.executable,
            str(_EXAMPLE),
            "--spawn",
            str(RANKS),
            "--to",
            f"file://{out}",
            "--checkpoint-every",
            "0",
            *argv,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    files = sorted(tmp_path.glob("events.rank*.avro"))
    assert len(files) == RANKS
    # A run of ~30 s: 1 s summary buckets and 2 of warm-up so the straggler's 3 low buckets fit in it
    # (with the default 5 s buckets the 6-bucket warm-up alone takes 30 s); short windows to match.
    config = load_config(
        overrides={
            "engine": {"summary_bucket_s": 1},
            "detectors": {"imbalance": {"window_s": 10.0, "hop_s": 5.0, "cusum_skip_buckets": 2}},
        }
    )
    alerts = [
        e.record
        for e in DetectionEngine(config).run(merged_events(files))
        if e.type == "Alert" and e.record["status"] == "firing"
    ]
    fired = {(a["rule"], a.get("rank")) for a in alerts}
    assert any(r == rule and (rank is None or k == rank) for r, k in fired), fired
