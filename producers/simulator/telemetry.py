"""The telemetry pass per node: NVML-like GPU samples, host samples with InfiniBand counters, node faults.

Reads the phase time the job pass left per GPU and interval; GPU and node faults change what
the samples say. Each node draws from its own random stream.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from producers.simulator.common import (
    _CKPT,
    _COMM,
    _COMPUTE,
    _DATA,
    _EVAL,
    _GIB,
    _GPU_IDLE,
    _HUNG,
    _HW_POWER_BRAKE,
    _HW_SLOWDOWN,
    _HW_THERMAL,
    _IDLE_SM_MHZ,
    _SLOTS,
    _SPIN,
    _SW_POWER_CAP,
    _SW_THERMAL,
    _Effect,
    _end_of,
    _Holding,
    _lognormal,
    _magnitude_at,
    gpu_uuid,
)
from producers.simulator.scenario import FaultSpec

if TYPE_CHECKING:
    from producers.simulator.engine import Engine


__all__ = ["NodeTelemetry"]


class _TickLoad:
    """What a node's GPUs add up to in one interval, for its HostSample."""

    def __init__(self) -> None:
        self.busy = 0.0  # training share of the held GPUs (data, compute, collectives)
        self.held_gpus = 0
        self.comm = 0.0
        self.jobs: set[str] = set()  # what an attributing agent stamps on the HostSample


class NodeTelemetry:
    """One node's agent over the whole scenario: GPU and host counters, a GpuSample per GPU and a HostSample per tick."""

    def __init__(
        self,
        engine: Engine,
        node: str,
        faults_by_gpu: dict[tuple[str, int], list[tuple[int, FaultSpec]]],
        node_faults: list[tuple[int, FaultSpec]],
        silent: list[tuple[int, FaultSpec]],
    ) -> None:
        sc = engine.sc
        self.engine, self.node = engine, node
        self.faults_by_gpu, self.node_faults, self.silent = faults_by_gpu, node_faults, silent
        self.rng = rng = engine._rng(f"telemetry/{node}")
        self.gpus = gpus = sc.cluster.gpus_per_node
        self.temps = [30.0 + rng.uniform(0, 4) for _ in range(gpus)]
        self.energy = [rng.randint(10**9, 5 * 10**9) for _ in range(gpus)]
        self.ecc_c = [rng.randint(0, 3) for _ in range(gpus)]
        self.ecc_u = [0] * gpus
        self.remap_u = [0] * gpus
        self.uuids = [gpu_uuid(sc.cluster.name, node, g) for g in range(gpus)]
        self.oom_kills = rng.randint(0, 2)
        self.ib_errors = [0]  # the port's cumulative error counter; samples carry its increments
        self.swap = 0.0
        self.load5 = self.load15 = 0.0
        self.host_total = sc.cluster.host_memory_gib * _GIB
        self.last_seen: float | None = None
        self.gap_open: dict[int, bool] = {}
        # Instant GPU events (XID, ECC) per GPU in time order, applied at the tick that covers them.
        self.instants: dict[int, list[tuple[float, int, FaultSpec]]] = {}
        for (nd, g_index), lst in sorted(faults_by_gpu.items()):
            if nd != node:
                continue
            for i, f in lst:
                if f.type in ("xid_error", "ecc_uncorrectable", "ecc_correctable"):
                    self.instants.setdefault(g_index, []).append((f.start, i, f))
        for moments in self.instants.values():
            moments.sort(key=lambda x: (x[0], x[1]))

    def run(self) -> None:
        """Sample every interval, on the node's own phase, until the scenario ends."""
        engine = self.engine
        phase, iv = engine.phase[self.node], engine.iv
        k = 1
        while True:
            tick = phase + k * iv
            if tick >= engine.sc.duration:
                break
            b = k - 1
            k += 1
            is_silent = self._silent_at(tick)
            load = _TickLoad()
            for g in range(self.gpus):
                self._gpu_sample(g, tick, b, is_silent, load)
            self._host_sample(tick, b, is_silent, load)
        for i, f in self.silent:
            if i not in engine.effects:
                engine.effects[i] = _Effect(f.start, f.end, {})

    def _silent_at(self, tick: float) -> bool:
        """Whether an agent_silent fault mutes this tick; opens and closes the gap it leaves."""
        effects = self.engine.effects
        is_silent = False
        for i, f in self.silent:
            end = _end_of(f)
            if f.start <= tick < end:
                is_silent = True
                if not self.gap_open.get(i):
                    self.gap_open[i] = True
                    effects[i] = _Effect(self.last_seen if self.last_seen is not None else f.start, None, {})
            elif tick >= end and self.gap_open.get(i):
                self.gap_open[i] = False
                effects[i].end = tick
        return is_silent

    def _gpu_sample(self, g: int, tick: float, b: int, is_silent: bool, load: _TickLoad) -> None:
        """One GPU's interval: its reading from the phase times, its faults, XID/ECC events, its GpuSample."""
        engine, node, rng = self.engine, self.node, self.rng
        iv, gc = engine.iv, engine.sc.cluster.gpu_of(node)
        vec = engine.acc.get((node, g, b)) or [0.0] * _SLOTS
        holds = [h for h in engine.holdings.get((node, g), ()) if h.start <= tick < h.end]
        load.jobs.update(h.job_id for h in holds if h.job_id)
        fc, fm, fd = vec[_COMPUTE] / iv, vec[_COMM] / iv, vec[_DATA] / iv
        fk, fe, fs = vec[_CKPT] / iv, vec[_EVAL] / iv, vec[_SPIN] / iv
        fh = vec[_HUNG] / iv
        busy = min(1.0, fc + 0.97 * fm + 0.9 * fe + 0.3 * fk + fs + fh)
        # A kernel spinning on every SM draws more than NCCL's few spinning channel blocks
        # (0.45), less than dense tensor work (1.0).
        activity = min(1.0, fc + 0.4 * fm + 0.75 * fe + 0.15 * fk + 0.45 * fs + 0.7 * fh)
        has_job = any(h.rank is not None for h in holds)
        if has_job:
            load.held_gpus += 1
            load.busy += fc + fd + fm
            load.comm += fm
        power = gc.idle_power_w + (15.0 if holds else 0.0) + (gc.busy_power_w - gc.idle_power_w) * activity
        power *= _lognormal(rng, 0.02)
        util = max(0.0, min(100.0, 100 * busy + rng.gauss(0, 1.2))) if busy > 0.01 else 0.0
        clock_max = gc.sm_clock_max_mhz
        sm_clock = clock_max - rng.randint(0, 45) if util > 5 else _IDLE_SM_MHZ + rng.randint(0, 20)
        reasons = _GPU_IDLE if util <= 5 else (_SW_POWER_CAP if rng.random() < 0.03 else 0)
        mem_used = int(0.45 * _GIB) + sum(h.mem_bytes for h in holds)
        if has_job:
            mem_used = int(mem_used * (1 + rng.gauss(0, 0.002)))
        reading = {"util": util, "fm": fm, "fc": fc, "fd": fd, "fs": fs, "fe": fe, "fk": fk, "fh": fh,
                   "mem_used": mem_used, "power": power, "limit": gc.power_limit_w, "sm_clock": sm_clock,
                   "reasons": reasons, "temp_target": 28.0 + 0.068 * power}  # fmt: skip
        self._gpu_faults(g, tick, reading, bool(holds))
        reading["mem_used"] = min(reading["mem_used"], gc.memory_bytes)
        self._instant_events(g, tick, is_silent, holds, reading)
        temps = self.temps
        temps[g] += (reading["temp_target"] - temps[g]) * (1 - math.exp(-iv / 60.0)) + rng.gauss(0, 0.3)
        self.energy[g] += int(reading["power"] * iv * 1000)
        if rng.random() < 0.002:
            self.ecc_c[g] += 1
        if not is_silent:
            fields = _gpu_fields(engine, node, g, self.uuids[g], holds, self._state(g, reading, tick))
            engine.emit(tick + g * 0.003, "GpuSample", **fields)

    def _gpu_faults(self, g: int, tick: float, reading: dict[str, Any], held: bool) -> None:
        """A slow GPU (thermal, power-capped or degraded) and memory pressure change the interval's reading."""
        rng, gc = self.rng, self.engine.sc.cluster.gpu_of(self.node)
        clock_max = gc.sm_clock_max_mhz
        for _, f in self.faults_by_gpu.get((self.node, g), ()):
            end = _end_of(f)
            active = f.start <= tick < end
            if f.type == "straggler_gpu" and active:
                m = _magnitude_at(f, tick, 1.5)
                reading["sm_clock"] = int(clock_max / m) + rng.randint(-15, 15)
                if f.params.get("variant") == "degraded":
                    # A degraded card or PCIe link: slow, with no clock, power or throttle sign.
                    if reading["util"] > 5:
                        reading["sm_clock"] = clock_max - rng.randint(0, 45)
                elif f.params.get("variant") == "power":
                    limit = reading["limit"] = round(gc.power_limit_w / m**1.6, 1)
                    # the cap holds
                    reading["power"] = min(reading["power"], limit * (1 - abs(rng.gauss(0, 0.01))))
                    reading["reasons"] = _SW_POWER_CAP | _HW_POWER_BRAKE
                else:
                    reading["power"] *= m**-0.6
                    reading["temp_target"] = 88.0 + rng.uniform(0, 3)
                    reading["reasons"] = _SW_THERMAL | _HW_THERMAL | _HW_SLOWDOWN
            elif f.type == "gpu_memory_pressure" and active and held:
                frac = min(0.999, (f.magnitude or 0.985) + rng.gauss(0, 0.002))
                reading["mem_used"] = int(gc.memory_bytes * frac)

    def _instant_events(
        self, g: int, tick: float, is_silent: bool, holds: list[_Holding], reading: dict[str, Any]
    ) -> None:
        """XID and ECC events before `tick`: counters move, and an XID is reported at once, between samples."""
        pending = self.instants.get(g, [])
        while pending and pending[0][0] < tick:
            t0, i, f = pending.pop(0)
            if f.type == "ecc_uncorrectable":
                self.ecc_u[g] += int(f.params.get("count", 1))
                self.remap_u[g] += 1
            elif f.type == "ecc_correctable":
                self.ecc_c[g] += int(f.params.get("count", 1))  # single-bit: corrected, nothing remapped
            xid = f.params.get("xid")
            # A point event: it ends where it starts.
            self.engine.effects[i] = _Effect(t0, t0, {"xid": xid} if xid else {})
            if xid is not None and not is_silent:
                fields = _gpu_fields(
                    self.engine, self.node, g, self.uuids[g], holds, self._state(g, reading, t0)
                )
                self.engine.emit(t0, "GpuSample", **fields, xid=xid)

    def _state(self, g: int, reading: dict[str, Any], tick: float) -> dict[str, Any]:
        """The interval's reading with the GPU's counters as they stand, as `_gpu_fields` reads it."""
        return reading | {"energy": self.energy[g], "temp": self.temps[g], "ecc_c": self.ecc_c[g],
                          "ecc_u": self.ecc_u[g], "remap_u": self.remap_u[g], "tick": tick}  # fmt: skip

    def _host_sample(self, tick: float, b: int, is_silent: bool, load: _TickLoad) -> None:
        """The node's HostSample: CPU, load, memory, disk, network and InfiniBand from its GPUs' work and its faults."""
        engine, node, rng, iv, sc = self.engine, self.node, self.rng, self.engine.iv, self.engine.sc
        host_total, held_gpus = self.host_total, load.held_gpus
        train = load.busy / self.gpus
        cpu = min(100.0, max(0.5, 3.0 + 38.0 * train + rng.gauss(0, 1.5)))
        load1 = sc.cluster.cpus * cpu / 100 * 1.05
        self.load5 += (load1 - self.load5) * (1 - math.exp(-iv / 300))
        self.load15 += (load1 - self.load15) * (1 - math.exp(-iv / 900))
        used = (48 + 42 * held_gpus) * _GIB * (1 + rng.gauss(0, 0.003))
        disk_w = engine.disk_write.get((node, b), 0.0) / iv
        multi = load.comm / max(1, held_gpus)
        net = (0.4e9 + 9.0e9 * multi) * _lognormal(rng, 0.05) if held_gpus else 2e6 * _lognormal(rng, 0.3)
        retrans = rng.uniform(0, 4)
        for i, f in self.node_faults:
            end = _end_of(f)
            if not f.start <= tick < end:
                continue
            if f.type == "network_degradation":
                retrans = float(f.params["retransmits"]) * _lognormal(rng, 0.25)
                net /= f.magnitude or 2.0
            elif f.type == "host_oom":
                used = self._host_oom(i, f, tick)
        if not any(f.type == "host_oom" and f.start <= tick < _end_of(f) for _, f in self.node_faults):
            self.swap = max(0.0, self.swap - 0.5 * _GIB)
        used = min(used, host_total * 0.999)
        if is_silent:
            return
        self.last_seen = tick + 0.05
        engine.emit(
            tick + 0.05,
            "HostSample",
            cluster=sc.cluster.name,
            node=node,
            cpu_util_pct=round(cpu, 2),
            load1=round(load1, 2),
            load5=round(self.load5, 2),
            load15=round(self.load15, 2),
            mem_used_bytes=int(used),
            mem_available_bytes=int(host_total - used),
            mem_total_bytes=host_total,
            swap_used_bytes=int(self.swap),
            disk_read_bytes_s=round(1.5e8 * train * _lognormal(rng, 0.1), 1),
            disk_write_bytes_s=round(disk_w + 2e6 * _lognormal(rng, 0.3), 1),
            net_rx_bytes_s=round(net, 1),
            net_tx_bytes_s=round(net * 0.98 + disk_w, 1),
            tcp_retrans_segs_s=round(retrans, 2),
            open_files=12_000 + 350 * held_gpus + rng.randint(0, 200),
            oom_kills=self.oom_kills,
            **_infiniband(engine, node, tick, multi, held_gpus, self.ib_errors),
            job_ids=sorted(load.jobs),
        )

    def _host_oom(self, index: int, fault: FaultSpec, tick: float) -> float:
        """Host memory exhausted: memory nearly full, swap growing, the OOM killer taking processes. Returns memory used."""
        rng = self.rng
        avail_frac = rng.uniform(0.003, 0.012)
        used = self.host_total * (1 - avail_frac)
        self.swap = min(self.swap + rng.uniform(1, 3) * _GIB, 32 * _GIB)
        target = int(fault.params["oom_kills"])
        done = self.engine.effects.setdefault(index, _Effect(fault.start, fault.end, {"oom_kills": 0}))
        if done.detail["oom_kills"] < target and rng.random() < 0.5:
            done.detail["oom_kills"] += 1
            self.oom_kills += 1
            if fault.params.get("rank_fault") and done.detail["oom_kills"] == 1:
                _oom_rank_fault(self.engine, index, fault, tick)
        return used


def _infiniband(
    engine: Engine, node: str, tick: float, comm: float, held_gpus: int, errors: list[int]
) -> dict[str, Any]:
    """InfiniBand port counters of one HostSample: collective traffic, less and with errors under a fault.

    Its own random stream per node and tick, so the rest of the node's telemetry is unchanged.
    """
    rng = engine._rng(f"ib/{node}/{round(tick * 1000)}")
    multi_node = any(node in j.nodes and len(j.nodes) > 1 for j in engine.sc.jobs)
    rate = (2.0e10 * comm * _lognormal(rng, 0.05)) if held_gpus and multi_node else 1e5 * _lognormal(rng, 0.3)
    before = errors[0]
    for i, f in enumerate(engine.sc.faults):
        if f.type == "ib_degradation" and engine.targets[i][0] == node and f.start <= tick < _end_of(f):
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


def _oom_rank_fault(engine: Engine, index: int, fault: FaultSpec, t: float) -> None:
    node = engine.targets[index][0]
    layout = engine.layouts[fault.job]
    rank = next(r for r in layout if r.node == node)
    engine.emit(
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
    engine: Engine, node: str, g: int, uuid: str, holds: list[_Holding], state: dict[str, Any]
) -> dict[str, Any]:
    """The fields of one GpuSample from the interval's derived state."""
    gc = engine.sc.cluster.gpu_of(node)
    util, fm, fc, fd = state["util"], state["fm"], state["fc"], state["fd"]
    allocated: tuple[str | None, str | None] = (None, None)
    for start, end, job_id, run_id in engine.allocated.get((node, g), ()):
        if start <= state["tick"] < end:
            allocated = (job_id, run_id)
    return {
        "cluster": engine.sc.cluster.name,
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
        **(_gpm_fields(engine, state) if gc.gpm else {}),
    }


def _gpm_fields(engine: Engine, state: dict[str, Any]) -> dict[str, Any]:
    """GPM activity of the interval on Hopper-class GPUs (null elsewhere), from the time in each phase.

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
