"""Rule `telemetry_missing`: a node of a running job stopped sending telemetry.

Category `infra`, warning, identity node (and the affected job: one alert per job on the node, see
`infra_signal.py`). A node that hosts ranks of a running job (bound there, or listed in its
JobStarted) and has sent telemetry before sends no GpuSample/HostSample for more than
max(`missing_intervals` x its learned sample interval, `missing_min_s`), measured on the watermark
(which the other nodes and the steps keep moving), while some other node's telemetry is still
fresh (`require_live_peer`: when every node is silent, the pipeline or the input stopped, not one
agent). A rank-stage engine hears only the nodes of the job/node keys it holds; the other nodes'
freshness reaches it as `Topology.telemetry_front` (the newest telemetry time of the whole input
offline, of every partition of the worker live). The sample interval is the median of the last
gaps between one source's successive samples (the first GPU heard; the host's on a node without
GPU samples), never the milliseconds between the GPUs of one sampling round. Checked at most every
`check_every_s`, re-reported at most every `reemit_s`; resolves on the node's next sample.
"""

from __future__ import annotations

from typing import Any, ClassVar

from schemas.records import Event
from streams.detectors.base import Detector, Finding, Topology
from streams.detectors.history import add_point, points_of
from streams.detectors.infra_signal import CHECK_DEFAULTS, NodeJobs, PeriodicCheck
from streams.detectors.stats import median

__all__ = ["DEFAULTS", "TelemetryMissingDetector"]

DEFAULTS: dict[str, Any] = {
    "missing_intervals": 3.0,  # silent for this many learned sample intervals ...
    "missing_min_s": 30.0,  # ... and at least this long -> telemetry_missing
    "default_interval_s": 10.0,  # sample interval assumed before one is learned
    "require_live_peer": True,  # only while another node's telemetry is fresh (else the pipeline stopped)
    "reemit_s": 60.0,  # re-report an active timed condition at most this often
    **CHECK_DEFAULTS,
}

_INTERVALS = 8  # sample intervals a node's interval is learned from (median)
_HOST = "host"  # the pace source of a node's HostSamples


def _source(event: Event) -> str:
    """Which of a node's telemetry sources sent `event`: one GPU (by UUID, else index) or the host."""
    if event.type == "HostSample":
        return _HOST
    r = event.record
    return str(r.get("gpu_uuid") or f"gpu#{r.get('gpu_index')}")


class TelemetryMissingDetector(Detector):
    """Nodes of running jobs whose telemetry stopped, reported to each job on them."""

    section: ClassVar[str] = "infrastructure"
    stage: ClassVar[str] = "rank"
    rules: ClassVar[tuple[str, ...]] = ("telemetry_missing",)

    def __init__(self, topology: Topology, params: dict[str, Any] | None = None) -> None:
        super().__init__(topology, params)
        p = {**DEFAULTS, **self.params}
        self._miss_n = float(p["missing_intervals"])
        self._miss_min = int(float(p["missing_min_s"]) * 1000)
        self._default_interval = int(float(p["default_interval_s"]) * 1000)
        self._live_peer = bool(p["require_live_peer"])
        self._reemit = int(float(p["reemit_s"]) * 1000)
        self.check = PeriodicCheck(int(float(p["check_every_s"]) * 1000))
        self._nodes: dict[str, dict[str, Any]] = {}  # node -> last sample, intervals, missing
        self.node_jobs = NodeJobs(topology)

    def state(self) -> dict[str, Any]:
        """JSON-able state: per node, the jobs HostSamples named, the last periodic check."""
        return {
            "nodes": {k: self._nodes[k] for k in sorted(self._nodes)},
            "node_jobs": self.node_jobs.state(),
            "checked": self.check.last,
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore from `state()`."""
        self._nodes = dict(state.get("nodes", {}))
        self.node_jobs.load_state(state.get("node_jobs", {}))
        self.check.last = int(state.get("checked", -(2**62)))

    def observe(self, event: Event) -> list[Finding]:
        """A GpuSample or HostSample: the node's telemetry is alive (resolving a missing one)."""
        if event.type == "HostSample":
            self.node_jobs.observe_host(event.record)
        elif event.type != "GpuSample":
            return []
        r = event.record
        node, ts = r["node"], r["ts"]
        source = _source(event)
        n = self._nodes.get(node)
        if n is None:
            self._nodes[node] = {"last": ts, "deltas": [], "missing": None, "pace": source, "pace_ts": ts}
            return []
        # The interval is learned from one source's successive samples (a GPU's, or the host's on a
        # node without GPU samples): the GPUs of one round are sampled milliseconds apart, and those
        # gaps taught a 15 s agent a 3 ms interval, holding it to the `missing_min_s` floor.
        pace = n.get("pace")
        if pace is None or (pace == _HOST and source != _HOST):
            n["pace"], n["pace_ts"] = source, ts
        elif source == pace and ts > n["pace_ts"]:
            n["deltas"] = [*n["deltas"], ts - n["pace_ts"]][-_INTERVALS:]
            n["pace_ts"] = ts
        if ts > n["last"]:
            n["last"] = ts
        missing = n["missing"]
        if missing is None:
            return []
        n["missing"] = None
        return [self._finding(node, n, missing, ts, False, job) for job in missing.get("jobs", [""])]

    def advance(self, watermark: int) -> list[Finding]:
        """Report nodes of running jobs whose telemetry stopped."""
        if not self.check.due(watermark):
            return []
        nodes: set[str] = set()
        for job in self.topology.active_jobs():
            nodes.update(job.nodes)
            nodes.update(b.node for b in self.topology.ranks_of(job.job_id))
        out: list[Finding] = []
        freshest = max((n["last"] for n in self._nodes.values()), default=None)
        front = self.topology.telemetry_front
        if front is not None and (freshest is None or front > freshest):
            freshest = front
        if self._live_peer and (freshest is None or watermark - freshest > self._miss_min):
            # No node at all reports: the telemetry pipeline (or the input) stopped, not one
            # node's agent; the worker's wall-clock guard (docs/worker.md) covers that case.
            return out
        for node in sorted(nodes):
            n = self._nodes.get(node)
            if n is None:
                continue  # never heard from: no agent is expected there
            interval = median(n["deltas"]) if n["deltas"] else self._default_interval
            limit = max(int(self._miss_n * (interval or self._default_interval)), self._miss_min)
            silent = watermark - n["last"]
            if silent <= limit:
                continue
            missing = n["missing"]
            if missing is None:
                missing = n["missing"] = {"since": n["last"] + limit, "limit": limit, "emit": watermark}
            elif watermark - missing["emit"] < self._reemit:
                continue
            missing["emit"] = watermark
            missing["jobs"] = sorted(set(missing.get("jobs", [])) | set(self.node_jobs.affected(node)))
            out.extend(self._finding(node, n, missing, watermark, True, job) for job in missing["jobs"])
        return out

    def _finding(
        self, node: str, n: dict[str, Any], missing: dict[str, Any], ts: int, active: bool, job_id: str
    ) -> Finding:
        silent_s = (ts - n["last"]) / 1000
        history = add_point(missing, ts, silent_s) if active else points_of(missing)
        summary = (
            f"node {node} has sent no GPU or host telemetry for {silent_s:.0f}s while its job runs"
            if active
            else f"node {node} sends telemetry again"
        )
        return Finding(
            rule="telemetry_missing",
            key=(node, job_id) if job_id else (node,),
            active=active,
            ts=ts,
            category="infra",
            severity="warning",
            job_id=job_id,
            node=node,
            since=int(missing["since"]),
            invariant="every node of a running job sends telemetry",
            observed=silent_s if active else 0.0,
            expected=missing["limit"] / 1000,
            summary=summary,
            suspected_layer="telemetry",
            history_metric="seconds_since_sample",
            history=history,
            sustain_ms=0,
        )
