"""The parallel layout on JobStarted, from the launcher environment and (with the frameworks venv) from
real Lightning strategies and Hugging Face TrainingArguments."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from producers.publisher import MemoryPublisher
from producers.training import Reporter
from producers.training.layout import env_layout, hf_layout, lightning_layout, merge_layout
from streams.detectors.base import JobInfo
from streams.detectors.windows import baseline_key


def _job_started(env: dict[str, str], world: int = 8, **info: Any) -> dict[str, Any]:
    publisher = MemoryPublisher()
    reporter = Reporter("lay-job", 0, world_size=world, node="n", publisher=publisher, bind=False, env=env)
    reporter.job_started(owner="ada", team="llm", **info)
    reporter.close()
    [started] = [e.record for e in publisher.events if e.type == "JobStarted"]
    return started


def test_torchrun_world_alone_is_data_parallel_over_every_rank() -> None:
    started = _job_started({"WORLD_SIZE": "8"})
    assert (started["data_parallel"], started["tensor_parallel"], started["pipeline_parallel"]) == (8, 1, 1)
    assert started["zero_stage"] is None and started["sharding"] == ""


def test_launcher_sizes_divide_the_world_and_name_image_workspace_and_tier() -> None:
    env = {
        "RANKSIGHT_TENSOR_PARALLEL": "4",
        "RANKSIGHT_PIPELINE_PARALLEL": "2",
        "RANKSIGHT_EXPERT_PARALLEL": "2",
        "RANKSIGHT_STORAGE_TIER": "lustre-hot",
        "SLURM_SPANK__SLURM_SPANK_OPTION_pyxis_container_image": "nvcr.io/nvidia/pytorch:25.01-py3",
        "RANKSIGHT_WORKSPACE": "llm-pretrain",
    }
    started = _job_started(env, world=64)
    assert (started["data_parallel"], started["tensor_parallel"], started["pipeline_parallel"]) == (8, 4, 2)
    assert started["expert_parallel"] == 2
    assert started["storage_tier"] == "lustre-hot"
    assert started["image"] == "nvcr.io/nvidia/pytorch:25.01-py3"
    assert started["workspace"] == "llm-pretrain"


def test_accelerate_launch_names_deepspeed_and_its_zero_stage() -> None:
    env = {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3"}
    started = _job_started(env)
    assert (started["sharding"], started["zero_stage"]) == ("deepspeed", 3)


@pytest.mark.parametrize(
    ("value", "expected"), [("FULL_SHARD", "fsdp:FULL_SHARD"), ("4", "fsdp:HYBRID_SHARD")]
)
def test_accelerate_launch_names_the_fsdp_strategy_by_name_or_number(value: str, expected: str) -> None:
    assert (
        env_layout({"ACCELERATE_USE_FSDP": "true", "FSDP_SHARDING_STRATEGY": value})["sharding"] == expected
    )


def test_what_the_user_passes_wins_over_the_environment() -> None:
    env = {
        "RANKSIGHT_TENSOR_PARALLEL": "4",
        "ACCELERATE_USE_DEEPSPEED": "true",
        "ACCELERATE_DEEPSPEED_ZERO_STAGE": "2",
    }
    started = _job_started(env, world=16, tensor_parallel=2, zero_stage=1, sharding="deepspeed")
    assert (started["tensor_parallel"], started["data_parallel"], started["zero_stage"]) == (2, 8, 1)


def test_garbage_sizes_are_ignored_not_raised() -> None:
    layout = env_layout({"RANKSIGHT_TENSOR_PARALLEL": "eight", "RANKSIGHT_PIPELINE_PARALLEL": "-2"})
    assert layout == {}
    assert lightning_layout(object()) == {} and hf_layout(object()) == {}


def test_two_layouts_of_one_family_get_two_baseline_keys() -> None:
    """The point of the fields: a ZeRO-3 run is not compared with a ZeRO-1 run of the same model."""
    keys = set()
    for stage in ("1", "3"):
        started = _job_started({"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": stage})
        job = JobInfo(
            job_id="j",
            workload_family="llm",
            nodes=["a"],
            **{
                f: started[f]
                for f in ("data_parallel", "tensor_parallel", "pipeline_parallel", "zero_stage", "sharding")
            },
        )
        keys.add(baseline_key(job))
    assert keys == {
        "llm|-|-|1n|bs-|seq-|dp8.tp1.pp1.z1.deepspeed",
        "llm|-|-|1n|bs-|seq-|dp8.tp1.pp1.z3.deepspeed",
    }


def test_hf_deepspeed_config_file_gives_the_zero_stage(tmp_path: Path) -> None:
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"zero_optimization": {"stage": 2}}))
    assert hf_layout(SimpleNamespace(deepspeed=str(config), fsdp=None)) == {
        "sharding": "deepspeed",
        "zero_stage": 2,
    }


def test_merge_keeps_zero_and_drops_empty() -> None:
    assert merge_layout({"zero_stage": 2, "sharding": "x"}, {"zero_stage": 0, "sharding": ""}) == {
        "zero_stage": 0,
        "sharding": "x",
    }


# -- the real frameworks (frameworks venv: `make test-frameworks`) ------------------------------------


def test_lightning_strategies_name_their_layout() -> None:
    strategies = pytest.importorskip("lightning.pytorch.strategies")
    from torch.distributed.fsdp import ShardingStrategy

    def trainer(strategy: Any, world: int = 8) -> Any:
        return SimpleNamespace(strategy=strategy, world_size=world)

    assert lightning_layout(trainer(strategies.DDPStrategy())) == {}
    assert lightning_layout(trainer(strategies.FSDPStrategy())) == {"sharding": "fsdp:FULL_SHARD"}
    grad_op = strategies.FSDPStrategy(sharding_strategy=ShardingStrategy.SHARD_GRAD_OP)
    assert lightning_layout(trainer(grad_op)) == {"sharding": "fsdp:SHARD_GRAD_OP"}
    tp = strategies.ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=4)
    assert lightning_layout(trainer(tp)) == {"tensor_parallel": 4, "data_parallel": 2}

    class DeepSpeedStrategy(strategies.DDPStrategy):  # the real one needs the deepspeed package
        config = {"zero_optimization": {"stage": 3}}

    assert lightning_layout(trainer(DeepSpeedStrategy())) == {"sharding": "deepspeed", "zero_stage": 3}


def test_hf_training_arguments_name_their_layout(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    args = transformers.TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True)
    assert hf_layout(args) == {}
    fsdp = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        report_to=[],
        use_cpu=True,
        fsdp=True,
        fsdp_config={"reshard_after_forward": False},
    )
    assert hf_layout(fsdp) == {"sharding": "fsdp:SHARD_GRAD_OP"}
    from accelerate.parallelism_config import ParallelismConfig

    args.parallelism_config = ParallelismConfig(dp_shard_size=2, tp_size=4)
    assert hf_layout(args) == {"tensor_parallel": 4, "data_parallel": 2}
