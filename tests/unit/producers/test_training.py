"""The training SDK: identity from the launcher environment, one StepCompleted per step block, checkpoint
phases, no exception ever raised into the training loop."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest

from producers.agent import FakeDevice, FakeNvml
from producers.publisher import MemoryPublisher
from producers.training import Reporter, resolve_identity, visible_gpu
from schemas.codec import Codec
from schemas.files import iter_container


def _reporter(publisher: MemoryPublisher, **kw: object) -> Reporter:
    return Reporter(
        "job-7", 3, world_size=8, local_rank=3, node="n1", publisher=publisher, bind=False, env={}, **kw
    )  # type: ignore[arg-type]


def _events(reporter: Reporter, publisher: MemoryPublisher, kind: str | None = None) -> list:
    assert reporter.flush(5) == 0
    return [e for e in publisher.events if kind is None or e.type == kind]


def test_identity_comes_from_torchrun_environment() -> None:
    env = {
        "RANK": "5",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "16",
        "TORCHELASTIC_RUN_ID": "rdzv-42",
        "RANKSIGHT_NODE": "gpu-7",
    }
    ident = resolve_identity(env=env)
    assert (ident.job_id, ident.rank, ident.local_rank, ident.world_size, ident.node) == (
        "rdzv-42",
        5,
        1,
        16,
        "gpu-7",
    )


def test_identity_comes_from_slurm_and_ranksight_job_id_wins() -> None:
    env = {
        "SLURM_JOB_ID": "991",
        "SLURM_PROCID": "9",
        "SLURM_LOCALID": "1",
        "SLURM_NTASKS": "32",
        "SLURMD_NODENAME": "sn3",
    }
    ident = resolve_identity(env=env)
    assert (ident.job_id, ident.rank, ident.local_rank, ident.world_size, ident.node) == (
        "991",
        9,
        1,
        32,
        "sn3",
    )
    assert resolve_identity(env={**env, "RANKSIGHT_JOB_ID": "train-x"}).job_id == "train-x"
    assert resolve_identity("explicit", 0, env=env).rank == 0


def test_torchrun_default_rendezvous_id_is_not_a_job_id() -> None:
    assert resolve_identity(env={"TORCHELASTIC_RUN_ID": "none"}).job_id.startswith("local-")


def test_a_step_block_emits_one_step_completed_with_its_segments() -> None:
    publisher = MemoryPublisher()
    reporter = _reporter(publisher)
    with reporter.step(12) as s:
        with s.segment("forward"):
            time.sleep(0.01)
        with s.segment("comm"):
            time.sleep(0.005)
        with s.segment("comm"):
            time.sleep(0.005)
        s.record(loss=2.5, lr=1e-4, grad_norm=0.7, samples=32, tokens=32 * 128)
    [event] = _events(reporter, publisher, "StepCompleted")
    r = event.record
    assert (r["job_id"], r["rank"], r["step"], r["loss"], r["samples"]) == ("job-7", 3, 12, 2.5, 32)
    assert r["forward_s"] >= 0.01 and r["comm_s"] >= 0.01, "repeated segments are summed"
    assert r["step_time_s"] >= r["forward_s"] + r["comm_s"]
    assert r["backward_s"] is None and r["skipped"] is False
    Codec().encode(event)


def test_non_float_values_are_converted_off_the_training_thread() -> None:
    class Tensorish:
        def __float__(self) -> float:
            return math.nan

    publisher = MemoryPublisher()
    reporter = _reporter(publisher)
    with reporter.step(1) as s:
        s.record(loss=Tensorish(), samples=True + 7)
    [event] = _events(reporter, publisher, "StepCompleted")
    assert math.isnan(event.record["loss"]) and event.record["samples"] == 8
    Codec().encode(event)


def test_an_exception_in_the_step_is_reraised_and_reported_as_a_rank_fault() -> None:
    publisher = MemoryPublisher()
    reporter = _reporter(publisher)
    with pytest.raises(ValueError, match="shape mismatch"), reporter.step(4):
        raise ValueError("shape mismatch")
    events = _events(reporter, publisher)
    assert [e.type for e in events] == ["RankFault"]
    assert "step 4" in events[0].record["detail"] and events[0].record["kind"] == "exception"


def test_checkpoint_emits_started_then_completed_with_bytes_and_verified() -> None:
    publisher = MemoryPublisher()
    reporter = _reporter(publisher)
    with reporter.checkpoint(100, "s3://ck/100") as ck:
        ck.bytes = 1234
    ck.verified("sha256:abc")
    events = _events(reporter, publisher, "CheckpointEvent")
    assert [e.record["phase"] for e in events] == ["started", "completed", "verified"]
    assert events[1].record["bytes"] == 1234 and events[1].record["duration_s"] >= 0
    assert events[2].record["checksum"] == "sha256:abc"
    assert len({e.record["checkpoint_id"] for e in events}) == 1
    for e in events:
        Codec().encode(e)


def test_a_failing_checkpoint_is_reported_and_its_exception_reraised() -> None:
    publisher = MemoryPublisher()
    reporter = _reporter(publisher)
    with pytest.raises(OSError, match="disk full"), reporter.checkpoint(5, "/ck/5"):
        raise OSError("disk full")
    events = _events(reporter, publisher, "CheckpointEvent")
    assert [e.record["phase"] for e in events] == ["started", "failed"]
    assert "disk full" in events[1].record["error"]


def test_job_started_state_validation_fault_are_schema_valid() -> None:
    publisher = MemoryPublisher()
    reporter = _reporter(publisher)
    reporter.job_started(
        owner="ana", team="llm", model_name="tiny", workload_family="mlp-synthetic", checkpoint_max_age_s=600
    )
    reporter.state("running")
    reporter.validation(10, {"val_loss": 1.5})
    reporter.fault("oom", "host OOM killer", exit_code=137)
    reporter.collective("allreduce", interval_s=1.0, count=10, time_s=0.3)
    reporter.dataloader(interval_s=1.0, batches=10, wait_s=0.01)
    events = _events(reporter, publisher)
    assert [e.type for e in events] == [
        "JobStarted",
        "JobStateChanged",
        "ValidationResult",
        "RankFault",
        "CollectiveSample",
        "DataLoaderSample",
    ]
    assert events[0].record["world_size"] == 8 and events[0].record["data_parallel"] == 8
    codec = Codec()
    for e in events:
        assert codec.decode(codec.encode(e)).type == e.type


def test_misuse_never_raises_into_the_training_loop() -> None:
    publisher = MemoryPublisher()
    reporter = _reporter(publisher)
    reporter.state("exploded")  # not a job state
    reporter.validation(1, {"acc": "not a number"})  # fails on the background thread
    reporter.job_started(owner=123, team="t")  # type: ignore[arg-type]  # fails to encode, off-thread
    with reporter.step(1) as s:
        with s.segment("teleport"):
            pass
        s.record(perplexity=3.0)
    reporter.flush(5)
    assert reporter.stats["sdk_errors"] >= 4
    assert [e.type for e in publisher.events] == ["StepCompleted"], "bad events are dropped, good ones kept"


def test_without_a_reachable_destination_the_reporter_still_runs(caplog: pytest.LogCaptureFixture) -> None:
    reporter = Reporter("j", 0, destination="kafka", env={}, bind=False)  # no KAFKA_BOOTSTRAP
    with reporter.step(1) as s:
        s.record(loss=1.0)
    reporter.close()
    assert reporter.stats["sdk_errors"] == 1
    assert "reporting is off" in caplog.text


def test_outbox_bound_drops_and_counts_instead_of_growing() -> None:
    publisher = MemoryPublisher()
    reporter = _reporter(publisher, max_pending=0)
    reporter.fault("x")
    assert reporter.stats["dropped"] == 1


def test_rank_bound_carries_pid_and_the_visible_gpu_uuid() -> None:
    nvml = FakeNvml(devices=[FakeDevice(0, "GPU-zero"), FakeDevice(1, "GPU-one"), FakeDevice(2, "GPU-two")])
    publisher = MemoryPublisher()
    env = {"CUDA_VISIBLE_DEVICES": "2,1"}
    reporter = Reporter("j", 1, local_rank=1, node="n", publisher=publisher, env=env, nvml=nvml)
    [bound] = _events(reporter, publisher, "RankBound")
    assert (
        bound.record["gpu_uuid"] == "GPU-one" and bound.record["gpu_index"] == 1 and bound.record["pid"] > 0
    )


def test_visible_gpu_is_null_without_a_driver_or_with_gpus_hidden() -> None:
    assert visible_gpu(0, {}, FakeNvml(init_error=12)) == (None, None)
    assert visible_gpu(0, {"CUDA_VISIBLE_DEVICES": ""}, FakeNvml()) == (None, None)
    assert (
        visible_gpu(0, {"CUDA_VISIBLE_DEVICES": "GPU-00000000-fake-0000-0000-000000000000"}, FakeNvml())[0]
        == 0
    )


def test_file_destination_writes_one_file_per_rank(tmp_path: Path) -> None:
    reporter = Reporter("j", 2, world_size=4, env={}, bind=False, destination=f"file://{tmp_path}/steps.avro")
    with reporter.step(0):
        pass
    reporter.close()
    events = list(iter_container(tmp_path / "steps.rank2.avro"))
    assert [(e.type, e.record["rank"]) for e in events] == [("StepCompleted", 2)]
