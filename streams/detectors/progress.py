"""Progress heartbeats: `job_stall` (no step for the whole job), `rank_hang` (one rank stopped), `zombie_job`,
`startup_hang` (a run that never reaches its first step).

A run that has not completed its first step is starting up (compiling, loading data, initialising
its collectives), never stalled: `job_stall`, `rank_hang` and `zombie_job` wait for the first step,
and start-up has its own allowance (`startup_allow_s`, or `startup_factor` x the longest recent
start-up of the run's workload family, at least `startup_floor_s`) and its own rule, which names
the phase the ranks show. Every stall names the step it stands at.

Per job the detector keeps each rank's last step and the job's last *activity*: the latest step
that advanced the job, the end of a checkpoint, or a ValidationResult. The normal step interval
is learned from recent gaps between job-level step advances (median, robust to the occasional
long step); the job is stalled when no activity happened for longer than
`max(stall_floor_s, stall_interval_factor x interval)`.

Legitimate long operations never count as stalls:
- an open checkpoint (CheckpointEvent `started`, not yet `completed`/`failed`) suppresses the
  stall entirely; the colleague rule `checkpoint_stuck` owns its timeout;
- an open evaluation (EvaluationEvent `started`, not yet `completed`/`failed`) suppresses the
  stall and the rank-level alerts; the evaluation has its own timeout rule, `evaluation_stuck`:
  open for longer than `eval_factor x expected_duration_s` (when the producer says), else
  `eval_factor x` the longest evaluation of the job seen so far (capped at `eval_timeout_s`),
  else `eval_timeout_s`;
- evaluations of producers that only send ValidationResult (the learned fallback): the detector
  learns the evaluation period in steps (from two results; from one result at step s both s and
  s + 1 are accepted, since loops that evaluate every N steps from step 0 report N - 1) and the
  longest evaluation (the result's `duration_s`, or the pause between the steps around it). When
  the job's last step is one at which an evaluation is due, the allowed pause grows to
  `eval_factor x longest evaluation`, capped at `eval_timeout_s`. Before any evaluation of the run
  has been seen, a silence with an evaluation's shape -- every rank finished the same step, none
  is blocked in a collective, and the job's GPUs keep computing (median activity at least
  `eval_busy_util_pct`, at `eval_power_ratio` of their power while training, which a hung
  collective's spinning kernels do not draw) -- is allowed `eval_first_grace_s` (default 600 s;
  0: off); a silence on idle or cold GPUs, with a rank behind, or without GPU telemetry from
  both training and the silence keeps the usual allowance.

`rank_hang` names the rank that stopped first while the job is stalled: a rank whose last step
is behind the others; failing that, the rank that has been out of the collective in every
CollectiveSample since the stall began while its peers are blocked in it; failing that, the one rank whose GPU activity has been
out of line with its peers in every sample since the stall began (at least `hang_min_samples`):
when a stalled job resumes, the first GPU to come back is out of line only in its latest samples,
and recovery never raises a hang. Without collective telemetry the GPUs tell the rest (issues 20
and 23.5): peers spinning in the collective (GPM: busy, few SMs active, no tensor work; without
GPM: busy at a fraction of training power) and one rank whose kernel holds its SMs (or draws well
above them); or every GPU idle now, and one rank's GPU never started the step its node's peers
started right after the last one. Stalls and hangs name their suspected layer from the same
evidence; hangs carry the rank's GPU series and zombies the job's steps as metric history.

`zombie_job`: no activity for `zombie_grace_s` while the job's bound
processes still hold its GPUs (the bound pid in GpuSample.pids). Everything resolves when the
job makes progress again (or ends).
"""

from __future__ import annotations

import itertools
from typing import Any, ClassVar

from schemas.records import Event
from streams.detectors.base import Detector, Finding
from streams.detectors.catalogue import Rule, catalogued
from streams.detectors.hang_evidence import _activity, _gpu_row, _sm, _tensor, hung_rank
from streams.detectors.placement import rank_place
from streams.detectors.stats import median, stat_mean

__all__ = ["DEFAULTS", "ProgressDetector"]

DEFAULTS: dict[str, Any] = {
    "stall_floor_s": 60.0,  # never call a job stalled before this much silence
    "stall_interval_factor": 10.0,  # ...nor before this many learned step intervals
    "interval_history": 64,  # job-level step gaps kept to learn the interval
    "eval_factor": 2.0,  # allowed evaluation pause = factor x longest evaluation seen
    "eval_timeout_s": 1800.0,  # an evaluation pause never excuses more than this (default evaluation limit)
    "eval_first_grace_s": 600.0,  # silence allowed before the run's first evaluation, when it looks like one (0: off)
    "eval_busy_util_pct": 50.0,  # ...i.e. the job's GPUs keep computing (median activity at least this)
    "eval_power_ratio": 0.6,  # ...at this fraction of their power while training (a hung collective spins cold)
    "hang_collective_frac": 0.5,  # peers blocked in the collective: >= this fraction of the interval
    "hang_gpu_util_gap_pct": 40.0,  # a hung rank's GPU activity differs from its peers by this much
    "hang_min_samples": 2,  # GPU samples of a rank since the stall began before its activity can name it
    "hang_max_fraction": 0.25,  # more stopped ranks than this fraction is a job stall, not a rank hang
    "hang_spin_sm_pct": 35.0,  # GPM: a GPU busy with at most this SM activity and no tensor work spins in a collective
    "hang_tensor_idle_pct": 5.0,  # GPM: tensor-pipe activity at most this is no tensor work
    "hang_power_ratio": 1.2,  # no GPM: a hung kernel draws this many times its spinning peers' power...
    "hang_power_cold": 0.8,  # ...while they draw at most this fraction of the job's training power
    "hang_idle_pct": 5.0,  # a GPU at most this busy is idle
    "hang_start_gap_pct": 20.0,  # idle job: a rank whose GPU did this much less than its node's peers after the last step never started the next one
    "hang_start_samples": 2,  # GPU samples after the last step that hold the next step's start
    "zombie_grace_s": 600.0,  # GPUs held without progress for this long is a zombie
    "pid_recent_s": 60.0,  # a bound pid seen this recently still holds its GPU
    "startup_allow_s": 1200.0,  # start-up (launch to first step) allowed when the family has no history
    "startup_factor": 3.0,  # with history: this many times the family's longest recent start-up...
    "startup_floor_s": 300.0,  # ...but never less than this
    "startup_history": 8,  # start-ups kept per workload family
}


_GPU_HISTORY = 8  # recent GPU samples kept per rank
# Sampling and step skew: a GPU sample this close after the job's last step holds none of the next
# step's start (an agent samples a node's GPUs, and ranks leave a collective, within a few ms).
_SKEW_MS = 250
_POWER_HISTORY = 64  # GPU power readings while training kept per job (its reference level)

# The rules' layers are the evidence's (what the ranks do since the stall began); the declared one
# is the usual cause. An evaluation that never ends names no layer.
JOB_STALL = catalogued("job_stall")
RANK_HANG = catalogued("rank_hang")
ZOMBIE_JOB = catalogued("zombie_job")
EVALUATION_STUCK = catalogued("evaluation_stuck")
STARTUP_HANG = catalogued("startup_hang")


def _blank_job() -> dict[str, Any]:
    return {
        "ranks": {},  # str(rank) -> [last_step, last_ts]
        "max_step": None,
        "last_step_ts": None,  # when the job-level step last advanced
        "last_activity": None,  # max(last step advance, checkpoint end, validation)
        "gaps": [],  # recent job-level step gaps, ms
        "ckpt_open": {},  # checkpoint_id -> started ts
        "val_steps": [],  # steps of recent ValidationResults
        "eval_ms": [],  # durations of recent evaluations, ms
        "eval_open": {},  # evaluation_id -> [started ts, expected ms or None]
        "eval_stuck": None,  # [evaluation_id, since] of an active evaluation_stuck
        "eval_gap": False,  # time of a ValidationResult whose pause the next step after it measures (False: none)
        "paused": False,  # a checkpoint or evaluation closed since the last step: its gap is no interval
        "coll": {},  # str(rank) -> [[ts, time_s / interval_s], ...] recent samples
        "gpu": {},  # str(rank) -> recent GPU rows (see _gpu_row)
        "start": {},  # str(rank) -> [since, samples, activity sum]: its GPU right after the job's last activity
        "steps_seen": [],  # [[ts, max_step], ...] recent job-level step advances (alert history)
        "wait_share": {},  # str(rank) -> data wait / step time of its latest steps
        "power_train": [],  # recent GPU power readings taken between two ordinary steps
        "power_pending": [],  # GPU power readings since the last step advance (training once the next lands)
        "timeouts": [],  # ranks that reported a collective timeout (they were waiting)
        "pid_seen": None,  # last time a bound pid was seen on a GPU of the job
        "stall": None,  # since-ts of an active stall
        "hang": None,  # [rank, since] of an active rank hang
        "zombie": None,  # since-ts of an active zombie
        "started": None,  # JobStarted ts of the run (start-up is measured from it); None: not seen
        "family": "",  # the run's workload family (its start-up teaches the family's allowance)
        "cpu": {},  # str(rank) -> latest host CPU activity (names a start-up phase)
        "startup": None,  # [since, allowed ms] of an active startup_hang
    }


class ProgressDetector(Detector):
    """Heartbeats per job and rank: stalls, hung ranks and zombie jobs."""

    stage: ClassVar[str] = "job"  # reads the rank stage's summaries of the job's ranks

    rules: ClassVar[tuple[str, ...]] = tuple(
        r.name for r in (JOB_STALL, RANK_HANG, ZOMBIE_JOB, EVALUATION_STUCK, STARTUP_HANG)
    )

    def __init__(self, topology: Any, params: dict[str, Any] | None = None) -> None:
        super().__init__(topology, params)
        p = {**DEFAULTS, **self.params}
        self.floor_ms = int(float(p["stall_floor_s"]) * 1000)
        self.interval_factor = float(p["stall_interval_factor"])
        self.interval_history = int(p["interval_history"])
        self.eval_factor = float(p["eval_factor"])
        self.eval_timeout_ms = int(float(p["eval_timeout_s"]) * 1000)
        self.eval_first_grace_ms = int(float(p["eval_first_grace_s"]) * 1000)
        self.eval_busy_util = float(p["eval_busy_util_pct"])
        self.eval_power_ratio = float(p["eval_power_ratio"])
        self.hang_min_samples = int(p["hang_min_samples"])
        self.hang_coll_frac = float(p["hang_collective_frac"])
        self.hang_gpu_gap = float(p["hang_gpu_util_gap_pct"])
        self.hang_max_fraction = float(p["hang_max_fraction"])
        self.hang_spin_sm = float(p["hang_spin_sm_pct"])
        self.hang_tensor_idle = float(p["hang_tensor_idle_pct"])
        self.hang_power_ratio = float(p["hang_power_ratio"])
        self.hang_power_cold = float(p["hang_power_cold"])
        self.hang_idle = float(p["hang_idle_pct"])
        self.hang_start_gap = float(p["hang_start_gap_pct"])
        self.hang_start_samples = int(p["hang_start_samples"])
        self.zombie_grace_ms = int(float(p["zombie_grace_s"]) * 1000)
        self.pid_recent_ms = int(float(p["pid_recent_s"]) * 1000)
        self.startup_allow_ms = int(float(p["startup_allow_s"]) * 1000)
        self.startup_factor = float(p["startup_factor"])
        self.startup_floor_ms = int(float(p["startup_floor_s"]) * 1000)
        self.startup_history = int(p["startup_history"])
        self.jobs: dict[str, dict[str, Any]] = {}
        # workload family -> recent start-ups (JobStarted to first step), ms
        self.families: dict[str, list[int]] = {}
        self._last_second: int | None = None

    # -- events ------------------------------------------------------------------------
    def observe(self, event: Event) -> list[Finding]:
        """Heartbeats from rank summaries (steps, collectives, GPU), checkpoints, evaluations and validations."""
        r = event.record
        t = event.type
        if t == "RankSummary":
            return self._summary(r)
        if t == "StepCompleted":
            self._leader_step(r)
            return []
        if t == "CheckpointEvent":
            job = self._job_of(r["job_id"])
            if r["phase"] == "started":
                job["ckpt_open"][r["checkpoint_id"]] = r["ts"]
            elif (
                r["phase"] in ("completed", "failed")
                and job["ckpt_open"].pop(r["checkpoint_id"], None) is not None
            ):
                job["last_activity"] = max(job["last_activity"] or 0, r["ts"])
                job["paused"] = True
        elif t == "EvaluationEvent":
            return self._evaluation(r)
        elif t == "ValidationResult":
            job = self._job_of(r["job_id"])
            job["val_steps"] = [*job["val_steps"], int(r["step"])][-4:]
            dur = r.get("duration_s")
            if dur is None and job["last_step_ts"] is not None:
                dur = (r["ts"] - job["last_step_ts"]) / 1000.0
            if dur is not None and dur >= 0:
                job["eval_ms"] = [*job["eval_ms"], int(dur * 1000)][-4:]
            job["last_activity"] = max(job["last_activity"] or 0, r["ts"])
            # The next step after this time measures the evaluation (summaries of steps before it
            # may still come: they are over a bucket's end).
            job["eval_gap"] = int(r["ts"])
            job["paused"] = True
        elif t == "RankFault" and r.get("kind") == "collective_timeout":
            return self._timeout(r)
        elif t == "JobStarted":
            # A new run of the job starts from scratch: old heartbeats mean nothing.
            old = self.jobs.pop(r["job_id"], None)
            out = self._clear(r["job_id"], old, r["ts"]) if old is not None else []
            job = self._job_of(r["job_id"])
            job["started"], job["family"] = int(r["ts"]), str(r.get("workload_family") or "")
            return out
        return []

    def _evaluation(self, r: dict[str, Any]) -> list[Finding]:
        """EvaluationEvent: an open evaluation is a legitimate pause with its own timeout."""
        job = self._job_of(r["job_id"])
        eid, ts = str(r["evaluation_id"]), int(r["ts"])
        if r["phase"] == "started":
            expected = r.get("expected_duration_s")
            if eid not in job["eval_open"]:
                job["eval_open"][eid] = [ts, int(expected * 1000) if expected else None]
            return []
        opened = job["eval_open"].pop(eid, None)
        if opened is None:
            return []
        job["eval_ms"] = [*job["eval_ms"], max(0, ts - opened[0])][-4:]
        job["last_activity"] = max(job["last_activity"] or 0, ts)
        job["paused"] = True
        return self._clear_eval_stuck(r["job_id"], job, ts)

    def _clear_eval_stuck(self, job_id: str, job: dict[str, Any], ts: int) -> list[Finding]:
        if job["eval_stuck"] is None or job["eval_stuck"][0] in job["eval_open"]:
            return []
        out = [self._eval_stuck_finding(job_id, job, ts, False, 0)]
        job["eval_stuck"] = None
        return out

    def _leader_step(self, r: dict[str, Any]) -> None:
        """The leader rank's own step (the rank stage passes it on): after a ValidationResult its
        first step measures the evaluation exactly, where a summary spreads the pause over the
        bucket's steps. The summary that follows is then no interval sample."""
        job = self.jobs.get(r["job_id"])
        if job is None or not job["eval_gap"] or job["last_step_ts"] is None or r["ts"] <= job["eval_gap"]:
            return
        if job["max_step"] is not None and int(r["step"]) <= job["max_step"]:
            return
        self._learn_eval_gap(job, int(r["ts"]) - job["last_step_ts"])
        job["eval_gap"] = False
        job["paused"] = True

    def _learn_eval_gap(self, job: dict[str, Any], gap: int) -> None:
        """The pause between the steps around a ValidationResult is the evaluation's real length."""
        interval = self._interval_ms(job) or 0
        pause = int(gap - interval)
        if pause > 0 and (not job["eval_ms"] or pause > job["eval_ms"][-1]):
            job["eval_ms"] = [*job["eval_ms"][:-1], pause] if job["eval_ms"] else [pause]

    def _timeout(self, r: dict[str, Any]) -> list[Finding]:
        """Peers report collective timeouts: the rank that did not is the one they waited for."""
        job = self.jobs.get(r["job_id"])
        if job is None:
            return []
        if r["rank"] not in job["timeouts"]:
            job["timeouts"] = sorted([*job["timeouts"], r["rank"]])
        ranks = sorted(int(k) for k in job["ranks"])
        silent = [k for k in ranks if k not in job["timeouts"]]
        # Timeouts trickle in: only once every rank but one has reported is the silent one known.
        if job["hang"] is not None or len(ranks) < 2 or len(silent) != 1:
            return []
        job["hang"] = [silent[0], job["ranks"][str(silent[0])][1]]
        return [self._hang_finding(r["job_id"], job, silent[0], r["ts"], True)]

    def _summary(self, r: dict[str, Any]) -> list[Finding]:
        """One rank's bucket: its last step (a heartbeat), its collectives and its GPU."""
        rank = r.get("rank")
        if rank is None:
            return []
        out: list[Finding] = []
        if r.get("last_step") is not None:
            out = self._step(
                {"job_id": r["job_id"], "rank": rank, "step": r["last_step"], "ts": r["last_step_ts"]}
            )
        job = self.jobs.get(r["job_id"])
        if job is None:
            return out
        key = str(rank)
        if r.get("coll_n") and r.get("coll_frac_last") is not None:
            row = [r["coll_last_ts"], float(r["coll_frac_last"]), float(r["coll_frac_max"])]
            job["coll"][key] = [*job["coll"].get(key, []), row][-_GPU_HISTORY:]
        util, power = r.get("gpu_util_pct"), stat_mean([r.get("power_w")])
        ts = r.get("gpu_last_ts")
        if util and ts is not None:
            row = _gpu_row(r, ts, power)
            job["gpu"][key] = [*job["gpu"].get(key, []), row][-_GPU_HISTORY:]
            self._note_start(job, key, row)
        steps, wait = r.get("step_time_s"), r.get("data_wait_s")
        if steps and wait and float(steps["sum"]) > 0:
            job["wait_share"][key] = round(float(wait["sum"]) / float(steps["sum"]), 4)
        if power is not None and ts is not None:
            if r.get("steps") and r.get("last_step_ts") is not None and ts <= r["last_step_ts"]:
                # Drawn before a step of the same bucket: what the GPUs draw while training.
                job["power_train"] = [*job["power_train"], round(float(power), 1)][-_POWER_HISTORY:]
            elif job["last_step_ts"] is not None and ts >= job["last_step_ts"]:
                job["power_pending"] = [*job["power_pending"], round(float(power), 1)][-_POWER_HISTORY:]
        if r.get("pid_seen_ts") is not None:
            job["pid_seen"] = max(job["pid_seen"] or 0, int(r["pid_seen_ts"]))
        cpu = stat_mean([r.get("cpu_util_pct")])
        if cpu is not None and job["max_step"] is None:
            job["cpu"][key] = round(float(cpu), 1)
        return out

    def _note_start(self, job: dict[str, Any], key: str, row: list[Any]) -> None:
        """Sum a rank's GPU activity over the first samples after the job's last activity: they hold
        the next step's start (its forward and backward) on every rank that began it.

        A sample is an average over the interval before it: one taken a few ms after the last step
        is that step's work, not the next one's start. An agent samples a node's GPUs a few ms
        apart and ranks finish a step a few ms apart, so such a round can fall on both sides of
        the last step (one GPU 2 ms before it, its peers 1-3 ms after: that named an idle rank hung
        in a job-wide stall). A sample within `_SKEW_MS` of the last step counts for no rank.
        """
        since = job["last_activity"]
        if since is None or row[0] <= since + _SKEW_MS:
            return
        mark = job["start"].get(key)
        if mark is None or mark[0] != since:
            mark = job["start"][key] = [since, 0, 0.0]
        if mark[1] < self.hang_start_samples:
            mark[1] += 1
            mark[2] = round(mark[2] + _activity(row), 3)

    def _job_of(self, job_id: str) -> dict[str, Any]:
        """The job's state, created on first sight (not a blank dict built per event)."""
        job = self.jobs.get(job_id)
        if job is None:
            job = self.jobs[job_id] = _blank_job()
        return job

    def _step(self, r: dict[str, Any]) -> list[Finding]:
        job = self._job_of(r["job_id"])
        ts, step = int(r["ts"]), int(r["step"])
        rank = str(r["rank"])
        prev = job["ranks"].get(rank)
        if prev is None or step >= prev[0]:
            job["ranks"][rank] = [step, ts]
        if job["max_step"] is None and job["started"] is not None:
            self._learn_startup(job, ts)
        if job["max_step"] is None or step > job["max_step"]:
            # A step from before the last ValidationResult (its bucket's summary came after it).
            before_eval = bool(job["eval_gap"]) and ts <= job["eval_gap"]
            if job["last_step_ts"] is not None and not job["ckpt_open"] and not job["eval_open"]:
                # A summary can carry several steps: the gap per step is the interval.
                gap = (ts - job["last_step_ts"]) // max(1, step - (job["max_step"] or step - 1))
                if job["eval_gap"] and not before_eval:
                    self._learn_eval_gap(job, gap)
                elif gap > 0 and not job["paused"]:
                    job["gaps"] = [*job["gaps"], gap][-self.interval_history :]
                    if gap <= max(5000, 3 * (self._interval_ms(job) or 0)):
                        # Readings between two ordinary steps: what the GPUs draw while training.
                        job["power_train"] = [*job["power_train"], *job["power_pending"]][-_POWER_HISTORY:]
            job["power_pending"] = []
            if not before_eval:
                job["eval_gap"] = job["paused"] = False
            job["max_step"] = step
            job["steps_seen"] = [*job["steps_seen"], [ts, step]][-_GPU_HISTORY:]
            job["last_step_ts"] = max(job["last_step_ts"] or 0, ts)
            job["last_activity"] = max(job["last_activity"] or 0, ts)
            # Training stepped on: evaluations opened before this step are over (a lost
            # `completed` must not excuse a later stall).
            job["eval_open"] = {k: v for k, v in job["eval_open"].items() if v[0] >= ts}
            return self._clear(r["job_id"], job, ts) + self._clear_eval_stuck(r["job_id"], job, ts)
        # A lagging rank that catches up ends its hang.
        if job["hang"] is not None and job["hang"][0] == int(rank) and step >= job["max_step"]:
            out = [self._hang_finding(r["job_id"], job, int(rank), ts, False)]
            job["hang"] = None
            return out
        return []

    def _clear(self, job_id: str, job: dict[str, Any], ts: int) -> list[Finding]:
        out: list[Finding] = []
        if job["stall"] is not None:
            out.append(self._stall_finding(job_id, job, ts, False, 0))
            job["stall"] = None
        if job["hang"] is not None:
            out.append(self._hang_finding(job_id, job, job["hang"][0], ts, False))
            job["hang"] = None
        if job["zombie"] is not None:
            out.append(self._zombie_finding(job_id, job, ts, False))
            job["zombie"] = None
        if job["startup"] is not None:
            out.append(self._startup_finding(job_id, job, ts, False))
            job["startup"] = None
        return out

    # -- start-up ----------------------------------------------------------------------
    def _learn_startup(self, job: dict[str, Any], ts: int) -> None:
        """The run's first step: its start-up (launch to first step) teaches the family's allowance."""
        took = ts - int(job["started"])
        if took > 0 and job["family"]:
            seen = self.families.get(job["family"], [])
            self.families[job["family"]] = [*seen, took][-self.startup_history :]
        job["cpu"] = {}

    def _startup_allowed_ms(self, job: dict[str, Any]) -> int:
        """How long a run may take to its first step: learned from its workload family's recent
        start-ups where there are some (a family that compiles for 8 minutes may take 24), else the
        default."""
        seen = self.families.get(job["family"]) if job["family"] else None
        if not seen:
            return self.startup_allow_ms
        return max(self.startup_floor_ms, int(self.startup_factor * max(seen)))

    def _check_startup(self, job_id: str, job: dict[str, Any], watermark: int) -> list[Finding]:
        """A run that has not completed its first step is starting up, never stalled: it is
        `startup_hang` once start-up outlasts its allowance."""
        if job["started"] is None or job["ckpt_open"]:
            return []
        allowed = self._startup_allowed_ms(job)
        if watermark - job["started"] <= allowed:
            return []
        if job["startup"] is None:
            job["startup"] = [job["started"], allowed]
        return [self._startup_finding(job_id, job, watermark, True)]

    def _startup_phase(self, job_id: str, job: dict[str, Any]) -> tuple[str, str]:
        """(phase, suspected layer) of a start-up that never ends, from what the ranks show: ranks
        never launched (fewer bound than the world size), ranks blocked in their first collective
        (NCCL initialisation), GPUs busy (compilation autotuning or warm-up kernels), hosts busy
        with idle GPUs (compilation or data loading on the CPU), or everything idle."""
        info = self.topology.jobs.get(job_id)
        world = info.world_size if info is not None else 0
        bound = len(self.topology.ranks_of(job_id))
        if world and bound < world:
            return f"process launch: {bound} of {world} ranks bound", "platform"
        coll = [v[-1][1] for v in job["coll"].values() if v]
        if coll and 2 * sum(c >= self.hang_coll_frac for c in coll) > len(coll):
            return "collective initialisation (NCCL): ranks wait in their first collective", "network"
        utils = [v[-1][1] for v in job["gpu"].values() if v]
        busy = median(utils) if utils else None
        if busy is not None and busy > self.hang_idle:
            return f"GPU warm-up or compilation autotuning (GPUs {busy:.0f} % busy)", "gpu"
        cpus = list(job["cpu"].values())
        cpu = median(cpus) if cpus else None
        if cpu is not None and cpu >= self.eval_busy_util:
            return f"compilation or data loading on the host (CPU {cpu:.0f} % busy, GPUs idle)", "host"
        if busy is not None or cpu is not None:
            return (
                "initialisation with hosts and GPUs idle (blocked on storage, a rendezvous or a lock?)",
                "data",
            )
        return "initialisation (no telemetry says which phase)", "unknown"

    def _startup_finding(self, job_id: str, job: dict[str, Any], ts: int, active: bool) -> Finding:
        since, allowed = job["startup"]
        took_s = (ts - since) / 1000.0
        phase, layer = self._startup_phase(job_id, job) if active else ("", "unknown")
        learned = "learned from its family's start-ups" if self.families.get(job["family"]) else "default"
        return self._job_finding(
            STARTUP_HANG,
            job_id,
            job,
            ts,
            active,
            since=since,
            observed=took_s,
            allowed=allowed,
            summary=(
                f"job {job_id} has completed no step {took_s:.0f} s after it started (allowed {allowed / 1000:.0f} s, "
                f"{learned}); stuck in {phase}"
                if active
                else f"job {job_id} completed its first step"
            ),
            layer=layer,
            step_history=False,
        )

    def _job_finding(
        self,
        rule: Rule,
        job_id: str,
        job: dict[str, Any],
        ts: int,
        active: bool,
        *,
        since: int | None,
        observed: float,
        allowed: int,
        summary: str,
        layer: str,
        step_history: bool = True,
        history: tuple[str, tuple[tuple[int, float], ...]] | None = None,
    ) -> Finding:
        """A job-level finding of the progress rules: since when, how long (`observed` s) against
        the allowance (ms, while it holds), and as its history the step the job stands at (or the
        `history` given: metric, points)."""
        if history is None and step_history:
            history = ("step", _step_now(job, ts))
        return rule.for_job(
            job_id,
            active,
            ts,
            since=since,
            observed=observed,
            expected=allowed / 1000.0 if active else None,
            summary=summary,
            suspected_layer=layer,
            **({"history_metric": history[0], "history": history[1]} if history is not None else {}),
        )

    # -- time --------------------------------------------------------------------------
    def advance(self, watermark: int) -> list[Finding]:
        """Check every running job's silence against its allowance."""
        second = watermark // 1000
        if self._last_second is not None and second <= self._last_second:
            return []
        self._last_second = second
        out: list[Finding] = []
        for job_id in sorted(self.jobs):
            job = self.jobs[job_id]
            info = self.topology.jobs.get(job_id)
            if info is None or info.state != "running":
                continue
            if job["max_step"] is None:
                # Before its first step a run is starting up (compiling, loading, joining its
                # collectives), never stalled: start-up has its own allowance and rule.
                out.extend(self._check_startup(job_id, job, watermark))
                continue
            if job["last_activity"] is None:
                continue
            if job["ckpt_open"]:
                continue  # a checkpoint in progress is a legitimate pause
            if job["eval_open"]:
                out.extend(self._check_eval(job_id, job, watermark))
                continue  # so is an evaluation, within its own timeout
            silent = watermark - job["last_activity"]
            allowed = self._allowed_ms(job_id, job, watermark, silent)
            if silent <= allowed:
                continue
            out.append(self._stall_finding(job_id, job, watermark, True, allowed))
            if job["stall"] is None:
                job["stall"] = job["last_activity"]
            hang = hung_rank(self, job_id, job)
            if hang is not None and job["hang"] is None:
                job["hang"] = [hang, job["ranks"][str(hang)][1]]
            if job["hang"] is not None:
                out.append(self._hang_finding(job_id, job, job["hang"][0], watermark, True))
            if (
                silent > self.zombie_grace_ms
                and job["pid_seen"] is not None
                and watermark - job["pid_seen"] <= self.pid_recent_ms
            ):
                if job["zombie"] is None:
                    job["zombie"] = job["last_activity"]
                out.append(self._zombie_finding(job_id, job, watermark, True))
        return out

    def _check_eval(self, job_id: str, job: dict[str, Any], watermark: int) -> list[Finding]:
        eid, (started, expected) = min(job["eval_open"].items(), key=lambda kv: (kv[1][0], kv[0]))
        limit = self._eval_limit_ms(job, expected)
        if watermark - started <= limit:
            return []
        if job["eval_stuck"] is None:
            job["eval_stuck"] = [eid, started]
        return [self._eval_stuck_finding(job_id, job, watermark, True, limit)]

    def _eval_limit_ms(self, job: dict[str, Any], expected: int | None) -> int:
        """How long an open evaluation may last: from the producer's estimate, else learned, else the default."""
        if expected:
            return max(self.floor_ms, int(self.eval_factor * expected))
        if job["eval_ms"]:
            return max(self.floor_ms, min(self.eval_timeout_ms, int(self.eval_factor * max(job["eval_ms"]))))
        return self.eval_timeout_ms

    def _interval_ms(self, job: dict[str, Any]) -> float | None:
        return median(job["gaps"]) if len(job["gaps"]) >= 3 else None

    def _allowed_ms(self, job_id: str, job: dict[str, Any], watermark: int, silent: int | None = None) -> int:
        """How long the job may be silent now. The first-evaluation grace looks at every rank (its
        shape), so it is only asked once the `silent` job is past the usual allowance."""
        interval = self._interval_ms(job)
        allowed = self.floor_ms
        if interval is not None:
            allowed = max(allowed, int(self.interval_factor * interval))
        if job["eval_ms"] and self._eval_due(job):
            allowed = max(allowed, min(self.eval_timeout_ms, int(self.eval_factor * max(job["eval_ms"]))))
        elif (
            not job["eval_ms"]
            and not job["val_steps"]
            and self.eval_first_grace_ms > allowed
            and (silent is None or silent > allowed)
            and self._looks_like_evaluation(job_id, job, watermark)
        ):
            allowed = self.eval_first_grace_ms
        return allowed

    def _looks_like_evaluation(self, job_id: str, job: dict[str, Any], watermark: int) -> bool:
        """Before the run's first evaluation: does this silence have an evaluation's shape?

        A producer that sends only ValidationResult says nothing until the evaluation is over,
        and nothing has taught the detector its period or length yet. An evaluation runs after
        a step every rank finished, on GPUs that keep computing (forward passes over the
        validation set). A stall does not look like that: a rank behind its peers or out of line
        with them (a hang), peers blocked in a collective, or GPUs gone idle (a hung loader, a
        dead process, a lost node) -- or no GPU telemetry from training and from now to tell --
        keep the usual allowance.
        """
        since = job["last_activity"]
        steps = [s for s, _ in job["ranks"].values()]
        if not steps or min(steps) < max(steps) or hung_rank(self, job_id, job) is not None:
            return False
        for samples in job["coll"].values():
            recent = [x[1] for x in samples if x[0] > since]
            if recent and recent[-1] >= self.hang_coll_frac:
                return False
        fresh = watermark - self.pid_recent_ms
        utils: list[float] = []
        powers: list[float] = []
        for samples in job["gpu"].values():
            recent = [x for x in samples if x[0] > since]
            if len(recent) >= self.hang_min_samples and samples[-1][0] >= fresh:
                utils.append(median([x[1] for x in recent]) or 0.0)
                watts = [x[2] for x in recent if len(x) > 2 and x[2] is not None]
                if watts:
                    powers.append(median(watts) or 0.0)
        if not utils or 2 * len(utils) < len(job["ranks"]):
            return False
        busy = median(utils)
        if busy is None or busy < self.eval_busy_util:
            return False
        # Activity alone cannot tell computing from spinning: NCCL kernels waiting in a hung
        # collective show 100% activity at a fraction of the power the job drew while training.
        # Without that comparison (no power readings from training or from now) nothing excuses.
        reference = median(job["power_train"]) if len(job["power_train"]) >= self.hang_min_samples else None
        drawn = median(powers)
        return reference is not None and drawn is not None and drawn >= self.eval_power_ratio * reference

    def _eval_due(self, job: dict[str, Any]) -> bool:
        steps = job["val_steps"]
        if not steps or job["max_step"] is None:
            return False
        diffs = [b - a for a, b in itertools.pairwise(steps) if b > a]
        # One evaluation seen at step s: it recurs every s steps (1-based counters) or every s + 1
        # (evaluations every N steps from step 0 report N - 1).
        periods = [min(diffs)] if diffs else [p for p in (steps[-1], steps[-1] + 1) if p > 1]
        # Measured from the last evaluation's step; either side of it, for off-by-one counters.
        since = job["max_step"] - steps[-1]
        return any(since > 0 and since % p in (0, 1, p - 1) for p in periods)

    # -- findings ----------------------------------------------------------------------
    def _stall_finding(
        self, job_id: str, job: dict[str, Any], ts: int, active: bool, allowed: int
    ) -> Finding:
        since = job["stall"] if job["stall"] is not None else job["last_activity"]
        silent_s = (ts - (job["last_activity"] or ts)) / 1000.0
        return self._job_finding(
            JOB_STALL,
            job_id,
            job,
            ts,
            active,
            since=since,
            observed=silent_s,
            allowed=allowed,
            summary=(
                f"job {job_id} made no progress for {silent_s:.0f} s (allowed {allowed / 1000:.0f} s) "
                f"since step {job['max_step']}"
                if active
                else f"job {job_id} progresses again"
            ),
            layer=self._stall_layer(job) if active else "unknown",
            # The silence itself, from the last activity to now: it grows with the stall (the
            # tracker republishes the firing alert as it does).
            history=("seconds_without_step", ((job["last_activity"] or ts, 0.0), (ts, silent_s))),
        )

    def _stall_layer(self, job: dict[str, Any]) -> str:
        """Where the job stopped, from what its ranks do since: the hung rank's layer; peers blocked
        in a collective (network); every GPU idle, none in a collective (data: every rank waits off
        the GPU at once, and the input path is what they share); GPUs busy spinning (network) or
        busy computing (gpu)."""
        if job["hang"] is not None:
            return self._rank_layer(job, int(job["hang"][0]))
        since = job["last_activity"] or 0
        coll = [v[-1][1] for v in job["coll"].values() if v and v[-1][0] > since]
        if coll and 2 * sum(c >= self.hang_coll_frac for c in coll) > len(coll):
            return "network"
        rows = [v[-1] for v in job["gpu"].values() if v and v[-1][0] > since]
        if not rows:
            return "unknown"
        if (median([x[1] for x in rows]) or 0.0) <= self.hang_idle:
            return "data"
        return self._busy_layer(job, rows)

    def _busy_layer(self, job: dict[str, Any], rows: list[list[Any]]) -> str:
        """Busy GPUs without steps: spinning in a collective (network) or computing (gpu). GPM says
        which; without it, spinning draws a fraction of the job's training power."""
        sms = [_sm(x) for x in rows]
        if all(a is not None for a in sms):
            spinning = (median([float(a or 0.0) for a in sms]) or 0.0) <= self.hang_spin_sm
            return "network" if spinning else "gpu"
        watts = [float(x[2]) for x in rows if x[2] is not None]
        if watts and len(job["power_train"]) >= self.hang_min_samples:
            cold = (median(watts) or 0.0) <= self.hang_power_cold * (median(job["power_train"]) or 0.0)
            return "network" if cold else "gpu"
        return "unknown"

    def _rank_layer(self, job: dict[str, Any], rank: int) -> str:
        """Where a hung rank is stuck, from its GPU: idle (host code, or its input when its last
        steps already waited on data), busy spinning (a collective: network) or busy otherwise
        (a kernel that never returns: gpu)."""
        rows = job["gpu"].get(str(rank), [])
        if not rows:
            return "unknown"
        last = rows[-1]
        if float(last[1]) <= self.hang_idle:
            return "data" if job["wait_share"].get(str(rank), 0.0) >= 0.3 else "host"
        sm = _sm(last)
        if sm is not None:
            return "network" if sm <= self.hang_spin_sm and _tensor(last) <= self.hang_tensor_idle else "gpu"
        return "gpu"

    def _hang_finding(self, job_id: str, job: dict[str, Any], rank: int, ts: int, active: bool) -> Finding:
        place = rank_place(self.topology, job_id, rank)
        last = job["ranks"].get(str(rank), [None, None])
        return RANK_HANG.for_rank(
            job_id,
            rank,
            place,
            active,
            ts,
            since=last[1],
            observed=float(last[0]) if last[0] is not None else None,
            expected=float(job["max_step"]) if job["max_step"] is not None else None,
            summary=(
                f"rank {rank} of job {job_id} stopped at step {last[0]}"
                + (f" {(ts - last[1]) / 1000:.0f} s ago" if last[1] is not None else "")
                + "; the other ranks wait for it"
                if active
                else f"rank {rank} of job {job_id} steps again"
            ),
            suspected_layer=self._rank_layer(job, rank) if active else "unknown",
            **self._rank_history(job, rank),
        )

    def _rank_history(self, job: dict[str, Any], rank: int) -> dict[str, Any]:
        """The series the hang rule read: the rank's GPU activity (SM activity where GPM is read),
        else its last step."""
        rows = job["gpu"].get(str(rank), [])
        if rows:
            gpm = all(_sm(x) is not None for x in rows)
            points = tuple((int(x[0]), round(_activity(x), 1)) for x in rows)
            return {"history_metric": "sm_active_pct" if gpm else "gpu_util_pct", "history": points}
        last = job["ranks"].get(str(rank))
        if last is None:
            return {}
        return {"history_metric": "step", "history": ((int(last[1]), float(last[0])),)}

    def _eval_stuck_finding(
        self, job_id: str, job: dict[str, Any], ts: int, active: bool, limit: int
    ) -> Finding:
        eid, since = job["eval_stuck"]
        open_s = (ts - since) / 1000.0
        return self._job_finding(
            EVALUATION_STUCK,
            job_id,
            job,
            ts,
            active,
            since=since,
            observed=open_s,
            allowed=limit,
            summary=(
                f"evaluation {eid} of job {job_id} has been open for {open_s:.0f} s (allowed {limit / 1000:.0f} s) "
                f"{_at_step(job['max_step'])}: the job is stalled in its evaluation"
                if active
                else f"evaluation {eid} of job {job_id} is over"
            ),
            layer="unknown",
        )

    def _zombie_finding(self, job_id: str, job: dict[str, Any], ts: int, active: bool) -> Finding:
        silent_s = (ts - (job["last_activity"] or ts)) / 1000.0
        return ZOMBIE_JOB.for_job(
            job_id,
            active,
            ts,
            since=job["zombie"],
            observed=silent_s,
            expected=self.zombie_grace_ms / 1000.0,
            summary=(
                f"job {job_id} holds its GPUs (processes alive) but made no progress for {silent_s:.0f} s"
                if active
                else f"job {job_id} progresses again"
            ),
            # The job's recent step advances, then the step it still stands at: a flat tail.
            history_metric="step",
            history=(
                *((int(t), float(step)) for t, step in job["steps_seen"]),
                (ts, float(job["max_step"] or 0)),
            ),
        )

    # -- state -------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """JSON-able state."""
        return {
            "jobs": {k: self.jobs[k] for k in sorted(self.jobs)},
            "last_second": self._last_second,
            "families": {k: self.families[k] for k in sorted(self.families)},
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore from `state()`."""
        self.jobs = {k: {**_blank_job(), **v} for k, v in state.get("jobs", {}).items()}
        for job in self.jobs.values():
            # Snapshots before GPU history kept one [ts, util] pair per rank.
            job["gpu"] = {k: [v] if v and not isinstance(v[0], list) else v for k, v in job["gpu"].items()}
            job["coll"] = {k: [v] if v and not isinstance(v[0], list) else v for k, v in job["coll"].items()}
        self._last_second = state.get("last_second")
        self.families = {k: list(v) for k, v in state.get("families", {}).items()}

    def forget_job(self, job_id: str) -> None:
        """Drop a finished job."""
        self.jobs.pop(job_id, None)


def _step_now(job: dict[str, Any], ts: int) -> tuple[tuple[int, float], ...]:
    """The step a job stands at, as a one-point history: when it was reached, or `ts`."""
    return ((job["last_step_ts"] or ts, float(job["max_step"] or 0)),)


def _at_step(step: int | None) -> str:
    """Where a job stands, for a summary: its last step, or that it has none yet."""
    return f"at step {step}" if step is not None else "before its first step"
