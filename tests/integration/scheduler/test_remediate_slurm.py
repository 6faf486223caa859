"""`ranksight remediate --slurm --execute` against a real single-node Slurm: a job that became a zombie is
cancelled; a job in a long evaluation is not.

Both are real Slurm jobs holding their allocation (a process that sleeps: alive, no progress). What
the training process and the node agent would have published about them is built here, from the
moment Slurm started them until now: steps for 5 s, then silence while their process keeps holding
its GPU (CI has no GPU, so the GPU samples are written, with the job's pid). The real detection
engine (zombie grace 10 s) turns that into the zombie_job alerts; `ranksight remediate` reads them
from Kafka, the evaluation that job B opened since, asks Slurm about each job and acts through it.
The history starts when Slurm started the job, not before: remediate refuses an alert that fired
before the scheduler's run of the job began (that run did not raise it).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from confluent_kafka import Consumer, Producer, TopicPartition

from schemas.codec import Codec
from schemas.records import Event
from schemas.topics import ACTIONS, ALERTS, TRAINING_EVENTS, key_for
from streams.config import load_config
from streams.offline.detection import DetectionEngine
from tests.integration.scheduler.conftest import SlurmCluster
from tests.unit.streams.builders import gpu_sample, job_started, rank_bound, step

RANKSIGHT = str(Path(sys.executable).with_name("ranksight"))
CODEC = Codec()


def _slurm_state(slurm: SlurmCluster, job: str) -> str:
    data = json.loads(slurm.run("squeue", "--json", "-j", job))
    (entry,) = [j for j in data["jobs"] if str(j["job_id"]) == job]
    state = entry["job_state"]
    return str(state[0] if isinstance(state, list) else state)


def _wait_state(slurm: SlurmCluster, job: str, wanted: str) -> None:
    deadline = time.monotonic() + 120
    while (state := _slurm_state(slurm, job)) != wanted:
        if time.monotonic() > deadline:
            raise AssertionError(f"Slurm job {job} is {state}, never {wanted}:\n{slurm.logs()}")
        time.sleep(0.2)


def started_ms(slurm: SlurmCluster, job: str) -> int:
    """When Slurm started the job (ms; Slurm counts whole seconds)."""
    data = json.loads(slurm.run("squeue", "--json", "-j", job))
    (entry,) = [j for j in data["jobs"] if str(j["job_id"]) == job]
    value = entry["start_time"]
    return int(value["number"] if isinstance(value, dict) else value) * 1000


# A zombie is GPUs held this long without progress; the history must span it and the engine's
# 5 s allowed lateness (checked: the alert fires ~16 s after the start, 5 s of steps and the 10 s
# grace, once records reach 5 s beyond that).
ZOMBIE_CONFIG = load_config(None, {"detectors": {"progress": {"zombie_grace_s": 10.0, "stall_floor_s": 5.0}}})
HISTORY_MS = 23_000


def _history(job: str, gpu: int, start: int, now: int) -> list[Event]:
    """A one-rank job on GPU `gpu` of node-01: 5 s of steps, then silence while its process holds the GPU."""
    pid = 4000 + gpu
    events = [job_started(job, start, world_size=1, team="llm", checkpoint_max_age_s=None)]
    bound = rank_bound(job, 0, start)
    bound.record.update(gpu_index=gpu, local_rank=gpu, gpu_uuid=f"GPU-node-01-{gpu}", pid=pid)
    events.append(bound)
    events += [step(job, 0, s, start + s * 1000) for s in range(1, 6)]
    events += [gpu_sample("node-01", gpu, ts, pids=[pid]) for ts in range(start + 1000, now, 1000)]
    return events


def _actions(bootstrap: str, topic: str) -> list[dict[str, Any]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "reader", "enable.auto.commit": False})
    try:
        parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        tps = [TopicPartition(topic, p, 0) for p in parts]
        ends = {tp.partition: consumer.get_watermark_offsets(tp, timeout=10)[1] for tp in tps}
        consumer.assign(tps)
        out: list[dict[str, Any]] = []
        while sum(ends.values()) > len(out):
            out += [CODEC.decode(m.value()).record for m in consumer.consume(100, timeout=1.0)]
        return out
    finally:
        consumer.close()


def test_a_zombie_is_cancelled_and_a_job_in_a_long_evaluation_is_not(
    slurm: SlurmCluster, kafka_bootstrap: str, topics: dict[str, str], topic_prefix: str, tmp_path: Path
) -> None:
    zombie = slurm.sbatch("--cpus-per-task=1", "--wrap", "sleep 600")
    evaluating = slurm.sbatch("--cpus-per-task=1", "--wrap", "sleep 600")
    try:
        _wait_state(slurm, zombie, "RUNNING")
        _wait_state(slurm, evaluating, "RUNNING")
        start = max(started_ms(slurm, zombie), started_ms(slurm, evaluating))
        # The GPUs must have been held without progress for the zombie grace: real time must pass.
        time.sleep(max(0.0, (start + HISTORY_MS) / 1000 - time.time()))
        now = int(time.time() * 1000)
        events = sorted(
            _history(zombie, 0, start, now) + _history(evaluating, 1, start, now),
            key=lambda e: e.record["ts"],
        )
        engine = DetectionEngine(ZOMBIE_CONFIG)
        alerts = [e for e in engine.run(events) if e.type == "Alert" and e.record["rule"] == "zombie_job"]
        assert {a.record["job_id"] for a in alerts} == {zombie, evaluating}, "the engine saw no zombies"
        # Job B announced an evaluation after the alert fired (a long validation pass is running).
        eval_open = Event(
            "EvaluationEvent",
            {
                "ts": now - 1000,
                "job_id": evaluating,
                "run_id": f"{evaluating}-run-1",
                "evaluation_id": "val-3",
                "step": 60,
                "phase": "started",
                "expected_duration_s": 3600.0,
            },
        )
        producer = Producer({"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True})
        for event in [*(e for e in events if e.type in ("JobStarted", "RankBound")), eval_open, *alerts]:
            canonical = ALERTS if event.type == "Alert" else TRAINING_EVENTS
            producer.produce(
                topics[canonical], key=key_for(canonical, event.record), value=CODEC.encode(event)
            )
        assert producer.flush(30) == 0

        policy = tmp_path / "policy.yaml"
        policy.write_text(
            yaml.safe_dump(
                {
                    "rules": {"zombie_job": {"action": "cancel", "min_firing_s": 1}},
                    "opt_in": {"users": ["root"]},  # the Slurm user (the test's jobs run as root)
                }
            )
        )
        done = subprocess.run(
            [RANKSIGHT, "remediate", "--policy", str(policy), "--slurm", "--execute", "--idle-exit", "4"],
            env={
                **slurm.env,
                "KAFKA_BOOTSTRAP": kafka_bootstrap,
                "RANKSIGHT_TOPIC_PREFIX": topic_prefix,
                "RANKSIGHT_HOME": str(tmp_path),
            },
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        _wait_state(slurm, zombie, "CANCELLED")
        assert _slurm_state(slurm, evaluating) == "RUNNING", done.stdout
        decisions = {r["job_id"]: r for r in _actions(kafka_bootstrap, topics[ACTIONS])}
        acted, spared = decisions[zombie], decisions[evaluating]
        assert (acted["decision"], acted["action"], acted["target"]) == ("acted", "cancel", zombie)
        assert acted["detail"] == f"scancel {zombie}: ok" and acted["scheduler"] == "slurm"
        assert (spared["decision"], spared["reason_code"]) == ("skipped", "operation_open")
        assert "evaluation val-3 is open" in spared["reason"]
        assert "acted" in done.stdout and "operation_open" not in done.stderr
    finally:
        slurm.run("scancel", zombie, evaluating)
