"""The simulation itself: synchronous data-parallel jobs on a GPU cluster, in event time.

Two passes. The job pass walks each job step by step (every rank of a step ends together
because of the collective) and records, per GPU and telemetry interval, how long the GPU spent
in each phase. The telemetry pass turns those phase times into NVML-like GPU samples, host
samples and SDK data-loader/collective samples, then applies the node- and GPU-level faults.
Every random draw comes from a `random.Random` seeded from (seed, component), so the output
is a pure function of the scenario and the seed.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from producers.simulator.faults import FAULTS
from producers.simulator.scenario import FaultSpec, JobSpec, Scenario
from schemas.files import format_ts, parse_ts
from schemas.records import Event, default_schemas

__all__ = ["Progress", "Simulation", "simulate"]

Progress = Callable[[int, float], None]
"""Called now and then with (events generated so far, simulated seconds reached)."""

# Phase slots of a GPU's per-interval accumulator.
# _SPIN: NCCL kernels spinning while blocked in a collective (GPU busy, counts as collective time);
# _BLOCKED: blocked in a collective call with no kernel running (collective time only);
# _HUNG: a kernel that never returns (a deadlocked or spin-waiting kernel): its blocks stay resident
# on every SM, so the GPU reads busy, but it issues no tensor work and moves little data.
_DATA, _COMPUTE, _COMM, _CKPT, _EVAL, _SPIN, _STEPS, _BLOCKED, _HUNG = range(9)
_FWD, _BWD, _OPT = 0.32, 0.6, 0.08  # a step's compute split into forward, backward and optimizer
_DDP_TAIL = 0.3  # share of the all-reduce DDP leaves exposed after the last backward bucket
_SLOTS = 9
_GIB = 1024**3
_GRAD_BYTES = 14_000_000_000  # bf16 gradients of a ~7B-parameter model, all-reduced every step
_IDLE_SM_MHZ = 345
_NEVER = math.inf

# NVML clock-event (throttle) reason bits.
_GPU_IDLE = 0x1
_SW_POWER_CAP = 0x4
_HW_SLOWDOWN = 0x8
_SW_THERMAL = 0x20
_HW_THERMAL = 0x40
_HW_POWER_BRAKE = 0x80

_CRASH_DETAILS = (
    "RuntimeError: CUDA error: an illegal memory access was encountered",
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: exitcode 1",
    "RuntimeError: NCCL communicator was aborted on rank",
)


def _filled(record_type: str) -> dict[str, Any]:
    """Defaults of every optional field of a record type, so records are complete."""
    out: dict[str, Any] = {}
    for f in default_schemas().records[record_type].json["fields"]:
        if "default" in f:
            default = f["default"]
            out[f["name"]] = type(default)(default) if isinstance(default, list | dict) else default
    return out


_DEFAULTS = {name: _filled(name) for name in default_schemas().records}


def gpu_uuid(cluster: str, node: str, index: int) -> str:
    """A stable NVML-style UUID for a GPU slot (hardware identity: independent of the seed)."""
    h = hashlib.sha1(f"{cluster}/{node}/{index}".encode()).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


@dataclass(frozen=True)
class _Rank:
    rank: int
    local_rank: int
    node: str
    gpu_index: int
    gpu_uuid: str


@dataclass
class _Holding:
    """A process holding a GPU over [start, end): its pid shows in the GPU's samples."""

    start: float
    end: float
    pid: int
    job_id: str
    run_id: str
    rank: int | None  # None for a process that belongs to no rank (foreign)
    mem_bytes: int


@dataclass
class _Effect:
    """Where a fault shows in the data (seconds from the scenario start)."""

    start: float
    end: float | None
    detail: dict[str, Any] = field(default_factory=dict)


class Simulation:
    """The result of `simulate`: events in event-time order and the labels of the injected faults."""

    def __init__(self, scenario: Scenario, seed: int, progress: Progress | None = None) -> None:
        self.scenario = scenario
        self.seed = seed
        self._progress = progress
        self._events: list[Event] | None = None
        self._labels: list[dict[str, Any]] = []

    def _run(self) -> list[Event]:
        if self._events is None:
            engine = _Engine(self.scenario, self.seed, self._progress)
            self._events = engine.run()
            self._labels = engine.labels()
        return self._events

    def events(self) -> Iterator[Event]:
        """Every event, sorted by event time (ties in a fixed, seed-determined order)."""
        return iter(self._run())

    @property
    def labels(self) -> list[dict[str, Any]]:
        """One label per injected fault (see docs/simulator.md for the fields)."""
        self._run()
        return self._labels


def simulate(scenario: Scenario, seed: int = 0, *, progress: Progress | None = None) -> Simulation:
    """Simulate a scenario; nothing is generated until `events()` or `labels` is read."""
    return Simulation(scenario, seed, progress)


# Data-path faults (issue 23) that change what a rank's DataLoaderSamples report.
_LOADER_FAULTS = frozenset(
    {
        "slow_reads", "slow_reads_node", "slow_reads_blip", "cache_collapse", "cache_dip", "file_open_stall",
        "file_open_blip", "loader_workers_die", "loader_workers_blip",
    }
)  # fmt: skip
# Faults that end a rank (issue 23): the job restarts from its last verified checkpoint.
_CRASH_FAULTS = ("rank_crash", "storage_timeout")
_CRASH_TEXT = {
    "exception": "RuntimeError: shape '[4096, 32, 128]' is invalid for input of size 4194305",
    "exit": "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: exitcode -9",
    "cuda_oom": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.00 GiB. GPU 0 has a total"
    " capacity of 79.10 GiB of which 1.91 GiB is free.",
    "oom": "the kernel's OOM killer took the process (host memory exhausted)",
    "storage_timeout": "data loader: TimeoutError: GET s3://datasets/shard-0417.tar: read timed out after 120 s",
}

# Faults of a node (or of one of its GPUs) that every job on the node suffers.
_SHARED_NODE_FAULTS = frozenset(
    {"xid_error", "ecc_uncorrectable", "host_oom", "ib_degradation", "storage_slowdown", "agent_silent"}
)


def _window_overlaps(a0: float, a1: float | None, b0: float, b1: float | None) -> bool:
    return (a1 is None or b0 <= a1) and (b1 is None or a0 <= b1)


def _end_of(fault: FaultSpec) -> float:
    """Where a fault's window closes (infinity when it lasts to the end)."""
    return _NEVER if fault.end is None else fault.end


def _lognormal(rng: random.Random, sigma: float) -> float:
    return math.exp(rng.gauss(0.0, sigma)) if sigma > 0 else 1.0


def _magnitude_at(fault: FaultSpec, t: float, default: float) -> float:
    """A fault's factor at `t`: its magnitude, reached linearly from 1 (no effect) over `ramp` seconds."""
    full = fault.magnitude or default
    ramp = float(fault.params.get("ramp") or 0.0)
    if ramp <= 0 or t >= fault.start + ramp:
        return full
    return 1.0 + (full - 1.0) * max(0.0, t - fault.start) / ramp


def _extra_at(fault: FaultSpec, t: float, default: float) -> float:
    """An additive fault's amount at `t` (extra data wait): 0 at the start, full after `ramp`."""
    full = fault.magnitude or default
    ramp = float(fault.params.get("ramp") or 0.0)
    if ramp <= 0 or t >= fault.start + ramp:
        return full
    return full * max(0.0, t - fault.start) / ramp


class _Engine:
    def __init__(self, scenario: Scenario, seed: int, progress: Progress | None) -> None:
        self.sc = scenario
        self.seed = seed
        self.progress = progress
        self.iv = scenario.telemetry.interval
        self.out: list[tuple[int, int, Event]] = []
        self.acc: dict[tuple[str, int, int], list[float]] = {}
        self.disk_write: dict[tuple[str, int], float] = {}
        self.holdings: dict[tuple[str, int], list[_Holding]] = {}
        # GPUs allocated to a job that no rank runs on: (node, gpu) -> [(start, end, job, run)] (issue 23)
        self.allocated: dict[tuple[str, int], list[tuple[float, float, str, str]]] = {}
        self.effects: dict[int, _Effect] = {}
        node_rng = self._rng("phase")
        # Node agents are not synchronised: each samples on its own phase.
        self.phase = {n: round(node_rng.uniform(0.2, self.iv - 0.2), 3) for n in scenario.cluster.node_names}
        self.layouts = {job.id: self._layout(job) for job in scenario.jobs}
        self.targets = [self._target(i, f) for i, f in enumerate(scenario.faults)]

    # ------------------------------------------------------------------ helpers

    def _rng(self, component: str) -> random.Random:
        return random.Random(f"{self.seed}/{component}")

    def _ms(self, t: float) -> int:
        return self.sc.start_ms + round(t * 1000)

    def emit(self, t: float, record_type: str, **fields: Any) -> None:
        record = dict(_DEFAULTS[record_type])
        record["ts"] = self._ms(t)
        record.update(fields)
        self.out.append((record["ts"], len(self.out), Event(record_type, record)))
        if self.progress is not None and len(self.out) % 20000 == 0:
            self.progress(len(self.out), t)

    def _layout(self, job: JobSpec) -> list[_Rank]:
        ranks = []
        for n, node in enumerate(job.nodes):
            for g, index in enumerate(job.gpu_indices):
                ranks.append(
                    _Rank(
                        n * job.gpus_per_node + g, g, node, index, gpu_uuid(self.sc.cluster.name, node, index)
                    )
                )
        return ranks

    def _target(self, index: int, fault: FaultSpec) -> tuple[str | None, int | None, int | None]:
        """(node, gpu_index, rank) a fault hits; None where the fault is wider."""
        layout = self.layouts[fault.job]
        kind = FAULTS[fault.type]
        if "spare_gpu" in kind.params:  # a GPU of the job's allocation no rank uses
            return fault.node or layout[0].node, int(fault.params["spare_gpu"]), None
        if fault.rank is not None:
            r = layout[fault.rank]
            return r.node, r.gpu_index if kind.scope in ("rank", "gpu") else None, fault.rank
        if fault.node is not None and fault.gpu is not None:
            rank = next((r.rank for r in layout if r.node == fault.node and r.gpu_index == fault.gpu), None)
            return fault.node, fault.gpu, rank
        if kind.scope == "node":
            return fault.node or layout[0].node, None, None
        return None, None, None

    def _faults(self, job_id: str, *types: str) -> list[tuple[int, FaultSpec]]:
        return [(i, f) for i, f in enumerate(self.sc.faults) if f.job == job_id and f.type in types]

    def _spread(
        self, node: str, gpu: int, slot: int, start: float, dur: float, amount: float | None = None
    ) -> None:
        """Add `amount` (default: the seconds) of a phase over the telemetry intervals it covers."""
        if dur <= 0:
            return
        total = dur if amount is None else amount
        phase, iv = self.phase[node], self.iv
        end = min(start + dur, self.sc.duration + iv)
        b = int((start - phase) // iv)
        while True:
            lo = phase + b * iv
            hi = lo + iv
            seg = min(end, hi) - max(start, lo)
            if seg > 0:
                vec = self.acc.get((node, gpu, b))
                if vec is None:
                    vec = self.acc[(node, gpu, b)] = [0.0] * _SLOTS
                vec[slot] += total * seg / dur
            if end <= hi:
                break
            b += 1

    def _count_step(self, node: str, gpu: int, t: float) -> None:
        b = int((t - self.phase[node]) // self.iv)
        vec = self.acc.get((node, gpu, b))
        if vec is None:
            vec = self.acc[(node, gpu, b)] = [0.0] * _SLOTS
        vec[_STEPS] += 1

    def _add_disk_write(self, node: str, start: float, dur: float, nbytes: float) -> None:
        phase, iv = self.phase[node], self.iv
        end = start + dur
        b = int((start - phase) // iv)
        while phase + b * iv < end:
            lo, hi = phase + b * iv, phase + (b + 1) * iv
            seg = min(end, hi) - max(start, lo)
            if seg > 0:
                self.disk_write[(node, b)] = self.disk_write.get((node, b), 0.0) + nbytes * seg / dur
            b += 1

    # ------------------------------------------------------------------ run

    def run(self) -> list[Event]:
        for job in self.sc.jobs:
            if job.start < self.sc.duration:
                _JobRun(self, job).run()
        self._telemetry()
        self.out.sort(key=lambda item: (item[0], item[1]))
        if self.progress is not None:
            self.progress(len(self.out), self.sc.duration)
        return [e for _, _, e in self.out]

    # ------------------------------------------------------------------ telemetry pass

    def _telemetry(self) -> None:
        sc = self.sc
        faults_by_gpu: dict[tuple[str, int], list[tuple[int, FaultSpec]]] = {}
        faults_by_node: dict[str, list[tuple[int, FaultSpec]]] = {}
        for i, f in enumerate(sc.faults):
            node, gidx, _ = self.targets[i]
            if node is None:
                continue
            if gidx is not None:
                faults_by_gpu.setdefault((node, gidx), []).append((i, f))
            faults_by_node.setdefault(node, []).append((i, f))
        for i, f in enumerate(sc.faults):
            node, gidx, _ = self.targets[i]
            if f.type in ("foreign_process", "contention") and node is not None and gidx is not None:
                rng = self._rng(f"foreign/{i}")
                pid = f.params.get("pid") or rng.randint(200_000, 400_000)
                end = _end_of(f)
                self.holdings.setdefault((node, gidx), []).append(
                    _Holding(f.start, end, pid, "", "", None, int(f.params["mem_gib"] * _GIB))
                )
                self.effects[i] = _Effect(f.start, f.end, {"pid": pid})
        self._resource_holdings()
        silent: dict[str, list[tuple[int, FaultSpec]]] = {}
        for i, f in enumerate(sc.faults):
            if f.type == "agent_silent":
                silent.setdefault(self.targets[i][0] or "", []).append((i, f))
        for n_index, node in enumerate(sc.cluster.node_names):
            self._node_telemetry(
                node, n_index, faults_by_gpu, faults_by_node.get(node, []), silent.get(node, [])
            )
            if self.progress is not None:
                self.progress(len(self.out), sc.duration * (n_index + 1) / sc.cluster.nodes)
        self._sdk_samples()

    def _resource_holdings(self) -> None:
        """Processes on GPUs outside a job's ranks (issue 23): a rank's stray context, a stranger, a helper."""
        for i, f in enumerate(self.sc.faults):
            if f.type in ("gpu_outside_allocation", "foreign_on_free_gpu") and f.rank is not None:
                rank = self.layouts[f.job][f.rank]
                index = int(f.params["to_gpu"])
                end = _end_of(f)
                mem = int(float(f.params["mem_gib"]) * _GIB)
                if f.type == "gpu_outside_allocation":
                    # The rank's own process (its pid of the run live at the fault's start) opens a context there.
                    own = [
                        h
                        for h in self.holdings.get((rank.node, rank.gpu_index), ())
                        if h.rank == f.rank and h.job_id == f.job and h.start <= max(f.start, h.start) < h.end
                    ]
                    live = [h for h in own if h.start <= f.start < h.end] or own
                    if not live:
                        continue
                    h = live[0]
                    start, stop = max(f.start, h.start + 5.0), min(end, h.end)
                    self.holdings.setdefault((rank.node, index), []).append(
                        _Holding(start, stop, h.pid, f.job, h.run_id, None, mem)
                    )
                    self.effects[i] = _Effect(start, f.end, {"pid": h.pid, "to_gpu": index})
                else:
                    pid = self._rng(f"stranger/{i}").randint(200_000, 400_000)
                    self.holdings.setdefault((rank.node, index), []).append(
                        _Holding(f.start, end, pid, "", "", None, mem)
                    )
                    self.effects[i] = _Effect(f.start, f.end, {"pid": pid, "to_gpu": index})
            elif f.type in ("gpu_allocated_idle", "gpu_allocated_helper"):
                node, spare, _ = self.targets[i]
                assert node is not None and spare is not None
                job = self.sc.job(f.job)
                end = min(_end_of(f), job.end if job.end is not None else _NEVER)
                self.allocated.setdefault((node, spare), []).append((job.start, end, f.job, f"{f.job}-r0"))
                if f.type == "gpu_allocated_helper":
                    # An evaluation server of the job: its own process, busy about 40 % of the time.
                    pid = self._rng(f"helper/{i}").randint(100_000, 190_000)
                    begin = job.start + job.init_time + 20.0
                    stop = min(end, self.sc.duration)
                    self.holdings.setdefault((node, spare), []).append(
                        _Holding(begin, stop, pid, f.job, f"{f.job}-r0", None, 30 * _GIB)
                    )
                    if stop > begin:
                        self._spread(node, spare, _COMPUTE, begin, stop - begin, 0.4 * (stop - begin))
                    self.effects[i] = _Effect(begin, f.end, {"pid": pid})

    def _node_telemetry(
        self,
        node: str,
        n_index: int,
        faults_by_gpu: dict[tuple[str, int], list[tuple[int, FaultSpec]]],
        node_faults: list[tuple[int, FaultSpec]],
        silent: list[tuple[int, FaultSpec]],
    ) -> None:
        sc, iv, gc = self.sc, self.iv, self.sc.cluster.gpu_of(node)
        rng = self._rng(f"telemetry/{node}")
        phase = self.phase[node]
        gpus = sc.cluster.gpus_per_node
        temps = [30.0 + rng.uniform(0, 4) for _ in range(gpus)]
        energy = [rng.randint(10**9, 5 * 10**9) for _ in range(gpus)]
        ecc_c = [rng.randint(0, 3) for _ in range(gpus)]
        ecc_u = [0] * gpus
        remap_u = [0] * gpus
        uuids = [gpu_uuid(sc.cluster.name, node, g) for g in range(gpus)]
        oom_kills = rng.randint(0, 2)
        ib_errors = [0]  # the port's cumulative error counter; samples carry its increments
        swap = 0.0
        load5 = load15 = 0.0
        host_total = sc.cluster.host_memory_gib * _GIB
        last_seen: float | None = None
        gap_open: dict[int, bool] = {}
        # Instant GPU events (XID, ECC) per GPU in time order, applied at the tick that covers them.
        instants: dict[int, list[tuple[float, int, FaultSpec]]] = {}
        for (nd, g_index), lst in sorted(faults_by_gpu.items()):
            if nd != node:
                continue
            for i, f in lst:
                if f.type in ("xid_error", "ecc_uncorrectable", "ecc_correctable"):
                    instants.setdefault(g_index, []).append((f.start, i, f))
        for moments in instants.values():
            moments.sort(key=lambda x: (x[0], x[1]))
        k = 1
        while True:
            tick = phase + k * iv
            if tick >= sc.duration:
                break
            b = k - 1
            k += 1
            is_silent = False
            for i, f in silent:
                end = _end_of(f)
                if f.start <= tick < end:
                    is_silent = True
                    if not gap_open.get(i):
                        gap_open[i] = True
                        self.effects[i] = _Effect(last_seen if last_seen is not None else f.start, None, {})
                elif tick >= end and gap_open.get(i):
                    gap_open[i] = False
                    self.effects[i].end = tick
            host_busy = 0.0
            held_gpus = 0
            comm_frac = 0.0
            node_jobs: set[str] = set()  # what an attributing agent stamps on the HostSample
            for g in range(gpus):
                vec = self.acc.get((node, g, b)) or [0.0] * _SLOTS
                holds = [h for h in self.holdings.get((node, g), ()) if h.start <= tick < h.end]
                node_jobs.update(h.job_id for h in holds if h.job_id)
                fc, fm, fd = vec[_COMPUTE] / iv, vec[_COMM] / iv, vec[_DATA] / iv
                fk, fe, fs = vec[_CKPT] / iv, vec[_EVAL] / iv, vec[_SPIN] / iv
                fh = vec[_HUNG] / iv
                busy = min(1.0, fc + 0.97 * fm + 0.9 * fe + 0.3 * fk + fs + fh)
                # A kernel spinning on every SM draws more than NCCL's few spinning channel blocks
                # (0.45), less than dense tensor work (1.0).
                activity = min(1.0, fc + 0.4 * fm + 0.75 * fe + 0.15 * fk + 0.45 * fs + 0.7 * fh)
                has_job = any(h.rank is not None for h in holds)
                if has_job:
                    held_gpus += 1
                    host_busy += fc + fd + fm
                    comm_frac += fm
                limit = gc.power_limit_w
                clock_max = gc.sm_clock_max_mhz
                power = (
                    gc.idle_power_w
                    + (15.0 if holds else 0.0)
                    + (gc.busy_power_w - gc.idle_power_w) * activity
                )
                power *= _lognormal(rng, 0.02)
                util = max(0.0, min(100.0, 100 * busy + rng.gauss(0, 1.2))) if busy > 0.01 else 0.0
                sm_clock = clock_max - rng.randint(0, 45) if util > 5 else _IDLE_SM_MHZ + rng.randint(0, 20)
                reasons = _GPU_IDLE if util <= 5 else (_SW_POWER_CAP if rng.random() < 0.03 else 0)
                temp_target = 28.0 + 0.068 * power
                mem_used = int(0.45 * _GIB) + sum(h.mem_bytes for h in holds)
                if has_job:
                    mem_used = int(mem_used * (1 + rng.gauss(0, 0.002)))
                xid: int | None = None
                for _, f in faults_by_gpu.get((node, g), ()):
                    end = _end_of(f)
                    active = f.start <= tick < end
                    if f.type == "straggler_gpu" and active:
                        m = _magnitude_at(f, tick, 1.5)
                        sm_clock = int(clock_max / m) + rng.randint(-15, 15)
                        if f.params.get("variant") == "degraded":
                            # A degraded card or PCIe link: slow, with no clock, power or throttle sign.
                            sm_clock = clock_max - rng.randint(0, 45) if util > 5 else sm_clock
                        elif f.params.get("variant") == "power":
                            limit = round(gc.power_limit_w / m**1.6, 1)
                            power = min(power, limit * (1 - abs(rng.gauss(0, 0.01))))  # the cap holds
                            reasons = _SW_POWER_CAP | _HW_POWER_BRAKE
                        else:
                            power *= m**-0.6
                            temp_target = 88.0 + rng.uniform(0, 3)
                            reasons = _SW_THERMAL | _HW_THERMAL | _HW_SLOWDOWN
                    elif f.type == "gpu_memory_pressure" and active and holds:
                        frac = min(0.999, (f.magnitude or 0.985) + rng.gauss(0, 0.002))
                        mem_used = int(gc.memory_bytes * frac)
                mem_used = min(mem_used, gc.memory_bytes)
                pending_instants = instants.get(g, [])
                while pending_instants and pending_instants[0][0] < tick:
                    t0, i, f = pending_instants.pop(0)
                    if f.type == "ecc_uncorrectable":
                        ecc_u[g] += int(f.params.get("count", 1))
                        remap_u[g] += 1
                    elif f.type == "ecc_correctable":
                        ecc_c[g] += int(f.params.get("count", 1))  # single-bit: corrected, nothing remapped
                    xid = f.params.get("xid")
                    # A point event: it ends where it starts.
                    self.effects[i] = _Effect(t0, t0, {"xid": xid} if xid else {})
                    if xid is not None and not is_silent:
                        # The agent reports an XID immediately, between its regular samples.
                        state = {"util": util, "fm": fm, "fc": fc, "fd": fd, "mem_used": mem_used,
                                 "power": power, "limit": limit, "energy": energy[g], "temp": temps[g],
                                 "sm_clock": sm_clock, "reasons": reasons, "ecc_c": ecc_c[g],
                                 "ecc_u": ecc_u[g], "remap_u": remap_u[g], "fs": fs, "fe": fe, "fk": fk, "fh": fh,
                                 "tick": t0}  # fmt: skip
                        self.emit(
                            t0, "GpuSample", **self._gpu_fields(node, g, uuids[g], holds, state), xid=xid
                        )
                temps[g] += (temp_target - temps[g]) * (1 - math.exp(-iv / 60.0)) + rng.gauss(0, 0.3)
                energy[g] += int(power * iv * 1000)
                if rng.random() < 0.002:
                    ecc_c[g] += 1
                if not is_silent:
                    state = {"util": util, "fm": fm, "fc": fc, "fd": fd, "mem_used": mem_used,
                             "power": power, "limit": limit, "energy": energy[g], "temp": temps[g],
                             "sm_clock": sm_clock, "reasons": reasons, "ecc_c": ecc_c[g],
                             "ecc_u": ecc_u[g], "remap_u": remap_u[g], "fs": fs, "fe": fe, "fk": fk, "fh": fh,
                             "tick": tick}  # fmt: skip
                    fields = self._gpu_fields(node, g, uuids[g], holds, state)
                    self.emit(tick + g * 0.003, "GpuSample", **fields)
            # ---- host
            train = host_busy / gpus
            cpu = min(100.0, max(0.5, 3.0 + 38.0 * train + rng.gauss(0, 1.5)))
            load1 = sc.cluster.cpus * cpu / 100 * 1.05
            load5 += (load1 - load5) * (1 - math.exp(-iv / 300))
            load15 += (load1 - load15) * (1 - math.exp(-iv / 900))
            used = (48 + 42 * held_gpus) * _GIB * (1 + rng.gauss(0, 0.003))
            disk_w = self.disk_write.get((node, b), 0.0) / iv
            multi = comm_frac / max(1, held_gpus)
            net = (0.4e9 + 9.0e9 * multi) * _lognormal(rng, 0.05) if held_gpus else 2e6 * _lognormal(rng, 0.3)
            retrans = rng.uniform(0, 4)
            for i, f in node_faults:
                end = _end_of(f)
                if not f.start <= tick < end:
                    continue
                if f.type == "network_degradation":
                    retrans = float(f.params["retransmits"]) * _lognormal(rng, 0.25)
                    net /= f.magnitude or 2.0
                elif f.type == "host_oom":
                    avail_frac = rng.uniform(0.003, 0.012)
                    used = host_total * (1 - avail_frac)
                    swap = min(swap + rng.uniform(1, 3) * _GIB, 32 * _GIB)
                    target = int(f.params["oom_kills"])
                    done = self.effects.setdefault(i, _Effect(f.start, f.end, {"oom_kills": 0}))
                    if done.detail["oom_kills"] < target and rng.random() < 0.5:
                        done.detail["oom_kills"] += 1
                        oom_kills += 1
                        if f.params.get("rank_fault") and done.detail["oom_kills"] == 1:
                            self._oom_rank_fault(i, f, tick)
            if not any(f.type == "host_oom" and f.start <= tick < _end_of(f) for _, f in node_faults):
                swap = max(0.0, swap - 0.5 * _GIB)
            used = min(used, host_total * 0.999)
            if not is_silent:
                last_seen = tick + 0.05
                self.emit(
                    tick + 0.05,
                    "HostSample",
                    cluster=sc.cluster.name,
                    node=node,
                    cpu_util_pct=round(cpu, 2),
                    load1=round(load1, 2),
                    load5=round(load5, 2),
                    load15=round(load15, 2),
                    mem_used_bytes=int(used),
                    mem_available_bytes=int(host_total - used),
                    mem_total_bytes=host_total,
                    swap_used_bytes=int(swap),
                    disk_read_bytes_s=round(1.5e8 * train * _lognormal(rng, 0.1), 1),
                    disk_write_bytes_s=round(disk_w + 2e6 * _lognormal(rng, 0.3), 1),
                    net_rx_bytes_s=round(net, 1),
                    net_tx_bytes_s=round(net * 0.98 + disk_w, 1),
                    tcp_retrans_segs_s=round(retrans, 2),
                    open_files=12_000 + 350 * held_gpus + rng.randint(0, 200),
                    oom_kills=oom_kills,
                    **self._infiniband(node, tick, multi, held_gpus, ib_errors),
                    job_ids=sorted(node_jobs),
                )
        for i, f in silent:
            if i not in self.effects:
                self.effects[i] = _Effect(f.start, f.end, {})

    def _infiniband(
        self, node: str, tick: float, comm: float, held_gpus: int, errors: list[int]
    ) -> dict[str, Any]:
        """InfiniBand port counters of one HostSample: collective traffic, less and with errors under a fault.

        Its own random stream per node and tick, so the rest of the node's telemetry is unchanged.
        """
        rng = self._rng(f"ib/{node}/{round(tick * 1000)}")
        multi_node = any(node in j.nodes and len(j.nodes) > 1 for j in self.sc.jobs)
        rate = (
            (2.0e10 * comm * _lognormal(rng, 0.05))
            if held_gpus and multi_node
            else 1e5 * _lognormal(rng, 0.3)
        )
        before = errors[0]
        for i, f in enumerate(self.sc.faults):
            if f.type == "ib_degradation" and self.targets[i][0] == node and f.start <= tick < _end_of(f):
                m = _magnitude_at(f, tick, 2.0)
                rate /= m
                errors[0] += int((m - 1.0) * 40 * _lognormal(rng, 0.3)) + 1
        return {
            "ib_rx_bytes_s": round(rate, 1),
            "ib_tx_bytes_s": round(rate * 0.99, 1),
            # The contract carries the increments of the interval (the agent differences the
            # kernel's cumulative port counters the same way).
            "ib_errors": errors[0] - before,
        }

    def _oom_rank_fault(self, index: int, fault: FaultSpec, t: float) -> None:
        node = self.targets[index][0]
        layout = self.layouts[fault.job]
        rank = next(r for r in layout if r.node == node)
        self.emit(
            t,
            "RankFault",
            job_id=fault.job,
            run_id=f"{fault.job}-r0",
            rank=rank.rank,
            node=node,
            kind="oom",
            detail="DataLoader worker (pid 51234) is killed by signal: Killed.",
            exit_code=None,
        )

    def _gpu_fields(
        self, node: str, g: int, uuid: str, holds: list[_Holding], state: dict[str, Any]
    ) -> dict[str, Any]:
        """The fields of one GpuSample from the interval's derived state."""
        gc = self.sc.cluster.gpu_of(node)
        util, fm, fc, fd = state["util"], state["fm"], state["fc"], state["fd"]
        allocated: tuple[str | None, str | None] = (None, None)
        for start, end, job_id, run_id in self.allocated.get((node, g), ()):
            if start <= state["tick"] < end:
                allocated = (job_id, run_id)
        return {
            "cluster": self.sc.cluster.name,
            "node": node,
            "gpu_index": g,
            "gpu_uuid": uuid,
            "gpu_name": gc.product,
            "gpu_util_pct": round(util, 1),
            "mem_util_pct": round(util * 0.58, 1),
            "mem_used_bytes": state["mem_used"],
            "mem_total_bytes": gc.memory_bytes,
            "power_w": round(state["power"], 1),
            "power_limit_w": state["limit"],
            "energy_mj": state["energy"],
            "temp_gpu_c": round(state["temp"], 1),
            "temp_mem_c": round(state["temp"] + 6.0, 1),
            "sm_clock_mhz": state["sm_clock"],
            "mem_clock_mhz": gc.mem_clock_mhz if util > 5 else 1593,
            "sm_clock_max_mhz": gc.sm_clock_max_mhz,
            "clock_event_reasons": state["reasons"],
            "ecc_corrected": state["ecc_c"],
            "ecc_uncorrected": state["ecc_u"],
            "remapped_rows_correctable": 0,
            "remapped_rows_uncorrectable": state["remap_u"],
            "pcie_tx_bytes_s": int(3e8 * (fc + fd)),
            "pcie_rx_bytes_s": int(2.2e9 * (fc + fd)),
            "pcie_replay_count": 0,
            "nvlink_tx_bytes_s": int(1.1e11 * fm + 1.5e10 * fc),
            "nvlink_rx_bytes_s": int(1.1e11 * fm + 1.5e10 * fc),
            "pids": [h.pid for h in holds],
            # As an attributing agent stamps it: the job whose process holds the GPU (foreign
            # processes, which belong to no job, leave it null), else the job the scheduler
            # allocated the GPU to (an allocated GPU no rank runs on).
            "job_id": next((h.job_id for h in holds if h.job_id), None) or allocated[0],
            "run_id": next((h.run_id for h in holds if h.job_id), None) or allocated[1],
            **(self._gpm_fields(state) if gc.gpm else {}),
        }

    def _gpm_fields(self, state: dict[str, Any]) -> dict[str, Any]:
        """GPM activity of the interval (the caller asks on Hopper-class GPUs only), from the time in each phase.

        Compute keeps most SMs and the tensor pipes busy; a collective moving data keeps a few SMs
        and some DRAM busy; one spinning while it waits for a peer keeps a few SMs busy and nothing
        else; a hung kernel (one that never returns) keeps its blocks on every SM with no tensor
        work and hardly any DRAM traffic. No random draw: the other records of a scenario stay
        exactly as they were.
        """
        fc, fm, fs = state["fc"], state["fm"], state["fs"]
        fe, fk, fh = state["fe"], state["fk"], state.get("fh", 0.0)

        def pct(x: float) -> float:
            return round(100.0 * min(1.0, max(0.0, x)), 1)

        return {
            "sm_active_pct": pct(0.93 * fc + 0.16 * fm + 0.15 * fs + 0.85 * fe + 0.1 * fk + 0.95 * fh),
            "sm_occupancy_pct": pct(0.42 * fc + 0.04 * fm + 0.03 * fs + 0.35 * fe + 0.02 * fk + 0.25 * fh),
            "tensor_active_pct": pct(0.62 * fc + 0.55 * fe),
            "dram_active_pct": pct(0.48 * fc + 0.3 * fm + 0.02 * fs + 0.4 * fe + 0.2 * fk + 0.03 * fh),
        }

    def _sdk_samples(self) -> None:
        """DataLoaderSample / CollectiveSample per live rank per interval (from the training SDK)."""
        tel = self.sc.telemetry
        if not (tel.dataloader_samples or tel.collective_samples):
            return
        iv = self.iv
        for (node, g), holds in sorted(self.holdings.items()):
            for h in holds:
                if h.rank is None:
                    continue
                rng = self._rng(f"sdk/{h.run_id}/{h.rank}")
                job = next(j for j in self.sc.jobs if j.id == h.job_id)
                phase = self.phase[node]
                k = max(1, int((h.start - phase) // iv) + 2)
                while True:
                    tick = phase + k * iv
                    if tick >= min(h.end, self.sc.duration):
                        break
                    vec = self.acc.get((node, g, k - 1)) or [0.0] * _SLOTS
                    k += 1
                    t = tick + 0.1 + h.rank * 0.001
                    steps = int(vec[_STEPS])
                    if tel.dataloader_samples:
                        starving = vec[_DATA] / iv > 0.1
                        self.emit(
                            t,
                            "DataLoaderSample",
                            job_id=h.job_id,
                            run_id=h.run_id,
                            rank=h.rank,
                            node=node,
                            interval_s=iv,
                            batches=steps,
                            wait_s=round(vec[_DATA], 4),
                            queue_depth=rng.randint(0, 1)
                            if starving
                            else max(0, 2 * job.dataloader_workers - rng.randint(0, 3)),
                            workers=self._live_workers(job, h.rank, node, t),
                            workers_expected=job.dataloader_workers,
                            **(
                                self._loader_io(job, h.run_id, h.rank, steps, vec[_DATA], node, t)
                                | self._loader_errors(h.job_id, h.rank, t)
                            ),
                        )
                    if tel.collective_samples:
                        time_s = vec[_COMM] + vec[_SPIN] + vec[_BLOCKED]
                        nbytes = steps * _GRAD_BYTES
                        world = job.world_size
                        bus = (
                            nbytes / time_s / 1e9 * 2 * (world - 1) / world if time_s > 0 and nbytes else None
                        )
                        self.emit(
                            t + 0.0005,
                            "CollectiveSample",
                            job_id=h.job_id,
                            run_id=h.run_id,
                            rank=h.rank,
                            node=node,
                            op="allreduce",
                            interval_s=iv,
                            count=steps * 48,
                            bytes=nbytes,
                            time_s=round(time_s, 4),
                            bus_bw_gbps=None if bus is None else round(bus, 2),
                        )

    def _loader_faults(self, job: JobSpec, rank: int, node: str, t: float) -> list[tuple[int, FaultSpec]]:
        """The data-path faults (issue 23) acting on a rank's loader at `t` (rank ones by rank, node ones by node)."""
        found = []
        for i, f in enumerate(self.sc.faults):
            if f.type not in _LOADER_FAULTS or f.job != job.id or not f.start <= t < _end_of(f):
                continue
            scope = FAULTS[f.type].scope
            if (scope == "rank" and f.rank == rank) or (scope == "node" and self.targets[i][0] == node):
                self.effects.setdefault(i, _Effect(f.start, f.end, {}))
                found.append((i, f))
        return found

    def _live_workers(self, job: JobSpec, rank: int, node: str, t: float) -> int:
        """Loader workers alive: the configured ones, fewer under a loader_workers fault."""
        live = job.dataloader_workers
        for _, f in self._loader_faults(job, rank, node, t):
            if f.type in ("loader_workers_die", "loader_workers_blip"):
                live = min(live, int(f.magnitude or 0))
        return live

    def _loader_io(
        self,
        job: JobSpec,
        run_id: str,
        rank: int,
        batches: int,
        wait_s: float,
        node: str = "",
        t: float = 0.0,
    ) -> dict[str, Any]:
        """What `wrap_loader` and a dataset's counters report: batch prep time, reads, cache hits, opens.

        A loader keeping up prepares a batch in about half the time its workers have for it; one
        that starves the step (data wait above 10 % of the interval) takes longer than that, reads
        slower and misses its cache more. A data-path fault of issue 23 shows its own signature
        instead (slower reads, a lost cache, throttled opens), so each is told apart. Drawn from its
        own random stream (other records unchanged).
        """
        rngs = self.__dict__.setdefault("_loader_rngs", {})
        rng = rngs.get((run_id, rank))
        if rng is None:
            rng = rngs[(run_id, rank)] = self._rng(f"loader/{run_id}/{rank}")
        if batches <= 0:
            return {}
        iv = self.iv
        faults = self._loader_faults(job, rank, node, t)
        starving = wait_s / iv > 0.1 and not faults
        # The time the loop gives each batch while it trains (not the interval's: a pause for an
        # evaluation or a checkpoint leaves the workers idle, it does not make batches slower).
        per_batch = job.step_time
        budget = per_batch * job.dataloader_workers  # what the workers together have per batch
        prep = budget * (1.0 + wait_s / iv if starving else 0.5) * _lognormal(rng, 0.1)
        samples = job.global_batch_size // max(1, job.world_size) if job.global_batch_size else 4
        latency = 0.004 * (4.0 if starving else 1.0) * _lognormal(rng, 0.2)
        cache = (0.6 if starving else 0.92) * _lognormal(rng, 0.03)
        opens = batches * samples / 64 / iv  # 64 samples per shard file
        for _, f in faults:
            m = f.magnitude if f.magnitude is not None else 1.0
            if f.type.startswith("slow_reads"):
                latency *= m
                prep *= 1.0 + 0.3 * (m - 1.0)  # fetching is part of preparing a batch
            elif f.type in ("cache_collapse", "cache_dip"):
                cache *= m / 0.92
                latency *= 1.3  # misses go to remote storage
            elif f.type.startswith("file_open"):
                opens *= m
        return {
            "batch_prep_s": round(prep, 4),
            "read_bytes_s": round(batches * samples * job.seq_len * 2 / iv, 1),  # int16 token ids
            "read_latency_s": round(latency, 5),
            "cache_hit_ratio": round(min(1.0, cache), 3),
            "file_opens_s": round(opens, 2),
            "errors": 0,
            "file_open_errors": 0,
        }

    def _loader_errors(self, job_id: str, rank: int, t: float) -> dict[str, Any]:
        """errors / file_open_errors of a DataLoaderSample under the data_errors faults (none: fields stay null)."""
        for i, f in self._faults(job_id, "data_errors", "data_errors_transient"):
            if f.rank == rank and f.start <= t < _end_of(f):
                n = max(1, int(f.magnitude or 1))
                self.effects.setdefault(i, _Effect(f.start, f.end, {"errors_per_sample": n}))
                return {"errors": n, "file_open_errors": n}
        for i, f in self._faults(job_id, "storage_retry"):
            # One read timed out and was retried: the sample that covers it counts one error.
            if f.rank == rank and f.start <= t < f.start + self.iv:
                self.effects.setdefault(i, _Effect(f.start, f.start, {"errors": 1}))
                return {"errors": 1, "file_open_errors": 0}
        return {}

    # ------------------------------------------------------------------ labels

    def labels(self) -> list[dict[str, Any]]:
        out = []
        for i, f in enumerate(self.sc.faults):
            if f.start >= self.sc.duration:
                continue  # cut off by a shorter --duration: not in the data, so not labelled
            kind = FAULTS[f.type]
            job = self.sc.job(f.job)
            node, gidx, rank = self.targets[i]
            # Faults whose effect the engine did not pin down show over their configured window.
            effect = self.effects.get(i) or _Effect(f.start, f.end, {})
            also = list(kind.also)
            if f.type == "grad_spike" and (f.duration or 0) > 60:
                also.append("loss_divergence")
            if f.type == "checkpoint_never_completes" and effect.end is None:
                also.remove("checkpoint_failed")
            if f.type == "host_oom" and f.params.get("rank_fault"):
                also.append("rank_failed")  # the OOM-killed rank
            uuid = None
            if gidx is not None and node is not None:
                uuid = gpu_uuid(self.sc.cluster.name, node, gidx)
            if kind.scope == "job":
                # A job-wide effect placed on one GPU (contention): the alert names the job, not the GPU.
                node, gidx, rank, uuid = None, None, None, None
            end = effect.end
            if end is not None and end >= self.sc.duration:
                end = None
            detail: dict[str, Any] = {"duration_s": f.duration}
            if f.magnitude is not None:
                detail["magnitude"] = f.magnitude
            detail |= {k: v for k, v in f.params.items()}
            detail |= effect.detail
            out.append(
                {
                    "fault": f.type,
                    "alert": kind.alert,
                    "also": also,
                    "job_id": f.job,
                    "node": node,
                    "rank": rank if kind.scope in ("rank", "gpu") else None,
                    "gpu_uuid": uuid,
                    "gpu_index": gidx,
                    "start": format_ts(self._ms(effect.start)),
                    "end": None if end is None else format_ts(self._ms(end)),
                    "layer": kind.layer,
                    "team": job.team,
                    "scenario": self.sc.name,
                    "detail": detail,
                }
            )
            out.extend(self._shared_node_labels(f, out[-1]))
        return out

    def _shared_node_labels(self, fault: FaultSpec, label: dict[str, Any]) -> list[dict[str, Any]]:
        """A node fault hits every job on the node: one more label per co-located job, with its team.

        The job is named by its node (it owns neither the faulty GPU nor a rank of the fault's job).
        """
        node = label["node"]
        if fault.type not in _SHARED_NODE_FAULTS or node is None:
            return []
        start = (parse_ts(label["start"]) - self.sc.start_ms) / 1000
        end = None if label["end"] is None else (parse_ts(label["end"]) - self.sc.start_ms) / 1000
        out = []
        for job in self.sc.jobs:
            if job.id == fault.job or node not in job.nodes:
                continue
            if not _window_overlaps(job.start, job.end, start, end):
                continue
            if fault.type == "ib_degradation" and len(job.nodes) == 1:
                continue  # NVLink inside the node: the IB port does not carry its collectives
            shared = dict(label)
            if fault.type == "storage_slowdown" and set(job.nodes) == {node}:
                # Every rank of this job waits alike: no straggler among them, the run slows
                # against its own history.
                shared |= {"alert": "throughput_drop", "also": ["baseline_deviation", *label["also"]]}
            shared |= {
                "job_id": job.id,
                "team": job.team,
                "rank": None,
                "gpu_uuid": None,
                "gpu_index": None,
                "detail": {**label["detail"], "shared_node_with": fault.job},
            }
            out.append(shared)
        return out


class _JobRun:
    """Walks one job through pending, runs, steps, checkpoints, evaluations and its faults."""

    def __init__(self, engine: _Engine, job: JobSpec) -> None:
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

    # ---------------------------------------------------------------- lifecycle

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

    def _restore_tests(self, t: float) -> None:
        """Restore-test faults: from their start, the latest verified checkpoint is restored and resumed once."""
        pending = getattr(self, "_restore_faults", None)
        if pending is None:  # looked up once per job: this runs after every step
            kinds = ("restore_test_failure", "restore_test_passed")
            pending = self._restore_faults = [(k, hit) for k in kinds if (hit := self._one(k)) is not None]
        for kind, found in pending:
            if found[0] in self.e.effects or t < found[1].start or self.last_verified is None:
                continue
            i, spec = found
            ckpt_id, step = self.last_verified
            ok = kind == "restore_test_passed"
            took = 180.0  # restore into a sandbox, resume 20 steps
            self.e.emit(
                t + took,
                "RestoreTest",
                job_id=self.job.id,
                run_id=self.run_id,
                checkpoint_id=ckpt_id,
                step=step,
                restored_model=True,
                restored_optimizer=ok,
                restored_scheduler=True,
                restored_data_position=True,
                steps_resumed=20 if ok else 0,
                loss_before=2.1,
                loss_after=2.11 if ok else None,
                loss_tolerance=0.05,
                code_version=self.job.model_version,
                runtime_version="torch 2.4.0 cuda 12.4",
                passed=ok,
                error=None if ok else str(spec.params["error"]),
                duration_s=took,
            )
            self.e.effects[i] = _Effect(t + took, None, {"checkpoint_id": ckpt_id})

    # ---------------------------------------------------------------- data path and validation faults

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

    def _evaluation_due(self, t: float) -> bool:
        """Whether an evaluation runs after this step: every `every_steps`, unless a validation fault says otherwise."""
        every = self.job.evaluation.every_steps
        late_at = getattr(self, "_late_at", None)
        if late_at is not None and self.step >= late_at:
            self._late_at = None
            return True
        if self.step % every:
            return False
        for i, f in self.e._faults(self.job.id, "validation_missing", "validation_late"):
            if t < f.start or not t < _end_of(f):
                continue
            if f.type == "validation_missing":
                self.e.effects.setdefault(i, _Effect(t, f.end, {"skipped_from_step": self.step - 1}))
                return False
            if i not in self.e.effects:
                delay = max(1, int(every * (f.magnitude or 0.3)))
                self._late_at = self.step + delay
                self.e.effects[i] = _Effect(t, None, {"delayed_steps": delay})
                return False
        return True

    def _validation_faults(self, t: float, val: float) -> float:
        """The validation loss under validation_divergence (rises, compounding) and validation_noise."""
        for i, f in self.e._faults(self.job.id, "validation_divergence", "validation_noise"):
            if not f.start <= t < _end_of(f) or not math.isfinite(val):
                continue
            self.e.effects.setdefault(i, _Effect(f.start, f.end, {}))
            if f.type == "validation_divergence":
                val *= math.exp((f.magnitude or 0.1) * (t - f.start) / 60.0)
            else:
                rng = getattr(self, "_val_rng", None)
                if rng is None:
                    rng = self._val_rng = self.e._rng(f"validation/{self.job.id}")
                val *= 1 + rng.gauss(0, f.magnitude or 0.005)
        return round(val, 5)

    # ---------------------------------------------------------------- the step loop

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
                started, done = self._checkpoint(t, dur, "ok")
                e.effects[i] = _Effect(started, done, {"checkpoint_duration_s": dur})
                self.next_ckpt = t + job.checkpoint.every
            elif stuck is not None and not stuck_done and t >= stuck[1].start:
                stuck_done = True
                i, f = stuck
                self._checkpoint(t, job.checkpoint.duration, "stuck", stuck_until=f.end)
                e.effects[i] = _Effect(t, f.end, {})
                self.next_ckpt = t + job.checkpoint.every
            elif (
                failing is not None
                and failing[1].start <= t < _end_of(failing[1])
                and (t >= self.next_ckpt or failing[0] not in e.effects)
            ):
                i, f = failing
                _, failed_at = self._checkpoint(
                    t, job.checkpoint.duration, "failed", error=str(f.params["error"])
                )
                eff = e.effects.setdefault(i, _Effect(t, failed_at, {"failed_checkpoints": 0}))
                eff.end = failed_at
                eff.detail["failed_checkpoints"] += 1
                self.next_ckpt = t + job.checkpoint.every
            elif t >= self.next_ckpt:
                if not (self.ckpt_stuck and stuck is not None and t < _end_of(stuck[1])):
                    self._checkpoint(t, job.checkpoint.duration * _lognormal(self.rng, 0.1), "ok")
                self.next_ckpt = t + job.checkpoint.every
            t = self._step(t)
            self._restore_tests(t)
            ev = job.evaluation
            if ev.every_steps and self._evaluation_due(t) and t < self.limit:
                t = self._evaluate(t)
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

    def _evaluate(self, t: float) -> float:
        job, e = self.job, self.e
        dur = job.evaluation.duration * _lognormal(self.rng, 0.05)
        for r in self.layout:
            e._spread(r.node, r.gpu_index, _EVAL, t, dur)
        loss, *_ = self._model(t, self.step)
        # An evaluation still running when the job's recording ends reports no end: its result
        # would come minutes after every other stream stopped (a co-located job looks stalled).
        finished = t + dur <= self.limit
        if e.sc.telemetry.evaluation_events:
            self._evaluation_events(t, dur, finished)
        if not finished:
            return t + dur
        val = loss * 1.03 if math.isfinite(loss) else loss
        val = self._validation_faults(t, val)
        e.emit(
            t + dur,
            "ValidationResult",
            job_id=job.id,
            run_id=self.run_id,
            step=self.step - 1,
            metrics={"val_loss": round(val, 5), "val_ppl": round(math.exp(min(val, 50.0)), 3)},
            duration_s=round(dur, 3),
        )
        return t + dur

    def _evaluation_events(self, t: float, dur: float, finished: bool = True) -> None:
        """EvaluationEvent started/completed around one evaluation pause (the SDK's evaluation context)."""
        common = {
            "job_id": self.job.id,
            "run_id": self.run_id,
            "rank": None,
            "evaluation_id": f"{self.run_id}-eval{self.step - 1:07d}",
            "step": self.step - 1,
            "name": "val",
        }
        # The producer expects the pass to take as long as the previous one (the configured length first).
        expected = self.last_eval_s if self.last_eval_s is not None else self.job.evaluation.duration
        self.e.emit(t, "EvaluationEvent", **common, phase="started", expected_duration_s=round(expected, 3))
        if finished:
            self.e.emit(
                t + dur - 0.001, "EvaluationEvent", **common, phase="completed", duration_s=round(dur, 3)
            )
        self.last_eval_s = dur

    def _checkpoint(
        self,
        t: float,
        dur: float,
        outcome: str,
        *,
        error: str | None = None,
        stuck_until: float | None = None,
    ) -> tuple[float, float]:
        """Start a checkpoint at `t`; the next step carries its blocking time. Returns (started, ended)."""
        job, e, rng = self.job, self.e, self.rng
        step = self.step
        ckpt_id = f"{self.run_id}-step{step:07d}"
        uri = f"{job.checkpoint.uri}/{job.id}/step_{step:07d}"
        common = {
            "job_id": job.id,
            "run_id": self.run_id,
            "rank": None,
            "checkpoint_id": ckpt_id,
            "step": step,
        }
        e.emit(t, "CheckpointEvent", **common, phase="started", uri=uri, version="dcp-2")
        keep = self._retention(t)
        if outcome == "ok":
            blocking = dur
            nbytes = int(job.checkpoint.bytes * (1 + rng.gauss(0, 0.002)))
            deleted: list[str] = []
            if keep is not None:
                # Retention keeps the newest `keep` checkpoints: saving this one deletes the oldest.
                self.retained.append(ckpt_id)
                deleted, self.retained = self.retained[:-keep], self.retained[-keep:]
            e.emit(
                t + dur,
                "CheckpointEvent",
                **common,
                phase="completed",
                uri=uri,
                bytes=nbytes,
                duration_s=round(dur, 3),
                version="dcp-2",
                retention_keep=keep,
                deleted=deleted,
            )
            verify = dur + rng.uniform(4.0, 12.0)
            checksum = hashlib.sha256(f"{ckpt_id}/{nbytes}".encode()).hexdigest()
            verify += self._verify_delay(t)
            failure = self._verify_failure(t + verify)
            if failure is not None:
                e.emit(
                    t + verify, "CheckpointEvent", **common, phase="verify_failed", uri=uri, bytes=nbytes,
                    duration_s=round(verify, 3), version="dcp-2", error=failure,
                )  # fmt: skip
                self.unverified.append(ckpt_id)
                for node in job.nodes:
                    e._add_disk_write(node, t, dur, nbytes / len(job.nodes))
                for r in self.layout:
                    e._spread(r.node, r.gpu_index, _CKPT, t, dur)
                self.pending_ckpt_s += dur
                return t, t + dur
            if self._unverified(t + verify) or self._retention_unverified(t + verify):
                # the verifier is gone when the check would run
                self.unverified.append(ckpt_id)
                for node in job.nodes:
                    e._add_disk_write(node, t, dur, nbytes / len(job.nodes))
                for r in self.layout:
                    e._spread(r.node, r.gpu_index, _CKPT, t, dur)
                self.pending_ckpt_s += dur
                return t, t + dur
            e.emit(
                t + verify,
                "CheckpointEvent",
                **common,
                phase="verified",
                uri=uri,
                bytes=nbytes,
                duration_s=round(verify, 3),
                version="dcp-2",
                checksum=checksum,
            )
            self.last_verified = (ckpt_id, step)
            self.last_verified_at = t + verify
            self.unverified = []
            for node in job.nodes:
                e._add_disk_write(node, t, dur, nbytes / len(job.nodes))
            ended = t + dur
        elif outcome == "failed":
            blocking = dur * rng.uniform(0.3, 0.6)
            e.emit(
                t + blocking,
                "CheckpointEvent",
                **common,
                phase="failed",
                uri=uri,
                duration_s=round(blocking, 3),
                version="dcp-2",
                error=error,
            )
            ended = t + blocking
        else:  # stuck: the in-loop snapshot returns, the background upload never finishes
            blocking = dur * 0.25
            self.ckpt_stuck = True
            ended = _NEVER
            if stuck_until is not None and stuck_until < e.sc.duration:
                e.emit(
                    stuck_until,
                    "CheckpointEvent",
                    **common,
                    phase="failed",
                    uri=uri,
                    duration_s=round(stuck_until - t, 3),
                    version="dcp-2",
                    error="checkpoint upload abandoned: no progress",
                )
                ended = stuck_until
        for r in self.layout:
            e._spread(r.node, r.gpu_index, _CKPT, t, blocking)
        self.pending_ckpt_s += blocking
        return t, ended

    def _retention(self, t: float) -> int | None:
        """The retention policy (checkpoints kept) of a job with a retention fault; marks when it exposes the job.

        A checkpoint starting while `keep - 1` (at least one) newer checkpoints wait unverified will,
        when it completes, delete the latest verified one: that is when the exposure begins.
        """
        found = self.e._faults(self.job.id, "checkpoint_retention_unverified", "checkpoint_retention_tight")
        if not found:
            return None
        i, f = found[0]
        keep = int(f.params["keep"])
        waiting = [c for c in self.unverified if c in self.retained]
        exposed = waiting and len(waiting) >= max(1, keep - 1) and f.start <= t
        if f.type == "checkpoint_retention_unverified" and self.last_verified is not None and exposed:
            self.e.effects.setdefault(i, _Effect(t, f.end, {"keep": keep, "unverified": list(waiting)}))
        return keep

    def _retention_unverified(self, t: float) -> bool:
        """True once a checkpoint_retention_unverified fault started: checkpoints are no longer verified."""
        return any(
            f.start <= t < _end_of(f)
            for _, f in self.e._faults(self.job.id, "checkpoint_retention_unverified")
        )

    def _verify_delay(self, t: float) -> float:
        """Extra seconds a slow verification takes (checkpoint_verify_slow)."""
        extra = 0.0
        for i, f in self._active("checkpoint_verify_slow", t):
            self.e.effects.setdefault(i, _Effect(t, f.end, {}))
            extra += float(f.params["delay"])
        return extra

    def _verify_failure(self, t: float) -> str | None:
        """The error of a verification that fails at `t` (checkpoint_verify_failure), else None."""
        for i, f in self._active("checkpoint_verify_failure", t):
            eff = self.e.effects.setdefault(i, _Effect(t, f.end, {"failed_verifications": 0}))
            eff.detail["failed_verifications"] += 1
            return str(f.params["error"])
        return None

    def _unverified(self, t: float) -> bool:
        """True while a checkpoint_unverified fault holds: checkpoints complete, no verification follows."""
        found = self._active("checkpoint_unverified", t)
        for i, f in found:
            verified_at = self.last_verified_at if self.last_verified_at is not None else self.job.start
            self.e.effects.setdefault(i, _Effect(verified_at, f.end, {}))
        return bool(found)

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
