"""Real training stacks through the real broker to the real worker: torchrun DDP over gloo, a Lightning
Trainer (DDP on CPU) and a Hugging Face Trainer, each on 2 ranks with the SDK's one line.

Each test asserts the alerts that must come for its injected fault and that nothing else pages
for that job. The healthy runs carry a checkpoint policy (`checkpoint_max_age_s` 3 s) shorter
than the run and checkpoint every ~1 s: before checkpoints were verified by the SDK, every one
of them paged `checkpoint_stale`. Opt-in: `make test-frameworks` (RANKSIGHT_FRAMEWORK_TESTS=1,
its own venv with torch, lightning and transformers from PyPI).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from infra.errors import KafkaSetupError
from infra.kafka.topics import create_topics, delete_topics, prefixed
from schemas.codec import Codec
from schemas.topics import ALERTS
from streams.runtime.options import DEFAULT_RUNTIME, JOB_TOPICS
from tests.integration.streams.harness import Worker, group_lag

pytestmark = [
    pytest.mark.frameworks,
    pytest.mark.skipif(
        os.environ.get("RANKSIGHT_FRAMEWORK_TESTS") != "1",
        reason="set RANKSIGHT_FRAMEWORK_TESTS=1 (make test-frameworks) to run the real frameworks",
    ),
]

ROOT = Path(__file__).resolve().parents[3]
TORCHRUN = str(Path(sys.executable).parent / "torchrun")
RANKS = 2
# Rules a short healthy run may raise on its own: none.
HEALTHY: frozenset[str] = frozenset()


class Pipeline:
    """This module's topics and one `ranksight worker` on them, shared by its jobs (each has its own id)."""

    def __init__(self, bootstrap: str, prefix: str, topics: dict[str, str], worker: Worker) -> None:
        self.bootstrap, self.prefix, self.topics, self.worker = bootstrap, prefix, topics, worker


@pytest.fixture(scope="module")
def pipeline(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    """Topics and a worker started once for the module: a worker start is ~10 s on CI's 2 cores."""
    prefix = f"t{uuid.uuid4().hex[:8]}."
    create_topics(kafka_bootstrap, prefix=prefix)
    w = Worker(kafka_bootstrap, prefix, tmp_path_factory.mktemp("worker-home"), DEFAULT_RUNTIME)
    w.start("--checkpoint-interval-ms", "2000")
    try:
        yield Pipeline(kafka_bootstrap, prefix, prefixed(prefix), w)
    finally:
        w.stop()
        with contextlib.suppress(KafkaSetupError):
            delete_topics(kafka_bootstrap, prefixed(prefix).values())


class Alerts:
    """The alert topic from the beginning, each record with the wall time it was read."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "fw-alerts", "log_level": 0})
        meta = self.consumer.list_topics(topic, timeout=10).topics[topic]
        self.consumer.assign([TopicPartition(topic, p, 0) for p in meta.partitions])
        self.codec = Codec()
        self.records: list[tuple[float, dict[str, Any]]] = []

    def poll(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            msg = self.consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                self.records.append((time.time(), self.codec.decode(msg.value() or b"").record))

    def of(self, job_id: str) -> list[dict[str, Any]]:
        return [r for _, r in self.records if r["job_id"] == job_id]

    def close(self) -> None:
        self.consumer.close()


def _run_job(
    args: list[str], job_id: str, p: Pipeline, launcher: bool = False
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP": p.bootstrap,
        "RANKSIGHT_TOPIC_PREFIX": p.prefix,
        "RANKSIGHT_JOB_ID": job_id,
        "RANKSIGHT_DESTINATION": "kafka",
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",  # nothing but the package registries is reachable; nothing is needed
    }
    command = [TORCHRUN, "--standalone", "--nproc-per-node", str(RANKS)]  # rendezvous on a free port
    if launcher:
        command += ["-m", "producers.training.launch"]
    return subprocess.run([*command, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)


def _settle(alerts: Alerts, p: Pipeline, done: Any) -> None:
    """Read alerts until `done(records)` and the worker has committed every input record, then 3 s more."""
    group = f"{p.prefix}ranksight-detect"
    # The rank stage's inputs: the job stage holds the tail of an ended job's summaries until the
    # wall-clock guard (minutes); its rules (checkpoint_stale) fire during the run, from the
    # summaries released as the job's own event time moves on.
    names = [p.topics.get(t, p.prefix + t) for t in JOB_TOPICS]
    deadline = time.monotonic() + 240  # only against a hang
    while time.monotonic() < deadline:
        alerts.poll(1.0)
        if done(alerts) and group_lag(p.bootstrap, group, names) == 0:
            break
    else:
        raise AssertionError(f"no progress to the alerts and zero lag:\n{p.worker.log()}")
    alerts.poll(3.0)  # anything the last records still bring


def _rules(records: list[dict[str, Any]]) -> set[str]:
    return {r["rule"] for r in records if r["status"] == "firing"}


# Per stack: a healthy phase long past its checkpoint policy (8 s; a checkpoint every 5 steps of
# ~0.1 s), then NaN: the rules that must fire, and those that may fire beside them.
STACKS = {
    "ddp": ["examples/train_ddp.py", "--steps", "110", "--checkpoint-every", "5", "--nan-at-step", "100"],
    "lightning": [
        "examples/train_lightning.py",
        "--steps",
        "90",
        "--checkpoint-every",
        "5",
        "--nan-at-step",
        "80",
    ],
    "hf": ["examples/train_hf.py", "--steps", "70", "--checkpoint-every", "5", "--nan-at-step", "60"],
}
POLICY = ["--step-delay", "0.1", "--checkpoint-max-age-s", "8"]
MUST = {"ddp": {"nonfinite_loss"}, "lightning": {"nonfinite_loss"}, "hf": {"nonfinite_grad"}}
MAY = {"nonfinite_loss", "nonfinite_grad", "loss_divergence", "grad_spike"}


@pytest.mark.parametrize("stack", sorted(STACKS))
def test_checkpoints_are_verified_and_only_the_injected_nan_pages(stack: str, pipeline: Pipeline) -> None:
    """No checkpoint_stale (every checkpoint verified), no straggler, no telemetry_missing: only the NaN's rule."""
    job_id = f"{stack}-{uuid.uuid4().hex[:6]}"
    started = time.monotonic()
    run = _run_job([*STACKS[stack], *POLICY], job_id, pipeline)
    assert run.returncode == 0, run.stderr[-4000:]
    ran = time.monotonic() - started
    alerts = Alerts(pipeline.bootstrap, pipeline.topics[ALERTS])
    try:
        _settle(alerts, pipeline, lambda a: MUST[stack] <= _rules(a.of(job_id)))
    finally:
        alerts.close()
    fired = _rules(alerts.of(job_id))
    print(f"{stack}: job {ran:.1f} s, settled {time.monotonic() - started:.1f} s, fired {sorted(fired)}")
    assert MUST[stack] <= fired <= MUST[stack] | MAY, [r["summary"] for r in alerts.of(job_id)]
    nan = min(t for t, r in alerts.records if r["job_id"] == job_id and r["rule"] in MUST[stack])
    print(
        f"{stack}: NaN alert read {nan - (started + ran - time.monotonic() + time.time()):.1f} s after the job ended"
    )


DEATHS = {"kill": "killed by SIGKILL", "segfault": "SIGSEGV (segmentation fault)", "oom": "OOM kill"}


@pytest.mark.parametrize("how", sorted(DEATHS))
def test_a_rank_that_dies_without_an_exception_is_rank_failed(
    how: str, pipeline: Pipeline, tmp_path: Path
) -> None:
    """kill -9, a segfault, the kernel's OOM kill: the launcher reports rank_failed with the cause."""
    launch: list[str] = []
    if how == "oom":
        from producers.training.launch import memory_cgroup

        parent = memory_cgroup()
        if parent is None or not os.access(parent, os.W_OK):
            pytest.skip("no writable memory cgroup here for the kernel's OOM killer")
        launch = ["--memory-limit", str(600 << 20)]  # the launcher's own option, before the script
    job_id = f"die-{how}-{uuid.uuid4().hex[:6]}"
    note = tmp_path / "died"
    args = [
        *launch, "examples/train_ddp.py", "--steps", "200", "--step-delay", "0.05", "--checkpoint-every", "0",
        "--die-rank", "1", "--die-at-step", "3", "--die-how", how, "--die-note", str(note),
    ]  # fmt: skip
    alerts = Alerts(pipeline.bootstrap, pipeline.topics[ALERTS])
    try:
        run = _run_job(args, job_id, pipeline, launcher=True)
        assert run.returncode != 0, "torchrun reports the failed worker"

        def failed(a: Alerts) -> bool:
            return any(r["rule"] == "rank_failed" and r["rank"] == 1 for r in a.of(job_id))

        _settle(alerts, pipeline, failed)
    finally:
        alerts.close()
    died = float(note.read_text())
    seen, alert = min(
        ((t, r) for t, r in alerts.records if r["job_id"] == job_id and r["rule"] == "rank_failed"
         and r["rank"] == 1 and r["status"] == "firing"),
        key=lambda tr: tr[0],
    )  # fmt: skip
    # The time to detect is printed, never asserted (timing never fails a test).
    print(f"{how}: rank_failed read {seen - died:.2f} s after the death: {alert['summary']}")
    assert DEATHS[how] in alert["summary"], alert["summary"]
