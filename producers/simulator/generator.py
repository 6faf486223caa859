"""Scenario generator: random small clusters, jobs, noise, co-location and faults, from a seed.

Cases come in pairs. Case 2k injects one fault (its label says which alert it must raise);
case 2k+1 is its *must-not-alert twin*: the same cluster and jobs with the fault replaced by
something harmless that looks like it (a rank 3% slower instead of a straggler, a long
checkpoint or evaluation instead of a stall, nothing at all), so every alert there is a false
positive. Cases are small (two nodes of four GPUs, seven minutes) so a few hundred run in a
minute or two; each is validated by the same loader as a YAML file and can be written as one.
"""

from __future__ import annotations

import random
from typing import Any

from producers.simulator.scenario import GPU_CLASSES, Scenario, scenario_from_mapping

__all__ = ["GENERATED_FAULTS", "generate", "generate_mappings"]

_TEAMS = ("llm-pretrain", "llm-research", "vision", "speech", "recsys")
_MODELS = (("llama-7b", 4096), ("llama-1b", 2048), ("vit-huge", 256), ("conformer-xl", 1500))
_DURATION_S = 420
_FAULT_START_S = (180, 220)  # after the detectors learned the job's normal (network: 4 windows)
_GPUS = 4

# Faults the generator draws, with how to size them. Rules that need more than the case's
# length to fire by definition (zombie grace, checkpoint age, pending limit, restart counting)
# are left to the hand-written scenarios.
GENERATED_FAULTS: tuple[str, ...] = (
    "straggler_gpu",
    "slow_data_worker",
    "network_degradation",
    "ib_degradation",
    "storage_slowdown",
    "job_stall",
    "nan_loss",
    "nan_grad",
    "grad_spike",
    "xid_error",
    "ecc_uncorrectable",
    "gpu_memory_pressure",
    "host_oom",
    "foreign_process",
    "checkpoint_failure",
    "contention",
)
_NODE_FAULTS = ("network_degradation", "ib_degradation", "storage_slowdown", "host_oom")
_GPU_FAULTS = ("xid_error", "ecc_uncorrectable", "gpu_memory_pressure", "foreign_process", "contention")


def _job(rng: random.Random, index: int, job_id: str, team: str, **placement: Any) -> dict[str, Any]:
    model, seq_len = rng.choice(_MODELS)
    return {
        "id": job_id,
        "team": team,
        "owner": f"user{index}",
        "model_name": model,
        "model_version": f"v{rng.randint(1, 5)}",
        "seq_len": seq_len,
        "step_time": round(rng.uniform(1.5, 2.5), 2),
        "step_noise": round(rng.uniform(0.02, 0.05), 3),
        "rank_jitter": round(rng.choice((0.0, rng.uniform(0.0, 0.02))), 3),
        "rank_speed_spread": round(rng.choice((0.0, rng.uniform(0.0, 0.03))), 3),
        "warmup_steps": 10,
        "init_time": 10,
        "checkpoint": {"every": "2m", "duration": "8s", "max_age": "30m"},
        "evaluation": {"every_steps": rng.choice((0, 150, 200)), "duration": f"{rng.randint(10, 25)}s"},
        **placement,
    }


def _fault(rng: random.Random, kind: str, job: dict[str, Any], colocated: bool) -> dict[str, Any]:
    start = rng.randint(*_FAULT_START_S)
    fault: dict[str, Any] = {"type": kind, "job": job["id"], "start": start}
    nodes, gpus = job["nodes"], job["gpus_per_node"]
    offset = job.get("gpu_offset", 0)
    world = len(nodes) * gpus
    # On a shared node, hit the node the jobs share so the fault reaches both teams.
    node = nodes[0] if colocated else rng.choice(nodes)
    gpu = offset + rng.randrange(gpus)
    if kind == "straggler_gpu":
        fault |= {
            "rank": rng.randrange(world),
            "magnitude": round(rng.uniform(1.5, 1.9), 2),
            "ramp": rng.choice((0, 30, 60)),
            "duration": 150,
            "variant": rng.choice(("thermal", "power")),
        }
    elif kind == "slow_data_worker":
        fault |= {"rank": rng.randrange(world), "magnitude": round(rng.uniform(0.6, 1.0), 2), "duration": 150}
    elif kind in ("network_degradation", "ib_degradation"):
        fault |= {"node": node, "magnitude": round(rng.uniform(2.0, 2.6), 2), "duration": 150}
    elif kind == "storage_slowdown":
        fault |= {"node": node, "magnitude": round(rng.uniform(0.6, 1.0), 2), "duration": 150}
    elif kind == "host_oom":
        fault |= {"node": node, "duration": 120}
    elif kind == "job_stall":
        fault |= {"duration": 120}
    elif kind in ("nan_loss", "nan_grad"):
        fault |= {"duration": 20}
    elif kind == "grad_spike":
        fault |= {"magnitude": 60.0}
    elif kind in ("xid_error", "ecc_uncorrectable"):
        fault |= {"node": node, "gpu": gpu}
    elif kind in ("gpu_memory_pressure", "foreign_process"):
        fault |= {"node": node, "gpu": gpu, "duration": 120}
    elif kind == "contention":
        fault |= {"node": node, "gpu": gpu, "duration": 75, "magnitude": round(rng.uniform(1.8, 2.4), 2)}
    elif kind == "checkpoint_failure":
        fault |= {"duration": 180}
    return fault


def _twin_faults(rng: random.Random, kind: str, job: dict[str, Any]) -> list[dict[str, Any]]:
    """Something harmless that looks like the fault: the must-not-alert twin's only 'fault'."""
    if kind in ("straggler_gpu", "slow_data_worker", "storage_slowdown"):
        world = len(job["nodes"]) * job["gpus_per_node"]
        job["slow_ranks"] = {rng.randrange(world): round(rng.uniform(1.02, 1.04), 3)}
        return []
    if kind == "job_stall":
        if rng.random() < 0.5:
            return [
                {
                    "type": "long_checkpoint",
                    "job": job["id"],
                    "start": rng.randint(*_FAULT_START_S),
                    "duration": 150,
                }
            ]
        # A long evaluation where the stall would be: steps ~2 s, so it starts around 2-3 min in.
        job["evaluation"] = {"every_steps": 60, "duration": "150s"}
    return []


def _case(seed: int, index: int) -> dict[str, Any]:
    pair = index // 2
    rng = random.Random(f"{seed}/generated/{pair}")
    kind = GENERATED_FAULTS[rng.randrange(len(GENERATED_FAULTS))]
    colocated = rng.random() < 0.3
    teams = rng.sample(_TEAMS, 2)
    main_id = f"g{seed}-{pair:04d}-a"
    if colocated:
        # Two teams split node-01's GPUs; the main job spans both nodes on its half.
        jobs = [
            _job(rng, 0, main_id, teams[0], nodes=["node-01", "node-02"], gpus_per_node=2, gpu_offset=0),
            _job(rng, 1, f"g{seed}-{pair:04d}-b", teams[1], nodes=["node-01"], gpus_per_node=2, gpu_offset=2),
        ]
    else:
        n_nodes = 2 if kind in _NODE_FAULTS or rng.random() < 0.6 else 1
        jobs = [
            _job(
                rng,
                0,
                main_id,
                teams[0],
                nodes=[f"node-0{i + 1}" for i in range(n_nodes)],
                gpus_per_node=_GPUS,
            )
        ]
    main = jobs[0]
    twin = index % 2 == 1
    faults = _twin_faults(rng, kind, main) if twin else [_fault(rng, kind, main, colocated)]
    name = f"gen-{seed}-{index:04d}-{kind}" + ("-twin" if twin else "")
    return {
        "name": name,
        "description": (
            f"generated (seed {seed}, case {index}): "
            + (f"must-not-alert twin of {kind}" if twin else f"{kind}")
            + (", co-located jobs" if colocated else "")
        ),
        "duration": _DURATION_S,
        "cluster": {
            "name": f"gen{seed}",
            "nodes": 2,
            "gpus_per_node": _GPUS,
            "gpu_class": rng.choice(sorted(GPU_CLASSES)),
        },
        "telemetry": {
            "interval": "5s",
            "dataloader_samples": rng.random() < 0.3,
            "collective_samples": rng.random() < 0.3,
            "evaluation_events": rng.random() < 0.8,
        },
        "jobs": jobs,
        "faults": faults,
    }


def generate_mappings(n: int, seed: int) -> list[dict[str, Any]]:
    """`n` generated cases as scenario mappings (what a scenario YAML file holds), from `seed`."""
    if n < 0:
        raise ValueError("the number of generated cases cannot be negative")
    return [_case(seed, i) for i in range(n)]


def generate(n: int, seed: int) -> list[Scenario]:
    """`n` generated, validated scenarios from `seed`: fault cases and their must-not-alert twins."""
    return [scenario_from_mapping(m, f"{m['name']}.yaml") for m in generate_mappings(n, seed)]
