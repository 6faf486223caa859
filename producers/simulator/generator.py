"""Scenario generator: random clusters, jobs of 8 to 1,024 ranks, noise, co-location and faults, from a seed.

Cases come in pairs. Case 2k injects one fault (its label says which alert it must raise);
case 2k+1 is its *must-not-alert twin*: the same cluster and jobs with the fault replaced by
something harmless that looks like it (a rank 3% slower instead of a straggler, a long
checkpoint or evaluation instead of a stall or a hang, a short stall, corrected ECC errors, a
late evaluation, nothing at all), so every alert there is a false positive.

Pair k's class comes from a shuffled cycle over `GENERATED_FAULTS` (every class once per cycle
of pairs, so any run of 2 x len(GENERATED_FAULTS) cases covers them all); a class's variants
(busy or idle GPUs, before or after the first evaluation, with or without XID, a step or a ramp,
after the first or the second evaluation) alternate from one cycle to the next. The classes:

- the single faults of the catalogue (a throttled straggler of 1.25-1.9x, a slow data worker and
  slow storage, every other cycle in a DDP job whose all-reduce overlaps backward; network and
  InfiniBand degradation on one node of 2 to 128 nodes as a step or a ramp; a stall, numerical
  faults, XID, ECC, memory pressure, host OOM, a foreign process, failing checkpoints,
  contention), on jobs of 8 to 256 ranks (small ones most often, so a thousand cases stay quick);
- `rank_hang`: a rank hangs with its GPU busy or idle, before or after the run's first evaluation;
- `stall_steps`: every rank stops for 15-30 step times (a stall) / 5-10 (the twin: a blip), after
  the run's throughput has a history, so the step that spans it is judged too;
- `ecc_shared`: an uncorrectable ECC error with or without XID 48 on a node two teams share;
- `validation_stop`: evaluations stop after the run's first or second one;
- `boundaries`: healthy runs of 1,000 ranks (every fourth cycle; else 128) across evaluation and
  checkpoint boundaries (both cases must stay quiet);
- `late_watchdog`: a rank hangs and the NCCL watchdog on the other ranks times out 10 minutes later
  (`dependency_timeout`, then the job fails): the hang pages, its late consequences fold into it;
  twin: a long checkpoint where the hang would be;
- `startup_gap`: a run that compiles and loads for 1-4 minutes before its first step (twin: 20-40 s;
  both must stay quiet: start-up is not a stall);
- `checkpoint_in_step`: 4-6 s steps with a synchronous 20-45 s checkpoint every 90 s, carried by the
  step after it (both must stay quiet);
- `agent_pace`: healthy runs whose node agents sample every 3 s (twin: every 30 s; both quiet);
- `ddp_static`: a GPU 1.2-1.35x slow from the first step (a degraded card: no throttle, clock or
  power sign) in a DDP job whose all-reduce overlaps backward; twin: a rank 2-4 % slower.
- `workload_mix` (issue 35.6): two jobs of one workload family side by side on nodes of two GPU
  classes (the cluster's and another, `cluster.gpu_classes`) with two parallel layouts (TP=1 and
  TP=8, the TP=8 job's steps 1.2-1.5x longer); a straggler, memory pressure or a slow data worker
  hits one of them, alternating by cycle; twin: both healthy, one rank 2-4 % slower. Per-workload
  differences must neither hide the fault nor page the healthy job.

Each case is validated by the same loader as a YAML file and can be written as one.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

from producers.simulator.scenario import GPU_CLASSES, Scenario, scenario_from_mapping

__all__ = ["GENERATED_FAULTS", "generate", "generate_mappings"]

_TEAMS = ("llm-pretrain", "llm-research", "vision", "speech", "recsys")
_MODELS = (("llama-7b", 4096), ("llama-1b", 2048), ("vit-huge", 256), ("conformer-xl", 1500))
_DURATION_S = 420
_FAULT_START_S = (180, 220)  # after the detectors learned the job's normal (network: 4 windows)
_GPUS = 8  # GPUs per node
# Job sizes in nodes of 8 GPUs (8 to 256 ranks) with their weights: small jobs most often, so a
# thousand cases run in well under an hour (the engine's cost grows with a job's ranks).
_SIZES = ((1, 55), (2, 30), (4, 8), (8, 4), (16, 2), (32, 1))
# One degraded node among 2 to 128 nodes: the node counts network_degradation takes, one per
# cycle of classes (the largest, 1,024 ranks, once in 24 cycles: at cycle 11, so that 1,000 cases of
# 26 classes hold it); ib_degradation takes smaller ones.
_NETWORK_NODES = (2, 4, 2, 8, 2, 16, 4, 32, 2, 64, 8, 128, 2, 4, 2, 8, 2, 16, 4, 32, 2, 8, 4, 4)
_IB_NODES = (2, 4, 2, 8, 2, 16, 4, 2, 8, 2, 4, 16)
# Healthy runs over evaluation and checkpoint boundaries: 1,000 ranks every fourth cycle, else 128.
_BOUNDARY_NODES = (125, 16, 16, 16)
# Steps of a 5-30x stall: 15-30 step times is a stall (at least 90 s, 1.5x the 60 s allowed
# silence); 5-10 step times (at most 42 s, under 0.7x of it) is the twin's blip.
_STALL_STEP_S = (3.5, 6.0)

# The classes the generator draws (see the module doc). Rules that need more than a case's length
# to fire by definition (zombie grace, checkpoint age, pending limit, restart counting) are left to
# the hand-written scenarios.
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
    "rank_hang",
    "stall_steps",
    "ecc_shared",
    "validation_stop",
    "boundaries",
    "late_watchdog",
    "startup_gap",
    "checkpoint_in_step",
    "agent_pace",
    "ddp_static",
    "workload_mix",
)
_NODE_FAULTS = ("network_degradation", "ib_degradation", "storage_slowdown", "host_oom")
_GPU_FAULTS = ("xid_error", "ecc_uncorrectable", "gpu_memory_pressure", "foreign_process", "contention")
# Warm-up steps are slower (1 + 3 e^(-s/4) of a step for the first 10): this many step times extra.
_WARMUP_EXTRA_STEPS = 3.0 * sum(math.exp(-s / 4.0) for s in range(10))
_INIT_S = 10


def _weighted(rng: random.Random, table: tuple[tuple[int, int], ...]) -> int:
    """A value of `table` ((value, weight), ...) drawn by weight."""
    return rng.choices([v for v, _ in table], weights=[w for _, w in table])[0]


def _job(rng: random.Random, index: int, job_id: str, team: str, **placement: Any) -> dict[str, Any]:
    model, seq_len = rng.choice(_MODELS)
    ranks = len(placement["nodes"]) * placement["gpus_per_node"]
    # Big jobs take longer steps (and keep a thousand cases quick).
    low, high = (1.5, 2.5) if ranks < 256 else (2.5, 4.0)
    return {
        "id": job_id,
        "team": team,
        "owner": f"user{index}",
        "model_name": model,
        "model_version": f"v{rng.randint(1, 5)}",
        "seq_len": seq_len,
        "step_time": round(rng.uniform(low, high), 2),
        "step_noise": round(rng.uniform(0.02, 0.05), 3),
        "rank_jitter": round(rng.choice((0.0, rng.uniform(0.0, 0.02))), 3),
        "rank_speed_spread": round(rng.choice((0.0, rng.uniform(0.0, 0.03))), 3),
        "warmup_steps": 10,
        "init_time": _INIT_S,
        "checkpoint": {"every": "2m", "duration": "8s", "max_age": "30m"},
        "evaluation": {"every_steps": rng.choice((0, 150, 200)), "duration": f"{rng.randint(10, 25)}s"},
        **placement,
    }


def _nodes(n: int) -> list[str]:
    return [f"node-{i + 1:02d}" for i in range(n)]


def _placement(
    rng: random.Random, seed: int, pair: int, teams: list[str], n_nodes: int, colocated: bool
) -> list[dict[str, Any]]:
    """The main job on `n_nodes` nodes; co-located: it takes GPUs 0-3 of each, a second team's job GPUs 4-7 of node-01."""
    main_id = f"g{seed}-{pair:04d}-a"
    if colocated:
        half = _GPUS // 2
        n_nodes = max(2, n_nodes)  # at least 8 ranks on half nodes
        return [
            _job(rng, 0, main_id, teams[0], nodes=_nodes(n_nodes), gpus_per_node=half, gpu_offset=0),
            _job(
                rng,
                1,
                f"g{seed}-{pair:04d}-b",
                teams[1],
                nodes=_nodes(1),
                gpus_per_node=half,
                gpu_offset=half,
            ),
        ]
    return [_job(rng, 0, main_id, teams[0], nodes=_nodes(n_nodes), gpus_per_node=_GPUS)]


def _world(job: dict[str, Any]) -> int:
    return len(job["nodes"]) * int(job["gpus_per_node"])


def _fault(
    rng: random.Random, kind: str, job: dict[str, Any], colocated: bool, ramped: bool
) -> dict[str, Any]:
    start = rng.randint(*_FAULT_START_S)
    fault: dict[str, Any] = {"type": kind, "job": job["id"], "start": start}
    nodes, gpus = job["nodes"], job["gpus_per_node"]
    offset = job.get("gpu_offset", 0)
    world = _world(job)
    # On a shared node, hit the node the jobs share so the fault reaches both teams.
    node = nodes[0] if colocated else rng.choice(nodes)
    gpu = offset + rng.randrange(gpus)
    if kind == "straggler_gpu":
        fault |= {
            "rank": rng.randrange(world),
            "magnitude": round(rng.uniform(1.25, 1.9), 2),
            "ramp": rng.choice((0, 30, 60)),
            "duration": 150,
            "variant": rng.choice(("thermal", "power")),
        }
    elif kind == "slow_data_worker":
        fault |= {"rank": rng.randrange(world), "magnitude": round(rng.uniform(0.6, 1.0), 2), "duration": 150}
    elif kind in ("network_degradation", "ib_degradation"):
        fault |= {
            "node": node,
            "magnitude": round(rng.uniform(2.0, 2.6), 2),
            # A step, or a port that degrades over 30-120 s (due once at full strength).
            "ramp": rng.randint(30, 120) if ramped else 0,
            "duration": 240 if ramped else 150,
        }
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
        job["slow_ranks"] = {rng.randrange(_world(job)): round(rng.uniform(1.02, 1.04), 3)}
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


class _Case:
    """What one case is made of, before it becomes a scenario mapping."""

    def __init__(self, rng: random.Random, seed: int, pair: int, cycle: int, twin: bool) -> None:
        self.rng, self.seed, self.pair, self.cycle, self.twin = rng, seed, pair, cycle, twin
        self.duration = _DURATION_S
        self.telemetry: dict[str, Any] = {}
        self.jobs: list[dict[str, Any]] = []
        self.faults: list[dict[str, Any]] = []
        self.notes: list[str] = []
        self.gpu_class = ""  # the cluster's GPU class (set before the builder runs)
        self.cluster: dict[str, Any] = {}  # extra cluster keys a builder sets (`gpu_classes`)

    @property
    def main(self) -> dict[str, Any]:
        return self.jobs[0]

    def place(self, n_nodes: int, colocated: bool) -> None:
        teams = self.rng.sample(_TEAMS, 2)
        self.jobs = _placement(self.rng, self.seed, self.pair, teams, n_nodes, colocated)
        if colocated:
            self.notes.append("co-located jobs")
        self.notes.append(f"{_world(self.main)} ranks")


def _classic(case: _Case, kind: str) -> None:
    """A fault of the catalogue on a job of 8 to 256 ranks (network: 2 to 128 nodes), its twin as before."""
    rng = case.rng
    colocated = rng.random() < 0.3
    if kind == "network_degradation":
        n_nodes = _NETWORK_NODES[case.cycle % len(_NETWORK_NODES)]
    elif kind == "ib_degradation":
        n_nodes = _IB_NODES[case.cycle % len(_IB_NODES)]
    else:
        n_nodes = _weighted(rng, _SIZES)
        if kind in _NODE_FAULTS:
            n_nodes = max(2, n_nodes)
    case.place(n_nodes, colocated)
    ramped = kind in ("network_degradation", "ib_degradation") and case.cycle % 2 == 1
    if kind in ("straggler_gpu", "slow_data_worker", "storage_slowdown") and case.cycle % 2 == 1:
        # DDP: the all-reduce overlaps backward, so the peers wait for a slow rank inside their
        # backward, not in a timed collective (the twin too: a rank 2-4 % slower stays quiet).
        case.main["comm_overlap"] = True
        case.notes.append("DDP (all-reduce overlaps backward)")
    if case.twin:
        case.faults = _twin_faults(rng, kind, case.main)
    else:
        case.faults = [_fault(rng, kind, case.main, colocated, ramped)]
        if ramped:
            case.notes.append("ramped")


def _rank_hang(case: _Case, _: str) -> None:
    """A rank hangs, GPU busy or idle, before or after the first evaluation; twin: a long evaluation or checkpoint."""
    rng = case.rng
    case.place(_weighted(rng, _SIZES), False)
    job = case.main
    busy = case.cycle % 2 == 0
    before = (case.cycle // 2) % 2 == 0
    events = rng.random() < 0.5
    case.telemetry["evaluation_events"] = events
    start = rng.randint(*_FAULT_START_S)
    st = float(job["step_time"])
    if before:
        # The first evaluation is due after the hang: 150+ steps of >= 1.5 s from a 10 s start.
        job["evaluation"] = {"every_steps": rng.randint(150, 200), "duration": f"{rng.randint(10, 25)}s"}
    else:
        # The first evaluation ends before the hang: 60-100 s of steps from a 10 s start.
        job["evaluation"] = {
            "every_steps": round(rng.uniform(60, 100) / st),
            "duration": f"{rng.randint(10, 25)}s",
        }
    case.notes += [
        f"GPUs {'busy' if busy else 'idle'}",
        f"{'before' if before else 'after'} the first evaluation",
        "evaluation events" if events else "ValidationResult only",
    ]
    if not case.twin:
        rank = rng.randrange(_world(job))
        case.faults = [
            {
                "type": "rank_hang",
                "job": job["id"],
                "rank": rank,
                "start": start,
                "gpus": "busy" if busy else "idle",
            }
        ]
        return
    if busy:
        # A long evaluation where the hang would be: the GPUs keep computing, no step for minutes.
        if before:
            steps = max(20, round((start - _INIT_S) / st - _WARMUP_EXTRA_STEPS))
            job["evaluation"] = {"every_steps": steps, "duration": f"{rng.randint(120, 200)}s"}
        else:
            every = round(rng.uniform(60, 100) / st)
            job["evaluation"] = {"every_steps": every, "duration": f"{rng.randint(60, 120)}s"}
    else:
        # A long checkpoint where the hang would be: the GPUs wait, the checkpoint is open.
        case.faults = [{"type": "long_checkpoint", "job": job["id"], "start": start, "duration": 150}]


def _stall_steps(case: _Case, _: str) -> None:
    """Every rank stops for 15-30 step times (twin: 5-10) once the run's throughput has a history."""
    rng = case.rng
    case.place(min(32, _weighted(rng, _SIZES)), rng.random() < 0.3)
    job = case.main
    st = round(rng.uniform(*_STALL_STEP_S), 2)
    job["step_time"] = st
    job["evaluation"] = {"every_steps": 0, "duration": "10s"}
    # Six 60 s windows of history before the stall (two of warm-up, four normal), so the step that
    # spans it is judged against the run's own normal.
    start = rng.randint(400, 460)
    if case.twin:
        times = rng.randint(5, min(10, math.floor(42 / st)))
        kind = "stall_blip"
    else:
        times = rng.randint(max(15, math.ceil(90 / st)), 30)
        kind = "job_stall"
    stall = round(times * st, 1)
    case.faults = [{"type": kind, "job": job["id"], "start": start, "duration": stall}]
    case.duration = int(start + stall + 300)
    case.notes.append(f"{times}x the {st} s step ({stall} s)")


def _ecc_shared(case: _Case, _: str) -> None:
    """An uncorrectable ECC error, with or without XID 48, on the node two teams share; twin: corrected errors."""
    rng = case.rng
    case.place(_weighted(rng, _SIZES), True)
    job = case.main
    gpu = rng.randrange(job["gpus_per_node"])
    with_xid = case.cycle % 2 == 0
    start = rng.randint(*_FAULT_START_S)
    where = {"job": job["id"], "node": job["nodes"][0], "gpu": gpu, "start": start}
    if case.twin:
        case.faults = [{"type": "ecc_correctable", **where, "count": rng.randint(1, 8)}]
    else:
        case.faults = [{"type": "ecc_uncorrectable", **where, "count": 1, "xid": 48 if with_xid else None}]
    case.notes.append("with XID 48" if with_xid else "without XID")


def _validation_stop(case: _Case, _: str) -> None:
    """Evaluations stop after the run's first or second one; twin: one runs late, within tolerance, or none."""
    rng = case.rng
    case.place(min(8, _weighted(rng, _SIZES)), False)
    job = case.main
    st = round(rng.uniform(2.0, 2.5), 2)
    every = rng.randint(30, 40)
    dur = rng.randint(3, 6)
    job.update(step_time=st, evaluation={"every_steps": every, "duration": f"{dur}s"})
    job["checkpoint"] = {"every": "10m", "duration": "8s", "max_age": "30m"}  # no pause before the case ends
    case.telemetry["evaluation_events"] = rng.random() < 0.5
    after = 1 + case.cycle % 2
    # Halfway between the `after`-th evaluation and the next one due (the steps run from 0).
    half = (after + 0.5) * every
    start = round(_INIT_S + (half + _WARMUP_EXTRA_STEPS) * st + after * dur)
    period = every * st
    case.duration = int(start + 2 * period + 60)
    case.notes.append(f"after evaluation {after} (every {every} steps)")
    if not case.twin:
        case.faults = [{"type": "validation_missing", "job": job["id"], "start": start}]
    elif case.cycle % 4 < 2:
        case.faults = [{"type": "validation_late", "job": job["id"], "start": start, "magnitude": 0.3}]


def _boundaries(case: _Case, _: str) -> None:
    """A healthy 1,000-rank (or 128-rank) run over evaluation and checkpoint boundaries: both cases must stay quiet."""
    rng = case.rng
    case.place(_BOUNDARY_NODES[case.cycle % len(_BOUNDARY_NODES)], False)
    job = case.main
    st = round(rng.uniform(6.0, 8.0), 2)
    job["step_time"] = st
    # Six windows of history first (two of warm-up, four normal), then an evaluation; checkpoints
    # every 4 minutes.
    job["evaluation"] = {
        "every_steps": round(rng.randint(330, 370) / st),
        "duration": f"{rng.randint(20, 50)}s",
    }
    job["checkpoint"] = {"every": "4m", "duration": f"{rng.randint(15, 40)}s", "max_age": "30m"}
    case.duration = 540
    case.telemetry |= {
        "interval": "15s",
        "dataloader_samples": False,
        "collective_samples": False,
        "evaluation_events": not case.twin,  # the twin: a producer that sends only ValidationResult
    }
    case.notes.append("evaluation and checkpoint boundaries")


def _late_watchdog(case: _Case, _: str) -> None:
    """A rank hangs; 10 minutes later the other ranks' NCCL watchdog times out and the job fails.
    The twin: a long checkpoint where the hang would be."""
    rng = case.rng
    case.place(min(2, _weighted(rng, _SIZES)), False)
    job = case.main
    job["evaluation"] = {"every_steps": 0, "duration": "10s"}
    start = rng.randint(*_FAULT_START_S)
    watchdog = 600
    case.duration = start + watchdog + 120
    if case.twin:
        case.faults = [{"type": "long_checkpoint", "job": job["id"], "start": start, "duration": 150}]
        return
    rank = rng.randrange(_world(job))
    gpus = "busy" if case.cycle % 2 == 0 else "idle"
    case.faults = [
        {
            "type": "rank_hang",
            "job": job["id"],
            "rank": rank,
            "start": start,
            "duration": watchdog,
            "gpus": gpus,
        }
    ]
    case.notes.append(f"watchdog timeout after {watchdog} s, GPUs {gpus}")


def _startup_gap(case: _Case, _: str) -> None:
    """A run that takes 1-4 minutes (twin: 20-40 s) from launch to its first step: both quiet."""
    rng = case.rng
    case.place(min(4, _weighted(rng, _SIZES)), False)
    init = rng.randint(20, 40) if case.twin else rng.randint(60, 240)
    case.main["init_time"] = init
    case.duration = init + 300
    case.notes.append(f"{init} s to the first step")


def _checkpoint_in_step(case: _Case, _: str) -> None:
    """4-6 s steps; a synchronous 20-45 s checkpoint every 90 s, carried by the next step: both quiet."""
    rng = case.rng
    case.place(min(4, _weighted(rng, _SIZES)), False)
    job = case.main
    job["step_time"] = round(rng.uniform(4.0, 6.0), 2)
    job["evaluation"] = {"every_steps": 0, "duration": "10s"}
    job["checkpoint"] = {"every": "90s", "duration": f"{rng.randint(20, 45)}s", "max_age": "30m"}
    case.duration = 600
    case.notes.append("90 s checkpoints inside steps")


def _agent_pace(case: _Case, _: str) -> None:
    """Node agents that sample every 3 s (twin: every 30 s) on a healthy run: both quiet."""
    rng = case.rng
    case.place(max(2, min(4, _weighted(rng, _SIZES))), False)
    case.telemetry["interval"] = "30s" if case.twin else "3s"
    case.notes.append(f"agents every {case.telemetry['interval']}")


def _ddp_static(case: _Case, _: str) -> None:
    """A GPU slow from the first step, with no throttle sign, under DDP; twin: a rank 2-4 % slower."""
    rng = case.rng
    case.place(_weighted(rng, _SIZES), False)
    job = case.main
    job["comm_overlap"] = True
    rank = rng.randrange(_world(job))
    case.notes.append("DDP (all-reduce overlaps backward), slow from the start")
    if case.twin:
        job["slow_ranks"] = {rank: round(rng.uniform(1.02, 1.04), 3)}
        return
    case.faults = [
        {
            "type": "straggler_gpu",
            "job": job["id"],
            "rank": rank,
            "start": 0,
            "magnitude": round(rng.uniform(1.2, 1.35), 2),
            "variant": "degraded",
        }
    ]


_MIX_FAULTS = ("straggler_gpu", "gpu_memory_pressure", "slow_data_worker")


def _workload_mix(case: _Case, _: str) -> None:
    """Two jobs of one family on two GPU classes and two layouts; a fault on one (twin: none)."""
    rng = case.rng
    n = max(1, min(2, _weighted(rng, _SIZES)))
    teams = rng.sample(_TEAMS, 2)
    seed, pair = case.seed, case.pair
    first = _job(rng, 0, f"g{seed}-{pair:04d}-a", teams[0], nodes=_nodes(n), gpus_per_node=_GPUS)
    second_nodes = [f"node-{i + 1:02d}" for i in range(n, 2 * n)]
    second = _job(rng, 1, f"g{seed}-{pair:04d}-b", teams[1], nodes=second_nodes, gpus_per_node=_GPUS)
    model, seq_len = rng.choice(_MODELS)
    family = f"{model}-pretrain"
    for job in (first, second):
        job.update(model_name=model, seq_len=seq_len, workload_family=family)
    second["tensor_parallel"] = 8
    second["step_time"] = round(float(first["step_time"]) * rng.uniform(1.2, 1.5), 2)
    other = sorted(c for c in GPU_CLASSES if c != case.gpu_class)
    second_class = other[case.cycle % len(other)]
    case.cluster["gpu_classes"] = dict.fromkeys(second_nodes, second_class)
    case.jobs = [first, second]
    case.notes += [
        f"one family on {case.gpu_class} (TP=1) and {second_class} (TP=8)",
        f"{2 * n * _GPUS} ranks",
    ]
    target = (first, second)[(case.cycle // len(_MIX_FAULTS)) % 2]
    if case.twin:
        target["slow_ranks"] = {rng.randrange(_world(target)): round(rng.uniform(1.02, 1.04), 3)}
        return
    kind = _MIX_FAULTS[case.cycle % len(_MIX_FAULTS)]
    case.faults = [_fault(rng, kind, target, False, False)]
    case.notes.append(f"{kind} on the {'TP=8' if target is second else 'TP=1'} job")


_BUILDERS: dict[str, Callable[[_Case, str], None]] = {
    "ddp_static": _ddp_static,
    "late_watchdog": _late_watchdog,
    "startup_gap": _startup_gap,
    "checkpoint_in_step": _checkpoint_in_step,
    "agent_pace": _agent_pace,
    "rank_hang": _rank_hang,
    "stall_steps": _stall_steps,
    "ecc_shared": _ecc_shared,
    "validation_stop": _validation_stop,
    "boundaries": _boundaries,
    "workload_mix": _workload_mix,
}


def _class_of(seed: int, pair: int) -> tuple[str, int]:
    """Pair `pair`'s class and its cycle: every class once per cycle, in a shuffled order."""
    cycle, pos = divmod(pair, len(GENERATED_FAULTS))
    order = list(GENERATED_FAULTS)
    random.Random(f"{seed}/cycle/{cycle}").shuffle(order)
    return order[pos], cycle


def _case(seed: int, index: int) -> dict[str, Any]:
    pair = index // 2
    kind, cycle = _class_of(seed, pair)
    rng = random.Random(f"{seed}/generated/{pair}")
    twin = index % 2 == 1
    case = _Case(rng, seed, pair, cycle, twin)
    gpu_class = rng.choice(sorted(GPU_CLASSES))
    case.gpu_class = gpu_class
    telemetry = {
        "interval": "5s",
        "dataloader_samples": rng.random() < 0.3,
        "collective_samples": rng.random() < 0.3,
        "evaluation_events": rng.random() < 0.8,
    }
    _BUILDERS.get(kind, _classic)(case, kind)
    name = f"gen-{seed}-{index:04d}-{kind}" + ("-twin" if twin else "")
    nodes = len({node for j in case.jobs for node in j["nodes"]})  # node-01.. up to the last one used
    return {
        "name": name,
        "description": (
            f"generated (seed {seed}, case {index}): "
            + (f"must-not-alert twin of {kind}" if twin else f"{kind}")
            + "".join(f", {note}" for note in case.notes)
        ),
        "duration": case.duration,
        "cluster": {"name": f"gen{seed}", "nodes": nodes, "gpus_per_node": _GPUS, "gpu_class": gpu_class}
        | case.cluster,
        "telemetry": telemetry | case.telemetry,
        "jobs": case.jobs,
        "faults": case.faults,
    }


def generate_mappings(n: int, seed: int) -> list[dict[str, Any]]:
    """`n` generated cases as scenario mappings (what a scenario YAML file holds), from `seed`."""
    if n < 0:
        raise ValueError("the number of generated cases cannot be negative")
    return [_case(seed, i) for i in range(n)]


def generate(n: int, seed: int) -> list[Scenario]:
    """`n` generated, validated scenarios from `seed`: fault cases and their must-not-alert twins."""
    return [scenario_from_mapping(m, f"{m['name']}.yaml") for m in generate_mappings(n, seed)]
