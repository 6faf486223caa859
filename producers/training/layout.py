"""A job's parallel layout (DP/TP/PP/EP sizes, ZeRO stage, sharding) as the framework and launcher know it.

Part of the baseline key (`streams.detectors.windows.baseline_key`): a run is compared only with
runs laid out the same way. Each reader returns the JobStarted fields it could tell, nothing it
could not (a field it leaves out keeps the reporter's default), and never raises: a framework
version that moved an attribute costs the field, not the run.

- Lightning: the Trainer's strategy. DDP is pure data parallel; FSDP names its sharding strategy
  (`fsdp:FULL_SHARD`, `fsdp:HYBRID_SHARD`, ...); DeepSpeed its ZeRO stage from the strategy's
  config; ModelParallelStrategy its data and tensor parallel sizes.
- Hugging Face: `TrainingArguments.fsdp` / `fsdp_config` (the list of options of older
  versions, or `reshard_after_forward` of newer ones), `deepspeed` (a dict or a JSON file) and
  accelerate's `parallelism_config` (tensor, context and data sizes).
- Launcher environment (torchrun, `accelerate launch`, Slurm): accelerate's
  `ACCELERATE_USE_FSDP` / `FSDP_SHARDING_STRATEGY` / `ACCELERATE_USE_DEEPSPEED` /
  `ACCELERATE_DEEPSPEED_ZERO_STAGE`, and `RANKSIGHT_TENSOR_PARALLEL`, `_PIPELINE_PARALLEL`,
  `_EXPERT_PARALLEL`, `_ZERO_STAGE`, `_SHARDING`, `_STORAGE_TIER` for what no launcher says
  (Megatron's sizes are script arguments). Also where the job runs: `RANKSIGHT_IMAGE` (or
  pyxis' container image on Slurm) and `RANKSIGHT_WORKSPACE`.

The data parallel size, when nobody names it, is the world size over TP x PP (the reporter's rule).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

__all__ = ["env_layout", "hf_layout", "lightning_layout", "merge_layout"]

# FSDP's sharding strategies (torch.distributed.fsdp.ShardingStrategy names); HF's option strings.
_FSDP_STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "_HYBRID_SHARD_ZERO2", "NO_SHARD")
# accelerate writes FSDP_SHARDING_STRATEGY as the name or as its 1-based number.
_FSDP_BY_NUMBER = {"1": "FULL_SHARD", "2": "SHARD_GRAD_OP", "3": "NO_SHARD", "4": "HYBRID_SHARD"}
_MAX_LABEL = 64  # a sharding name is a short word; a longer one is not a strategy


def _positive(value: Any) -> int | None:
    """A size or stage as an int (0 allowed for a ZeRO stage), else None."""
    if isinstance(value, bool):
        return None
    try:
        number = int(str(value).strip()) if isinstance(value, str) else int(value)
    except (TypeError, ValueError):
        return None
    return number if number >= 0 else None


def _fsdp_name(value: Any) -> str:
    """`fsdp:FULL_SHARD` from an enum, its name or accelerate's number; "" when it names none."""
    name = getattr(value, "name", None) or str(value or "")
    name = _FSDP_BY_NUMBER.get(name.strip(), name.strip().upper())
    return f"fsdp:{name}" if name in _FSDP_STRATEGIES else ""


def _zero_stage(config: Any) -> int | None:
    """The ZeRO stage of a DeepSpeed config (a dict, or the path of its JSON file)."""
    if isinstance(config, (str, os.PathLike)):
        try:
            with open(config, encoding="utf-8") as fh:
                config = json.load(fh)
        except (OSError, ValueError):
            return None
    if not isinstance(config, Mapping):
        return None
    zero = config.get("zero_optimization")
    return _positive(zero.get("stage")) if isinstance(zero, Mapping) else None


def _class_names(obj: Any) -> list[str]:
    return [cls.__name__ for cls in type(obj).__mro__]


def lightning_layout(trainer: Any) -> dict[str, Any]:
    """The layout a Lightning Trainer runs: from its strategy (DDP, FSDP, DeepSpeed, ModelParallel)."""
    try:
        strategy = getattr(trainer, "strategy", None)
        names = _class_names(strategy)
        world = _positive(getattr(trainer, "world_size", None))
        if "ModelParallelStrategy" in names:
            dp = _positive(getattr(strategy, "_data_parallel_size", None))
            tp = _positive(getattr(strategy, "_tensor_parallel_size", None))
            out: dict[str, Any] = {}
            if tp:
                out["tensor_parallel"] = tp
            if dp:
                out["data_parallel"] = dp
            elif tp and world:
                out["data_parallel"] = max(1, world // tp)
            return out
        if "DeepSpeedStrategy" in names:
            out = {"sharding": "deepspeed"}
            stage = _zero_stage(getattr(strategy, "config", None))
            if stage is not None:
                out["zero_stage"] = stage
            return out
        if "FSDPStrategy" in names:
            sharding = _fsdp_name(getattr(strategy, "sharding_strategy", None))
            return {"sharding": sharding} if sharding else {}
        return {}  # DDP and single-device: pure data parallel, the reporter's default
    except Exception:
        return {}


def _hf_fsdp(args: Any) -> str:
    fsdp = getattr(args, "fsdp", None)
    if not fsdp:
        return ""
    config = getattr(args, "fsdp_config", None) or {}
    if isinstance(config, Mapping) and config.get("sharding_strategy"):
        named = _fsdp_name(config["sharding_strategy"])
        if named:
            return named
    options = fsdp.split() if isinstance(fsdp, str) else fsdp if isinstance(fsdp, (list, tuple)) else []
    for option in options:
        named = _fsdp_name(getattr(option, "value", option))
        if named:
            return named
    if isinstance(config, Mapping) and isinstance(config.get("reshard_after_forward"), bool):
        # FSDP2's switch: resharding after forward is FULL_SHARD, keeping params is SHARD_GRAD_OP.
        return "fsdp:FULL_SHARD" if config["reshard_after_forward"] else "fsdp:SHARD_GRAD_OP"
    return "fsdp:FULL_SHARD"  # transformers' default strategy when FSDP is on


def hf_layout(args: Any) -> dict[str, Any]:
    """The layout a Hugging Face `TrainingArguments` asks for: FSDP, DeepSpeed and accelerate's parallelism config."""
    out: dict[str, Any] = {}
    try:
        deepspeed = getattr(args, "deepspeed", None)
        if deepspeed:
            out["sharding"] = "deepspeed"
            stage = _zero_stage(deepspeed)
            if stage is not None:
                out["zero_stage"] = stage
        else:
            sharding = _hf_fsdp(args)
            if sharding:
                out["sharding"] = sharding
        parallel = getattr(args, "parallelism_config", None)
        if parallel is not None:
            tp = _positive(getattr(parallel, "tp_size", None))
            cp = _positive(getattr(parallel, "cp_size", None)) or 1
            replicate = _positive(getattr(parallel, "dp_replicate_size", None)) or 1
            shard = _positive(getattr(parallel, "dp_shard_size", None)) or 1
            if tp:
                out["tensor_parallel"] = tp
            if tp or cp > 1 or replicate > 1 or shard > 1:
                out["data_parallel"] = replicate * shard
    except Exception:
        return out
    return out


def env_layout(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """What the launcher environment says: accelerate's FSDP/DeepSpeed variables, RANKSIGHT_* sizes, image, workspace."""
    env = os.environ if env is None else env
    out: dict[str, Any] = {}
    for field, name in (
        ("tensor_parallel", "RANKSIGHT_TENSOR_PARALLEL"),
        ("pipeline_parallel", "RANKSIGHT_PIPELINE_PARALLEL"),
        ("expert_parallel", "RANKSIGHT_EXPERT_PARALLEL"),
        ("data_parallel", "RANKSIGHT_DATA_PARALLEL"),
        ("zero_stage", "RANKSIGHT_ZERO_STAGE"),
    ):
        value = _positive(env.get(name))
        if value is not None and (value > 0 or field == "zero_stage"):
            out[field] = value
    if env.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true":
        out["sharding"] = "deepspeed"
        stage = _positive(env.get("ACCELERATE_DEEPSPEED_ZERO_STAGE"))
        if stage is not None and "zero_stage" not in out:
            out["zero_stage"] = stage
    elif env.get("ACCELERATE_USE_FSDP", "").lower() == "true":
        out["sharding"] = _fsdp_name(env.get("FSDP_SHARDING_STRATEGY") or "FULL_SHARD") or "fsdp:FULL_SHARD"
    for label, names in (
        ("sharding", ("RANKSIGHT_SHARDING",)),
        ("storage_tier", ("RANKSIGHT_STORAGE_TIER",)),
        ("image", ("RANKSIGHT_IMAGE", "SLURM_SPANK__SLURM_SPANK_OPTION_pyxis_container_image")),
        ("workspace", ("RANKSIGHT_WORKSPACE",)),
    ):
        for name in names:
            text = (env.get(name) or "").strip()
            if text:
                out[label] = text[:_MAX_LABEL] if label == "sharding" else text
                break
    return out


def merge_layout(*layouts: Mapping[str, Any]) -> dict[str, Any]:
    """Later layouts win field by field (environment < framework < what the user passed)."""
    out: dict[str, Any] = {}
    for layout in layouts:
        out.update({k: v for k, v in layout.items() if v is not None and v != ""})
    return out
