"""A wrapped loader stuck on the same batches, reported through the real broker, is repeated data; a
restore test from the SDK arrives decodable on the events topic."""

from __future__ import annotations

import numpy as np

from producers.training import Reporter
from schemas.topics import TRAINING_EVENTS, TRAINING_STEPS
from streams.detectors.base import Topology
from streams.detectors.repeated_data import RepeatedDataDetector
from tests.integration.producers.test_producers_kafka import _consume


def test_a_stuck_loader_through_kafka_is_repeated_data_and_a_restore_test_arrives(
    kafka_bootstrap: str, topics: dict[str, str], topic_prefix: str, group_id: str
) -> None:
    reporter = Reporter(
        "job-loader",
        0,
        world_size=1,
        env={},
        bind=False,
        kafka_conf={"bootstrap.servers": kafka_bootstrap},
        topic_prefix=topic_prefix,
    )
    fresh = [np.full((4, 16), k, dtype=np.int64) for k in range(8)]
    stuck = [np.full((4, 16), 100 + k % 2, dtype=np.int64) for k in range(16)]
    for step, batch in enumerate(reporter.wrap_loader(fresh + stuck, interval_s=3600)):
        with reporter.step(step) as s, s.segment("forward"):
            s.record(loss=float(batch[0, 0]))
    reporter.restore_test(
        "job-loader-step4", restored=["model", "optimizer", "scheduler", "data"], steps_resumed=3, step=4
    )
    reporter.close()
    assert reporter.stats["sdk_errors"] == 0
    # 24 steps, one DataLoaderSample (end of the epoch), one RestoreTest.
    got = [
        e
        for _, e in _consume(
            kafka_bootstrap, [topics[TRAINING_STEPS], topics[TRAINING_EVENTS]], group_id, want=26
        )
    ]
    steps = sorted((e for e in got if e.type == "StepCompleted"), key=lambda e: e.record["step"])
    assert len(steps) == 24 and all(e.record["batch_fingerprint"] for e in steps)
    (sample,) = [e.record for e in got if e.type == "DataLoaderSample"]
    assert sample["batches"] == 24 and sample["batch_prep_s"] is not None
    (restore,) = [e.record for e in got if e.type == "RestoreTest"]
    assert restore["passed"] and restore["checkpoint_id"] == "job-loader-step4"
    det = RepeatedDataDetector(Topology(), {"window_steps": 8})
    found = [f for e in steps for f in det.observe(e)]
    assert [(f.rule, f.active, f.key) for f in found][:1] == [("repeated_data", True, ("job-loader", "0"))]
