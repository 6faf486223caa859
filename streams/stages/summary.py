"""Per-rank summaries: what the job-level rules read instead of every step and sample (issue 19).

The first stage of detection runs where a job's node's records are. `RankSummarizer` folds each
rank's steps, collective samples and GPU samples, and each node's host samples, into one
`RankSummary` per rank (and one per node, `rank` null) per bucket of event time (`bucket_s`,
5 s): counts, sums, extremes and medians of the fields the job-level rules use, with the values
themselves while there are few (so a window's median stays exact for jobs of a few steps per
second). A bucket is emitted once the stage's watermark passes its end. Pure and deterministic:
the same records give the same summaries, in the same order.
"""

from __future__ import annotations

import math
from typing import Any

from schemas.records import Event
from streams.detectors.base import Topology
from streams.detectors.stats import stat_of

__all__ = ["RankSummarizer"]


def _row(job_id: str, run_id: str, node: str, rank: int | None, start: int) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "run_id": run_id,
        "node": node,
        "rank": rank,
        "start": start,
        "gpu_uuid": None,
        "gpu_index": None,
        "pid": None,
        "steps": 0,
        "first_step": None,
        "last_step": None,
        "last_step_ts": None,
        "v": {},  # field -> values (Stats at close)
        "tokens": None,
        "samples": None,
        "attr": [0.0, 0.0, 0.0, 0.0],  # step time, idle, wait, comm of steps whose compute is known
        "coll_n": 0,
        "coll": [None, None, None, None],  # last, min, max, last ts
        "gpu_n": 0,
        "reasons": 0,
        "gpu_last_ts": None,
        "pid_seen_ts": None,
        "foreign": [None, None],  # pid, ts
        "ib_errors": None,
        "telemetry_last_ts": None,
    }


def _add(row: dict[str, Any], name: str, value: float | None) -> None:
    if value is not None:
        row["v"].setdefault(name, []).append(float(value))


class RankSummarizer:
    """Folds one stage's rank and node records into `RankSummary` buckets."""

    def __init__(self, topology: Topology, bucket_ms: int = 5_000) -> None:
        self.topology = topology
        self.bucket_ms = bucket_ms
        # "job|node|rank|start" (rank "" for a node row) -> the bucket being filled. Which jobs run
        # on a node, and their processes, are the topology's bindings.
        self.rows: dict[str, dict[str, Any]] = {}
        # No open bucket ends before this (None: no row open): `advance` looks at the rows only
        # once the watermark reaches it (it runs once a second, a bucket ends every `bucket_ms`).
        self._due: int | None = None

    def _get(self, job_id: str, run_id: str, node: str, rank: int | None, ts: int) -> dict[str, Any]:
        start = (ts // self.bucket_ms) * self.bucket_ms
        key = f"{job_id}|{node}|{'' if rank is None else rank}|{start}"
        row = self.rows.get(key)
        if row is None:
            row = self.rows[key] = _row(job_id, run_id, node, rank, start)
            if self._due is None or start + self.bucket_ms < self._due:
                self._due = start + self.bucket_ms
        elif run_id:
            row["run_id"] = run_id
        return row

    def observe(self, event: Event) -> None:
        """Take one record into the bucket it falls in (records of other kinds are ignored)."""
        r = event.record
        kind = event.type
        if kind == "StepCompleted":
            self._step(r)
        elif kind == "GpuSample":
            self._gpu(r)
        elif kind == "CollectiveSample":
            node = self._node_of(r)
            if node is None or not r.get("interval_s"):
                return
            row = self._get(r["job_id"], r.get("run_id") or "", node, int(r["rank"]), r["ts"])
            frac = float(r["time_s"]) / float(r["interval_s"])
            coll = row["coll"]
            row["coll_n"] += 1
            coll[0] = frac
            coll[1] = frac if coll[1] is None else min(coll[1], frac)
            coll[2] = frac if coll[2] is None else max(coll[2], frac)
            coll[3] = r["ts"] if coll[3] is None else max(coll[3], r["ts"])
        elif kind == "HostSample":
            self._host(r)

    def _node_of(self, r: dict[str, Any]) -> str | None:
        node = r.get("node")
        if node:
            return str(node)
        binding = self.topology.bindings.get((r["job_id"], r["rank"]))
        return binding.node if binding is not None else None

    def _step(self, r: dict[str, Any]) -> None:
        node = r.get("node") or self._node_of(r)
        if node is None:
            node = ""  # a rank not bound (yet) and a producer that does not name its node
        row = self._get(r["job_id"], r.get("run_id") or "", str(node), int(r["rank"]), r["ts"])
        step, ts = int(r["step"]), int(r["ts"])
        row["steps"] += 1
        first = row["first_step"]
        if first is None or step < first:
            row["first_step"] = step
        if row["last_step"] is None or step >= row["last_step"]:
            row["last_step"], row["last_step_ts"] = step, ts
        # This runs for every step of every rank: the fields are read once and each value list is
        # appended to in place (`_add`'s order, so a bucket's values read the same).
        get = r.get
        forward, backward, optimizer = get("forward_s"), get("backward_s"), get("optimizer_s")
        wait, step_time, comm = get("data_wait_s"), get("step_time_s"), get("comm_s")
        compute = (
            None
            if forward is None or backward is None or optimizer is None
            else math.fsum((forward, backward, optimizer))
        )
        busy = compute + (wait or 0.0) if compute is not None else step_time
        v = row["v"]
        for name, value in (
            ("busy_s", busy),
            ("compute_s", compute),
            ("data_wait_s", wait),
            ("comm_s", comm),
            ("step_time_s", step_time),
        ):
            if value is not None:
                values = v.get(name)
                if values is None:
                    v[name] = [float(value)]
                else:
                    values.append(float(value))
        if comm is None:
            # Only a step that times no collective (DDP: the wait hides in backward) is judged on
            # its forward, backward and optimizer (the straggler rule's work-before-the-first-wait
            # score and its cross-rank path).
            _add(row, "forward_s", forward)
            _add(row, "backward_s", backward)
            _add(row, "optimizer_s", optimizer)
        loss = get("loss")
        if loss is not None and math.isfinite(loss):
            _add(row, "loss", loss)
        tokens, samples = get("tokens"), get("samples")
        if tokens is not None:
            row["tokens"] = (row["tokens"] or 0.0) + float(tokens)
        if samples is not None:
            row["samples"] = (row["samples"] or 0.0) + float(samples)
        if compute is not None and step_time is not None:
            attr = row["attr"]
            attr[0] += step_time
            attr[1] += max(0.0, step_time - compute)
            attr[2] += wait or 0.0
            attr[3] += comm or 0.0

    def _gpu(self, r: dict[str, Any]) -> None:
        binding = self.topology.binding_for_gpu(r["node"], r["gpu_uuid"])
        if binding is None:
            return
        row = self._get(binding.job_id, "", binding.node, binding.rank, r["ts"])
        row["gpu_uuid"], row["gpu_index"], row["pid"] = binding.gpu_uuid, binding.gpu_index, binding.pid
        row["gpu_n"] += 1
        _add(row, "gpu_util_pct", r.get("gpu_util_pct"))
        _add(row, "power_w", r.get("power_w"))
        _add(row, "sm_clock_mhz", r.get("sm_clock_mhz"))
        _add(row, "sm_active_pct", r.get("sm_active_pct"))
        _add(row, "tensor_active_pct", r.get("tensor_active_pct"))
        mem, total = r.get("mem_used_bytes"), r.get("mem_total_bytes")
        if mem is not None and total:
            _add(row, "mem_frac", mem / total)
        row["reasons"] |= int(r.get("clock_event_reasons") or 0)
        ts = int(r["ts"])
        row["gpu_last_ts"] = ts if row["gpu_last_ts"] is None else max(row["gpu_last_ts"], ts)
        pids = r.get("pids") or ()
        pid = binding.pid
        if pid in pids:
            row["pid_seen_ts"] = ts if row["pid_seen_ts"] is None else max(row["pid_seen_ts"], ts)
        topology = self.topology
        # An ended job holds no process on its GPUs any more: every one seen there is another's.
        # (The common sample shows only the rank's own process: nothing to look up.)
        ended = topology.ended(binding.job_id)
        if ended or any(p != pid for p in pids):
            own = () if ended else {b.pid for b in topology.ranks_on_node(binding.job_id, binding.node)}
            foreign = sorted(p for p in pids if p not in own)
            if foreign:
                row["foreign"] = [foreign[0], ts]

    def _host(self, r: dict[str, Any]) -> None:
        node, ts = str(r["node"]), int(r["ts"])
        for job_id in self.topology.jobs_on_node(node):
            row = self._get(job_id, "", node, None, ts)
            _add(row, "cpu_util_pct", r.get("cpu_util_pct"))
            _add(row, "tcp_retrans_segs_s", r.get("tcp_retrans_segs_s"))
            errors = r.get("ib_errors")
            if errors is not None:
                row["ib_errors"] = (row["ib_errors"] or 0.0) + float(errors)
            last = row["telemetry_last_ts"]
            row["telemetry_last_ts"] = ts if last is None else max(last, ts)

    def advance(self, watermark: int) -> list[Event]:
        """RankSummary records of every bucket that ended at or before the watermark, in order."""
        if self._due is not None and watermark < self._due:
            return []
        done = [k for k, row in self.rows.items() if row["start"] + self.bucket_ms <= watermark]
        self._due = min(
            (end for end in (row["start"] + self.bucket_ms for row in self.rows.values()) if end > watermark),
            default=None,
        )
        if not done:
            return []
        rows = [self.rows.pop(k) for k in done]
        rows.sort(key=lambda w: (w["start"], w["job_id"], w["node"], -1 if w["rank"] is None else w["rank"]))
        return [Event("RankSummary", self._summary(row)) for row in rows]

    def _summary(self, row: dict[str, Any]) -> dict[str, Any]:
        v = row["v"]
        coll, attr = row["coll"], row["attr"]
        out = {
            "ts": row["start"] + self.bucket_ms,
            "bucket_start": row["start"],
            "job_id": row["job_id"],
            "run_id": row["run_id"],
            "node": row["node"],
            "rank": row["rank"],
            "gpu_uuid": row["gpu_uuid"],
            "gpu_index": row["gpu_index"],
            "pid": row["pid"],
            "steps": row["steps"],
            "first_step": row["first_step"],
            "last_step": row["last_step"],
            "last_step_ts": row["last_step_ts"],
            "tokens": row["tokens"],
            "samples": row["samples"],
            "attr_step_time_s": attr[0],
            "attr_idle_s": attr[1],
            "attr_wait_s": attr[2],
            "attr_comm_s": attr[3],
            "coll_n": row["coll_n"],
            "coll_frac_last": coll[0],
            "coll_frac_min": coll[1],
            "coll_frac_max": coll[2],
            "coll_last_ts": coll[3],
            "gpu_n": row["gpu_n"],
            "throttle_reasons": row["reasons"],
            "gpu_last_ts": row["gpu_last_ts"],
            "pid_seen_ts": row["pid_seen_ts"],
            "foreign_pid": row["foreign"][0],
            "foreign_pid_ts": row["foreign"][1],
            "ib_errors": row["ib_errors"],
            "telemetry_last_ts": row["telemetry_last_ts"],
        }
        for field in (
            "busy_s",
            "compute_s",
            "data_wait_s",
            "comm_s",
            "step_time_s",
            "loss",
            "gpu_util_pct",
            "power_w",
            "sm_clock_mhz",
            "mem_frac",
            "sm_active_pct",
            "tensor_active_pct",
            "cpu_util_pct",
            "tcp_retrans_segs_s",
        ):
            values = v.get(field)
            out[field] = stat_of(values) if values else None
        for field in ("forward_s", "backward_s", "optimizer_s"):
            # Read as one bucket's median only: the values would add ~80 B to the summary.
            values = v.get(field)
            out[field] = stat_of(values, keep_values=False) if values else None
        return out

    def forget_job(self, job_id: str) -> None:
        """Drop the open buckets of an ended job."""
        self.rows = {k: w for k, w in self.rows.items() if w["job_id"] != job_id}

    def state(self) -> dict[str, Any]:
        """JSON-able state."""
        return {"rows": {k: self.rows[k] for k in sorted(self.rows)}}

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore from `state()`."""
        self.rows = dict(state.get("rows", {}))  # an older snapshot's "placed" is the topology's
        self._due = min((int(row["start"]) + self.bucket_ms for row in self.rows.values()), default=None)
