"""The job pass: one job walked through pending, runs, steps, faults, restarts and its end.

Checkpoints and restore tests live in `checkpoints`, evaluations in `evaluations`; this module
is the step loop and the lifecycle around it.
"""

from __future__ import annotations

import hashlib
import math
import random
from typing import TYPE_CHECKING

from producers.simulator.checkpoints import checkpoint, restore_tests
from producers.simulator.common import (
    _BLOCKED,
    _BWD,
    _COMM,
    _COMPUTE,
    _CRASH_DETAILS,
    _CRASH_FAULTS,
    _CRASH_TEXT,
    _DATA,
    _DDP_TAIL,
    _FWD,
    _HUNG,
    _LOADER_FAULTS,
    _NEVER,
    _OPT,
    _SPIN,
    _Effect,
    _end_of,
    _extra_at,
    _Holding,
    _lognormal,
    _magnitude_at,
    _Rank,
)
from producers.simulator.evaluations import evaluate, evaluation_due
from producers.simulator.faults import FAULTS
from producers.simulator.scenario import FaultSpec, JobSpec

if TYPE_CHECKING:
    from producers.simulator.engine import Engine


__all__ = ["JobRun"]


class JobRun:
    """Walks one job through pending, runs, steps, checkpoints, evaluations and its faults."""

    def __init__(self, engine: Engine, job: JobSpec) -> None:
        self.e = engine
        self.job = job
        self.rng = engine._rng(f"job/{job.id}")
        self.layout = engine.layouts[job.id]
        self.limit = min(job.end if job.end is not None else _NEVER, engine.sc.duration)
        self.run_index = 0
        self.run_id = f"{job.id}-r0"
        self.restart_count = 0
        self.step = 0
        self.steps_in_run = 0
        self.last_finish: float | None = None
        self.pending_ckpt_s = 0.0
        self.spike_steps_left: dict[int, int] = {}
        self.pending_data_s = 0.0
        self.last_verified: tuple[str, int] | None = None
        self.last_verified_at: float | None = None
        self.retained: list[str] = []  # checkpoint ids retention keeps, oldest first (issue 23)
        self.unverified: list[str] = []  # completed since the last verified checkpoint, not verified
        self.ckpt_stuck = False
        self.last_eval_s: float | None = None
        self.live: list[_Holding] = []
        # Looked up or drawn on first use (`checkpoints`, `evaluations`): scenarios without the
        # faults that need them draw nothing more.
        self._restore_faults: list[tuple[str, tuple[int, FaultSpec]]] | None = None
        self._late_at: int | None = None
        self._val_rng: random.Random | None = None
        dp = max(1, job.world_size // (job.tensor_parallel * job.pipeline_parallel))
        self.samples = max(1, job.global_batch_size // dp)
        data0 = job.step_time * job.data_wait_fraction
        comm0 = job.step_time * job.comm_fraction
        self.base = (data0, job.step_time - data0 - comm0, comm0)
        self._rank_noise()

    def _rank_noise(self) -> None:
        """Per-rank character: a persistent speed and an own jitter, from their own random stream.

        Drawn only when the job asks for them, so scenarios without them keep their exact output.
        """
        job = self.job
        self.rank_speed = [job.slow_ranks.get(r, 1.0) for r in range(job.world_size)]
        self.rank_jitter: list[float] | None = None
        self.rank_rng = self.e._rng(f"ranks/{job.id}")
        if job.rank_speed_spread > 0:
            self.rank_speed = [
                s * (1.0 + self.rank_rng.uniform(0, job.rank_speed_spread)) for s in self.rank_speed
            ]
        if job.rank_jitter > 0:
            self.rank_jitter = [
                job.rank_jitter * self.rank_rng.uniform(0.5, 1.5) for _ in range(job.world_size)
            ]

    def _state(self, t: float, state: str, reason: str | None = None, exit_code: int | None = None) -> None:
        self.e.emit(
            t,
            "JobStateChanged",
            job_id=self.job.id,
            run_id=self.run_id,
            state=state,
            reason=reason,
            exit_code=exit_code,
            restart_count=self.restart_count,
            owner=self.job.owner,
            team=self.job.team,
            cluster=self.e.sc.cluster.name,  # as a scheduler source names it, before any JobStarted
        )

    def _start_run(self, t: float) -> float:
        """JobStarted, running, one RankBound per rank; returns when the first step starts."""
        job, e = self.job, self.e
        e.emit(
            t,
            "JobStarted",
            job_id=job.id,
            run_id=self.run_id,
            owner=job.owner,
            team=job.team,
            cluster=e.sc.cluster.name,
            model_name=job.model_name,
            model_version=job.model_version,
            dataset_version=job.dataset_version,
            workload_family=job.family,
            world_size=job.world_size,
            nodes=self._listed_nodes(),
            data_parallel=max(1, job.world_size // (job.tensor_parallel * job.pipeline_parallel)),
            tensor_parallel=job.tensor_parallel,
            pipeline_parallel=job.pipeline_parallel,
            global_batch_size=job.global_batch_size,
            seq_len=job.seq_len,
            gpu_class=e.sc.cluster.class_of(job.nodes[0]),
            checkpoint_max_age_s=job.checkpoint.max_age,
            checkpoint_timeout_s=job.checkpoint.timeout,
            target_steps=job.total_steps,
            labels=dict(job.labels),
        )
        self._state(t + 0.05, "running", reason="scheduled" if self.restart_count == 0 else "restarted")
        base_pid = self.rng.randint(10_000, 90_000)
        mem = int(e.sc.cluster.gpu_of(job.nodes[0]).memory_bytes * 0.78)
        self.live = []
        for r in self.layout:
            bound = t + 1.0 + self.rng.uniform(0, 2.0)
            pid = base_pid + r.local_rank * 7 + self.rng.randint(0, 3)
            e.emit(
                bound,
                "RankBound",
                job_id=job.id,
                run_id=self.run_id,
                rank=r.rank,
                local_rank=r.local_rank,
                node=r.node,
                gpu_index=r.gpu_index,
                gpu_uuid=r.gpu_uuid,
                pid=pid,
            )
            h = _Holding(
                bound, _NEVER, pid, job.id, self.run_id, r.rank, int(mem * (1 + self.rng.gauss(0, 0.01)))
            )
            e.holdings.setdefault((r.node, r.gpu_index), []).append(h)
            self.live.append(h)
        self.steps_in_run = 0
        return t + max(job.init_time, 4.0)

    def _listed_nodes(self) -> list[str]:
        """The job's node list as JobStarted reports it: a stale list names another host, some sites use FQDNs."""
        nodes = list(self.job.nodes)
        for i, f in self.e._faults(self.job.id, "rank_outside_nodes", "node_list_fqdn"):
            if f.type == "node_list_fqdn":
                nodes = [f"{n}.{self.e.sc.cluster.name}.internal" for n in nodes]
            else:
                missing = self.e.targets[i][0]
                nodes = [f"{self.e.sc.cluster.node_prefix}99" if n == missing else n for n in nodes]
            self.e.effects.setdefault(i, _Effect(max(f.start, self.job.start), f.end, {"listed": nodes}))
        return nodes

    def _release(self, t: float) -> None:
        for h in self.live:
            h.end = min(h.end, t)
        self.live = []

    def run(self) -> None:
        job, e = self.job, self.e
        t = job.start
        pending = self._one("long_pending")
        self._state(t, "pending", reason="waiting for resources")
        if pending is not None:
            i, f = pending
            wait = f.duration if f.duration is not None else e.sc.duration
            e.effects[i] = _Effect(t, t + wait, {})
        else:
            wait = self.rng.uniform(3.0, 20.0)
        t += wait
        if t >= self.limit:
            return
        t = self._start_run(t)
        self.next_ckpt = t + job.checkpoint.every
        self._loop(t)

    def _one(self, fault_type: str) -> tuple[int, FaultSpec] | None:
        found = self.e._faults(self.job.id, fault_type)
        return found[0] if found else None

    def _batch_fingerprint(self, rank: int, step: int, t: float) -> str:
        """What the SDK's `wrap_loader` would hash: one batch per rank and step, unless a data fault repeats some."""
        faults = getattr(self, "_data_faults", None)
        if faults is None:  # looked up once per job: this runs for every rank of every step
            faults = self._data_faults = self.e._faults(self.job.id, "repeated_batches", "epoch_replay")
        key = str(step)  # a resumed run reads the same data at the same steps
        for i, f in faults:
            if not f.start <= t < _end_of(f) or (f.rank is not None and f.rank != rank):
                continue
            n = max(1, int(f.magnitude or 1))
            key = f"stuck{step % n}" if f.type == "repeated_batches" else f"epoch{step % n}"
            self.e.effects.setdefault(i, _Effect(t, f.end, {"distinct_batches": n}))
        return hashlib.blake2b(f"{self.job.id}/{rank}/{key}".encode(), digest_size=8).hexdigest()

    def _loop(self, t: float) -> None:
        job, e = self.job, self.e
        hang = self._one("rank_hang")
        stall = self._one("job_stall") or self._one("stall_blip")  # a blip is a stall too short to report
        zombie = self._one("zombie")
        long_ckpt = self._one("long_checkpoint")
        failing = self._one("checkpoint_failure")
        stuck = self._one("checkpoint_never_completes")
        restart = self._one("restart_loop")
        crashes: list[float] = []
        if restart is not None:
            every = float(restart[1].params["every"])
            crashes = [restart[1].start + k * every for k in range(int(restart[1].params["restarts"]))]
        # Issue 23: one rank fails once (an exception, CUDA OOM, a storage timeout...), or exits cleanly.
        rank_events = sorted(
            (f.start, i, f) for i, f in self.e._faults(job.id, *_CRASH_FAULTS, "rank_exit_clean")
        )
        stall_done = long_done = stuck_done = False
        while t < self.limit:
            if crashes and t >= crashes[0]:
                assert restart is not None
                crashes.pop(0)
                t = self._crash_and_restart(t, restart[0], last=not crashes)
                continue
            if rank_events and t >= rank_events[0][0]:
                _, i, f = rank_events.pop(0)
                assert f.rank is not None
                victim = self.layout[f.rank]
                if f.type == "rank_exit_clean":
                    e.emit(
                        t, "RankFault", job_id=job.id, run_id=self.run_id, rank=victim.rank, node=victim.node,
                        kind="exit", detail="worker finished: exitcode 0", exit_code=0,
                    )  # fmt: skip
                    e.effects[i] = _Effect(t, t, {})
                    continue
                kind = "storage_timeout" if f.type == "storage_timeout" else str(f.params["kind"])
                t = self._crash_and_restart(t, i, last=True, victim=victim, kind=kind)
                continue
            if hang is not None and t >= hang[1].start:
                self._hang(t, *hang)
                return
            if zombie is not None and t >= zombie[1].start:
                at = self.last_finish if self.last_finish is not None else t
                e.effects[zombie[0]] = _Effect(at, None, {"last_step": self.step - 1})
                return  # processes keep their GPUs: holdings stay open to the end
            if stall is not None and not stall_done and t >= stall[1].start:
                stall_done = True
                i, f = stall
                at = self.last_finish if self.last_finish is not None else t
                resume = _end_of(f)
                e.effects[i] = _Effect(at, None if resume == _NEVER else resume, {"last_step": self.step - 1})
                if resume >= self.limit:
                    return
                # The step in flight waits for its data through the whole stall, then completes.
                self.pending_data_s += resume - t
            if long_ckpt is not None and not long_done and t >= long_ckpt[1].start:
                long_done = True
                i, f = long_ckpt
                dur = f.duration if f.duration is not None else 300.0
                started, done = checkpoint(self, t, dur, "ok")
                e.effects[i] = _Effect(started, done, {"checkpoint_duration_s": dur})
                self.next_ckpt = t + job.checkpoint.every
            elif stuck is not None and not stuck_done and t >= stuck[1].start:
                stuck_done = True
                i, f = stuck
                checkpoint(self, t, job.checkpoint.duration, "stuck", stuck_until=f.end)
                e.effects[i] = _Effect(t, f.end, {})
                self.next_ckpt = t + job.checkpoint.every
            elif (
                failing is not None
                and failing[1].start <= t < _end_of(failing[1])
                and (t >= self.next_ckpt or failing[0] not in e.effects)
            ):
                i, f = failing
                _, failed_at = checkpoint(
                    self, t, job.checkpoint.duration, "failed", error=str(f.params["error"])
                )
                eff = e.effects.setdefault(i, _Effect(t, failed_at, {"failed_checkpoints": 0}))
                eff.end = failed_at
                eff.detail["failed_checkpoints"] += 1
                self.next_ckpt = t + job.checkpoint.every
            elif t >= self.next_ckpt:
                if not (self.ckpt_stuck and stuck is not None and t < _end_of(stuck[1])):
                    checkpoint(self, t, job.checkpoint.duration * _lognormal(self.rng, 0.1), "ok")
                self.next_ckpt = t + job.checkpoint.every
            t = self._step(t)
            restore_tests(self, t)
            ev = job.evaluation
            if ev.every_steps and evaluation_due(self, t) and t < self.limit:
                t = evaluate(self, t)
        if job.end is not None and job.end <= e.sc.duration:
            self._state(job.end, "completed", reason="training finished", exit_code=0)
            self._release(job.end + 1.0)

    def _rank_factors(self) -> list[float]:
        """Each rank's own compute factor for this step: its persistent speed times its own jitter."""
        if self.rank_jitter is None:
            return list(self.rank_speed)
        return [
            speed * _lognormal(self.rank_rng, sigma)
            for speed, sigma in zip(self.rank_speed, self.rank_jitter, strict=True)
        ]

    def _node_faults(self, t: float, extra_data: list[float]) -> float:
        """Faults of a node hit every job on it (co-located jobs too): IB, storage. Returns the net factor."""
        e, job = self.e, self.job
        net = 1.0
        for i, f in enumerate(e.sc.faults):
            if f.type not in ("ib_degradation", "storage_slowdown") or not f.start <= t < _end_of(f):
                continue
            node = e.targets[i][0]
            if node not in job.nodes:
                continue
            e.effects.setdefault(i, _Effect(t, f.end, {}))
            if f.type == "ib_degradation":
                if len(job.nodes) > 1:  # a job on one node talks over NVLink, not the IB port
                    net *= _magnitude_at(f, t, 2.0)
            else:
                extra = _extra_at(f, t, 0.6) * job.step_time
                for r in self.layout:
                    if r.node == node:
                        extra_data[r.rank] += extra * _lognormal(self.rng, 0.1)
        return net

    def _loader_waits(self, t: float, extra_data: list[float]) -> None:
        """The extra data wait of the ranks whose loader a data-path fault (issue 23) slows."""
        e, job = self.e, self.job
        for i, f in enumerate(e.sc.faults):
            if f.job != job.id or f.type not in _LOADER_FAULTS or not f.start <= t < _end_of(f):
                continue
            extra = float(f.params.get("extra_wait") or 0.0) * job.step_time
            if extra <= 0:
                continue
            node = e.targets[i][0]
            for r in self.layout:
                if r.rank == f.rank or (f.rank is None and FAULTS[f.type].scope == "node" and r.node == node):
                    extra_data[r.rank] += extra

    def _skips(self, t: float, step: int) -> bool:
        """Whether a skip_steps fault skips this step: every round(1/magnitude)-th one, never two in a row."""
        for i, f in self._active("skip_steps", t) + self._active("skip_steps_rare", t):
            every = max(2, round(1.0 / (f.magnitude or 0.2)))
            self.e.effects.setdefault(i, _Effect(t, f.end, {"every_steps": every}))
            if step % every == 0:
                return True
        return False

    def _active(self, fault_type: str, t: float) -> list[tuple[int, FaultSpec]]:
        return [(i, f) for i, f in self.e._faults(self.job.id, fault_type) if f.start <= t < _end_of(f)]

    def _step(self, t: float) -> float:
        """One synchronous step of every rank starting at `t`; returns when it ended."""
        job, e, rng = self.job, self.e, self.rng
        noise = job.step_noise
        data0, compute0, comm0 = self.base
        warm = 1.0 + 3.0 * math.exp(-self.steps_in_run / 4.0) if self.steps_in_run < job.warmup_steps else 1.0
        slow = 1.0
        for i, f in self._active("throughput_regression", t):
            slow *= _magnitude_at(f, t, 1.3)
            e.effects.setdefault(i, _Effect(t, f.end, {}))
        net = 1.0
        for _, f in self._active("network_degradation", t):
            net *= _magnitude_at(f, t, 2.0)
        compute_factor = self._rank_factors()
        for i, f in self._active("contention", t):
            # The foreign process takes GPU time from the job's kernels: compute expands, every rank alike.
            m = _magnitude_at(f, t, 2.0)
            compute_factor = [c * m for c in compute_factor]
            e.effects.setdefault(i, _Effect(t, f.end, {}))
        for i, f in self._active("straggler_gpu", t):
            assert f.rank is not None
            compute_factor[f.rank] *= _magnitude_at(f, t, 1.5)
            e.effects.setdefault(i, _Effect(t, f.end, {}))
        extra_data = [0.0] * job.world_size
        for i, f in self._active("slow_data_worker", t):
            assert f.rank is not None
            extra_data[f.rank] += _extra_at(f, t, 0.5) * job.step_time * _lognormal(rng, 0.15)
            e.effects.setdefault(i, _Effect(t, f.end, {}))
        net *= self._node_faults(t, extra_data)
        self._loader_waits(t, extra_data)
        content = _lognormal(rng, noise)  # the step's work, the same for every rank (same shapes)
        ckpt_s, self.pending_ckpt_s = self.pending_ckpt_s, 0.0
        stalled_s, self.pending_data_s = self.pending_data_s, 0.0
        segs = []
        for r in self.layout:
            data = data0 * slow * _lognormal(rng, 0.25) + extra_data[r.rank] + stalled_s
            compute = compute0 * slow * warm * content * _lognormal(rng, noise * 0.4) * compute_factor[r.rank]
            segs.append((data, compute))
        ready = max(d + c for d, c in segs)
        coll = comm0 * slow * net * _lognormal(rng, noise)
        overlap = job.comm_overlap
        if overlap:
            # DDP: buckets are reduced while backward runs; the last one's gradients leave when
            # the slowest rank's backward ends, and only a tail of the all-reduce is exposed.
            grads = max(d + c * (_FWD + _BWD) for d, c in segs)
            coll *= _DDP_TAIL
            ready = max(grads + coll + c * _OPT for _, c in segs) - coll
        finish = t + ckpt_s + ready + coll
        step = self.step
        loss_base, grad, lr, skipped, nan_loss = self._model(t, step)
        if self._skips(t, step):
            skipped, grad = True, math.inf  # a loss-scale overflow: the optimizer skips the update
        if self.steps_in_run == 0:
            for i, f in e._faults(job.id, "gpu_allocated_idle"):
                e.effects.setdefault(i, _Effect(max(t, f.start), f.end, {}))
        last_report = t
        for r, (data, compute) in zip(self.layout, segs, strict=True):
            jitter = rng.uniform(0, 0.002)
            wait = ready - (data + compute) + coll + jitter
            # Ranks leave the collective within a few ms of each other, all by `finish`.
            reported = finish - rng.uniform(0, 0.004)
            last_report = max(last_report, reported)
            fwd, bwd, opt = compute * _FWD, compute * _BWD, compute * _OPT
            comm: float | None = round(wait, 6)
            if overlap:
                # The backward timer runs until the all-reduce ends: it holds the rank's wait.
                bwd = grads + coll - (data + fwd)
                wait = ready - (grads + opt) + jitter  # until the slowest optimizer step is done
                comm = None
            loss = math.nan if nan_loss else loss_base * (1 + rng.gauss(0, 0.012))
            e.emit(
                reported,
                "StepCompleted",
                job_id=job.id,
                run_id=self.run_id,
                rank=r.rank,
                node=r.node,
                step=step,
                samples=self.samples,
                tokens=self.samples * job.seq_len,
                loss=loss,
                lr=lr,
                grad_norm=grad,
                step_time_s=round(ckpt_s + data + (fwd + bwd + opt if overlap else compute) + wait, 6),
                data_wait_s=round(data, 6),
                forward_s=round(fwd, 6),
                backward_s=round(bwd, 6),
                optimizer_s=round(opt, 6),
                comm_s=comm,
                checkpoint_s=round(ckpt_s, 6) if ckpt_s else 0.0,
                skipped=skipped,
                batch_fingerprint=self._batch_fingerprint(r.rank, step, t),
                epoch=step // job.epoch_steps if job.epoch_steps else None,
            )
            s = t + ckpt_s
            e._spread(r.node, r.gpu_index, _DATA, s, data)
            e._spread(r.node, r.gpu_index, _COMPUTE, s + data, compute)
            e._spread(r.node, r.gpu_index, _COMM, s + data + compute, ready + coll - (data + compute))
            e._count_step(r.node, r.gpu_index, finish)
        self.step += 1
        self.steps_in_run += 1
        self.last_finish = round(last_report * 1000) / 1000  # exactly the reported ms
        return finish

    def _model(self, t: float, step: int) -> tuple[float, float, float, bool, bool]:
        """(loss, grad_norm, lr, skipped, loss_is_nan) of a step, with the model-level faults applied."""
        job, rng = self.job, self.rng
        c = job.loss_final
        loss = c + (job.loss_initial - c) * (1 + step / 60.0) ** -0.45
        loss *= 1 + rng.gauss(0, 0.01)
        grad = (0.35 + 2.5 * (1 + step / 40.0) ** -0.7) * _lognormal(rng, 0.08)
        if step < job.lr_warmup_steps:
            lr = job.learning_rate * (step + 1) / job.lr_warmup_steps
        else:
            p = min(1.0, (step - job.lr_warmup_steps) / max(1, job.total_steps - job.lr_warmup_steps))
            lr = job.learning_rate * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))
        skipped = nan_loss = False
        for i, f in self._active("loss_divergence", t):
            minutes = (t - f.start) / 60.0
            loss += (f.magnitude or 0.3) * minutes
            grad *= 1 + 0.6 * minutes
            self.e.effects.setdefault(i, _Effect(t, f.end, {}))
        for i, f in self.e._faults(self.job.id, "grad_spike"):
            # A spike hits steps, not seconds: it lands on the first steps at or after its start
            # even when an evaluation pause covers the start time, as many steps as its duration holds.
            left = self.spike_steps_left.setdefault(
                i, max(1, round((f.duration or 4.0) / self.job.step_time))
            )
            if t < f.start or left <= 0:
                continue
            self.spike_steps_left[i] = left - 1
            grad *= f.magnitude or 50.0
            loss *= 1.35
            effect = self.e.effects.setdefault(i, _Effect(t, t, {"first_step": step}))
            effect.end = t + self.job.step_time
        for i, f in self._active("nan_grad", t):
            grad = math.inf if rng.random() < 0.7 else math.nan
            skipped = True
            self.e.effects.setdefault(i, _Effect(t, f.end, {"first_step": step}))
        for i, f in self._active("nan_loss", t):
            nan_loss, grad, skipped = True, math.nan, True
            self.e.effects.setdefault(i, _Effect(t, f.end, {"first_step": step}))
        return loss, grad, lr, skipped, nan_loss

    def _hang(self, t: float, index: int, fault: FaultSpec) -> None:
        """One rank stops inside a step; the others block in its collective until the timeout."""
        e = self.e
        assert fault.rank is not None
        at = self.last_finish if self.last_finish is not None else t
        end = _NEVER if fault.end is None else fault.end
        stop = min(end, e.sc.duration)
        busy = fault.params.get("gpus", "busy") == "busy"
        data0, compute0, _ = self.base
        for r, speed in zip(self.layout, self.rank_speed, strict=True):
            if r.rank == fault.rank:
                # busy: it took its batch, and a kernel of its step never returns; idle: stuck in
                # host code before its step reached the GPU.
                if busy:
                    e._spread(r.node, r.gpu_index, _DATA, t, data0)
                    e._spread(r.node, r.gpu_index, _HUNG, t + data0, stop - t - data0)
            else:
                # The others run the step's forward and backward (no random draw: the nominal
                # segments), then wait in the gradient all-reduce the hung rank never joins.
                compute = compute0 * speed
                e._spread(r.node, r.gpu_index, _DATA, t, data0)
                e._spread(r.node, r.gpu_index, _COMPUTE, t + data0, compute)
                waited = t + data0 + compute
                e._spread(r.node, r.gpu_index, _SPIN if busy else _BLOCKED, waited, stop - waited)
        e.effects[index] = _Effect(at, None if end == _NEVER else end, {"last_step": self.step - 1})
        if end < e.sc.duration:
            for r in self.layout:
                if r.rank == fault.rank:
                    continue
                e.emit(
                    end + self.rng.uniform(0, 0.5),
                    "RankFault",
                    job_id=self.job.id,
                    run_id=self.run_id,
                    rank=r.rank,
                    node=r.node,
                    kind="collective_timeout",
                    detail=f"Watchdog caught collective operation timeout: WorkNCCL(SeqNum={self.step}, "
                    f"OpType=ALLREDUCE) ran for {int((end - t) * 1000)} milliseconds before timing out.",
                    exit_code=None,
                )
            self._state(end + 1.0, "failed", reason="collective timeout", exit_code=1)
            self._release(end + 3.0)

    def _crash_and_restart(
        self, t: float, index: int, *, last: bool, victim: _Rank | None = None, kind: str = "exit"
    ) -> float:
        """A rank fails (a random one exits, unless told which and how); the job restarts from its last verified checkpoint."""
        e, job, rng = self.e, self.job, self.rng
        if victim is None:
            victim = self.layout[rng.randrange(len(self.layout))]
            detail = _CRASH_DETAILS[rng.randrange(len(_CRASH_DETAILS))]
        else:
            detail = _CRASH_TEXT[kind]
        e.emit(
            t,
            "RankFault",
            job_id=job.id,
            run_id=self.run_id,
            rank=victim.rank,
            node=victim.node,
            kind=kind,
            detail=detail,
            exit_code=1 if kind in ("exit", "oom") else None,
        )
        self.restart_count += 1
        self._state(t + 0.5, "restarting", reason=f"rank {victim.rank} exited with code 1", exit_code=1)
        self._release(t + 3.0)
        eff = e.effects.setdefault(index, _Effect(t, None, {"restarts": 0}))
        eff.detail["restarts"] += 1
        self.run_index += 1
        self.run_id = f"{job.id}-r{self.run_index}"
        t_new = t + rng.uniform(25.0, 40.0)
        if last:
            eff.end = t_new + 0.05
        if t_new >= self.limit:
            return t_new
        first_step = self._start_run(t_new)
        if self.last_verified is not None:
            ckpt_id, step = self.last_verified
            e.emit(
                first_step - 2.0,
                "CheckpointEvent",
                job_id=job.id,
                run_id=self.run_id,
                rank=None,
                checkpoint_id=ckpt_id,
                step=step,
                phase="restored",
                duration_s=round(job.init_time * 0.5, 3),
                version="dcp-2",
            )
            self.step = step + 1
        else:
            self.step = 0
        self.next_ckpt = first_step + job.checkpoint.every
        return first_step
