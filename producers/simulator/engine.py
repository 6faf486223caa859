"""The simulation itself: synchronous data-parallel jobs on a GPU cluster, in event time.

Two passes. The job pass walks each job step by step (every rank of a step ends together
because of the collective) and records, per GPU and telemetry interval, how long the GPU spent
in each phase. The telemetry pass turns those phase times into NVML-like GPU samples, host
samples and SDK data-loader/collective samples, then applies the node- and GPU-level faults.
Every random draw comes from a `random.Random` seeded from (seed, component), so the output
is a pure function of the scenario and the seed.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any

from producers.simulator.common import (
    _COMPUTE,
    _DEFAULTS,
    _GIB,
    _NEVER,
    _SHARED_NODE_FAULTS,
    _SLOTS,
    _STEPS,
    _Effect,
    _end_of,
    _Holding,
    _Rank,
    _window_overlaps,
    gpu_uuid,
)
from producers.simulator.faults import FAULTS
from producers.simulator.jobrun import JobRun
from producers.simulator.scenario import FaultSpec, JobSpec, Scenario
from producers.simulator.sdk_samples import sdk_samples
from producers.simulator.telemetry import NodeTelemetry
from schemas.files import format_ts, parse_ts
from schemas.records import Event

__all__ = ["Progress", "Simulation", "simulate"]

Progress = Callable[[int, float], None]
"""Called now and then with (events generated so far, simulated seconds reached)."""


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
            engine = Engine(self.scenario, self.seed, self._progress)
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


class Engine:
    """One simulation's state: the scenario, the phase time per GPU and interval, holdings, fault effects, events."""

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
        # Each rank's loader draws from its own stream (`sdk_samples`), made on first use.
        self.loader_rngs: dict[tuple[str, int], random.Random] = {}
        node_rng = self._rng("phase")
        # Node agents are not synchronised: each samples on its own phase.
        self.phase = {n: round(node_rng.uniform(0.2, self.iv - 0.2), 3) for n in scenario.cluster.node_names}
        self.layouts = {job.id: self._layout(job) for job in scenario.jobs}
        self.targets = [self._target(i, f) for i, f in enumerate(scenario.faults)]

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

    def run(self) -> list[Event]:
        for job in self.sc.jobs:
            if job.start < self.sc.duration:
                JobRun(self, job).run()
        self._telemetry()
        self.out.sort(key=lambda item: (item[0], item[1]))
        if self.progress is not None:
            self.progress(len(self.out), self.sc.duration)
        return [e for _, _, e in self.out]

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
            NodeTelemetry(self, node, faults_by_gpu, faults_by_node.get(node, []), silent.get(node, [])).run()
            if self.progress is not None:
                self.progress(len(self.out), sc.duration * (n_index + 1) / sc.cluster.nodes)
        sdk_samples(self)

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
