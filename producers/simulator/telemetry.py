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


def node_telemetry(
    engine: Engine,
    node: str,
    n_index: int,
    faults_by_gpu: dict[tuple[str, int], list[tuple[int, FaultSpec]]],
    node_faults: list[tuple[int, FaultSpec]],
    silent: list[tuple[int, FaultSpec]],
) -> None:
    sc, iv, gc = engine.sc, engine.iv, engine.gpu
    rng = engine._rng(f"telemetry/{node}")
    phase = engine.phase[node]
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
                    engine.effects[i] = _Effect(last_seen if last_seen is not None else f.start, None, {})
            elif tick >= end and gap_open.get(i):
                gap_open[i] = False
                engine.effects[i].end = tick
        host_busy = 0.0
        held_gpus = 0
        comm_frac = 0.0
        node_jobs: set[str] = set()  # what an attributing agent stamps on the HostSample
        for g in range(gpus):
            vec = engine.acc.get((node, g, b)) or [0.0] * _SLOTS
            holds = [h for h in engine.holdings.get((node, g), ()) if h.start <= tick < h.end]
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
                gc.idle_power_w + (15.0 if holds else 0.0) + (gc.busy_power_w - gc.idle_power_w) * activity
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
                engine.effects[i] = _Effect(t0, t0, {"xid": xid} if xid else {})
                if xid is not None and not is_silent:
                    # The agent reports an XID immediately, between its regular samples.
                    state = {"util": util, "fm": fm, "fc": fc, "fd": fd, "mem_used": mem_used,
                             "power": power, "limit": limit, "energy": energy[g], "temp": temps[g],
                             "sm_clock": sm_clock, "reasons": reasons, "ecc_c": ecc_c[g],
                             "ecc_u": ecc_u[g], "remap_u": remap_u[g], "fs": fs, "fe": fe, "fk": fk, "fh": fh,
                             "tick": t0}  # fmt: skip
                    engine.emit(
                        t0, "GpuSample", **_gpu_fields(engine, node, g, uuids[g], holds, state), xid=xid
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
                fields = _gpu_fields(engine, node, g, uuids[g], holds, state)
                engine.emit(tick + g * 0.003, "GpuSample", **fields)
        # ---- host
        train = host_busy / gpus
        cpu = min(100.0, max(0.5, 3.0 + 38.0 * train + rng.gauss(0, 1.5)))
        load1 = sc.cluster.cpus * cpu / 100 * 1.05
        load5 += (load1 - load5) * (1 - math.exp(-iv / 300))
        load15 += (load1 - load15) * (1 - math.exp(-iv / 900))
        used = (48 + 42 * held_gpus) * _GIB * (1 + rng.gauss(0, 0.003))
        disk_w = engine.disk_write.get((node, b), 0.0) / iv
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
                done = engine.effects.setdefault(i, _Effect(f.start, f.end, {"oom_kills": 0}))
                if done.detail["oom_kills"] < target and rng.random() < 0.5:
                    done.detail["oom_kills"] += 1
                    oom_kills += 1
                    if f.params.get("rank_fault") and done.detail["oom_kills"] == 1:
                        _oom_rank_fault(engine, i, f, tick)
        if not any(f.type == "host_oom" and f.start <= tick < _end_of(f) for _, f in node_faults):
            swap = max(0.0, swap - 0.5 * _GIB)
        used = min(used, host_total * 0.999)
        if not is_silent:
            last_seen = tick + 0.05
            engine.emit(
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
                **_infiniband(engine, node, tick, multi, held_gpus, ib_errors),
                job_ids=sorted(node_jobs),
            )
    for i, f in silent:
        if i not in engine.effects:
            engine.effects[i] = _Effect(f.start, f.end, {})


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
    gc = engine.gpu
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
        **_gpm_fields(engine, state),
    }


def _gpm_fields(engine: Engine, state: dict[str, Any]) -> dict[str, Any]:
    """GPM activity of the interval on Hopper-class GPUs (null elsewhere), from the time in each phase.

    Compute keeps most SMs and the tensor pipes busy; a collective moving data keeps a few SMs
    and some DRAM busy; one spinning while it waits for a peer keeps a few SMs busy and nothing
    else; a hung kernel (one that never returns) keeps its blocks on every SM with no tensor
    work and hardly any DRAM traffic. No random draw: the other records of a scenario stay
    exactly as they were.
    """
    if not engine.gpu.gpm:
        return {}
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
