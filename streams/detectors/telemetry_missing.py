"""Rule `telemetry_missing`: a node of a running job stopped sending telemetry.

Category `infra`, warning, identity node (and the affected job: one alert per job on the node, see
`infra_signal.py`). A node that hosts ranks of a running job (bound there, or listed in its
JobStarted) and has sent telemetry before sends no GpuSample/HostSample for more than
max(`missing_intervals` x its learned sample interval, `missing_min_s`), measured on the watermark
(which the other nodes and the steps keep moving), while some other node's telemetry is still
fresh (`require_live_peer`: when every node is silent, the pipeline or the input stopped, not one
agent). A rank-stage engine hears only the nodes of the job/node keys it holds; the other nodes'
freshness reaches it as `Topology.telemetry_front` (the newest telemetry time of the whole input
offline, of every partition of the worker live).

The sample interval is learned from each source's own samples: every GPU and the host keep their
last sample time, and the node's interval is the median of the recent gaps between one source's
successive samples (never the milliseconds between the GPUs of one sampling round), so a 3 s
agent is allowed `missing_min_s` and a 30 s one 3 x 30 s. Until a source has shown one gap the
node is allowed `unlearned_s` (an agent heard once may sample every 30 s or more). A node is
silent from the later of its newest sample and the watermark at which its last sample arrived: an
agent whose samples keep arriving, however late their timestamps (a lagging clock, a spool
draining), is alive and never missing.

The check is linear in the nodes heard (no sort of the fleet per check); the nodes running jobs
list are gathered once per change of the running jobs. Checked at most every `check_every_s`,
re-reported at most every `reemit_s`; resolves on the node's next sample.
"""

from __future__ import annotations

from typing import Any, ClassVar

from schemas.records import Event
from streams.detectors.base import Detector, Finding, drop_nodes
from streams.detectors.catalogue import catalogued
from streams.detectors.history import add_point, points_of
from streams.detectors.infra_signal import CHECK_DEFAULTS, NodeJobs, PeriodicCheck
from streams.detectors.stats import median

__all__ = ["DEFAULTS", "TelemetryMissingDetector"]

DEFAULTS: dict[str, Any] = {
    "missing_intervals": 3.0,  # silent for this many learned sample intervals ...
    "missing_min_s": 30.0,  # ... and at least this long -> telemetry_missing
    "unlearned_s": 120.0,  # silence allowed to a node none of whose sources has shown a gap yet
    "require_live_peer": True,  # only while another node's telemetry is fresh (else the pipeline stopped)
    "reemit_s": 60.0,  # re-report an active timed condition at most this often
    **CHECK_DEFAULTS,
}

_INTERVALS = 8  # sample intervals a node's interval is learned from (median)
_HOST = "host"  # the source of a node's HostSamples
_SOURCES = 64  # sources (GPUs and the host) of a node whose last sample is kept: a record is a claim


def _source(event: Event) -> str:
    """Which of a node's telemetry sources sent `event`: one GPU (by UUID, else index) or the host."""
    if event.type == "HostSample":
        return _HOST
    r = event.record
    return str(r.get("gpu_uuid") or f"gpu#{r.get('gpu_index')}")


def _heard(n: dict[str, Any]) -> int:
    """When a node was last heard: its newest sample, or the watermark its last sample arrived at."""
    return max(int(n["last"]), int(n.get("heard") or 0))


TELEMETRY_MISSING = catalogued("telemetry_missing")


class TelemetryMissingDetector(Detector, stage="rank", section="infrastructure"):
    """Nodes of running jobs whose telemetry stopped, reported to each job on them."""

    reads: ClassVar[frozenset[str] | None] = frozenset({"GpuSample", "HostSample"})
    rules: ClassVar[tuple[str, ...]] = (TELEMETRY_MISSING.name,)

    def configure(self, p: dict[str, Any]) -> None:
        """The knobs (DEFAULTS under the configured values) and empty state."""
        self._miss_n = float(p["missing_intervals"])
        self._miss_min = int(float(p["missing_min_s"]) * 1000)
        self._unlearned = int(float(p["unlearned_s"]) * 1000)
        self._live_peer = bool(p["require_live_peer"])
        self._reemit = int(float(p["reemit_s"]) * 1000)
        self.check = PeriodicCheck(int(float(p["check_every_s"]) * 1000))
        self._nodes: dict[str, dict[str, Any]] = {}  # node -> last sample, sources, intervals, missing
        self.node_jobs = NodeJobs(self.topology)
        self._watermark = -(2**62)  # the latest watermark: when a sample arrives, its node is heard then
        self._listed: tuple[tuple[str, str, int], ...] | None = None  # running jobs the listed nodes are of
        self._listed_nodes: frozenset[str] = frozenset()

    def forget_nodes(self, nodes: frozenset[str]) -> None:
        """Drop evicted nodes' samples and intervals."""
        drop_nodes(self._nodes, nodes)
        self.node_jobs.forget_nodes(nodes)

    def state(self) -> dict[str, Any]:
        """JSON-able state: per node, the jobs HostSamples named, the last periodic check."""
        return {
            "nodes": {k: self._nodes[k] for k in sorted(self._nodes)},
            "node_jobs": self.node_jobs.state(),
            "checked": self.check.last,
            "watermark": self._watermark,
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore from `state()`."""
        self._nodes = dict(state.get("nodes", {}))
        self.node_jobs.load_state(state.get("node_jobs", {}))
        self.check.last = int(state.get("checked", -(2**62)))
        self._watermark = int(state.get("watermark", -(2**62)))

    def observe(self, event: Event) -> list[Finding]:
        """A GpuSample or HostSample: the node's telemetry is alive (resolving a missing one)."""
        if event.type == "HostSample":
            self.node_jobs.observe_host(event.record)
        elif event.type != "GpuSample":
            return []
        r = event.record
        node, ts = r["node"], int(r["ts"])
        source = _source(event)
        n = self._nodes.get(node)
        if n is None:
            n = self._nodes[node] = {"last": ts, "deltas": [], "missing": None, "sources": {}}
        # Each source's own successive samples teach the interval: the GPUs of one round are
        # sampled milliseconds apart, and those gaps taught a 15 s agent a 3 ms interval.
        sources = n.setdefault("sources", {})
        prev = sources.get(source)
        if prev is not None and ts > prev:
            n["deltas"] = [*n["deltas"], ts - prev][-_INTERVALS:]
        if (prev is None and len(sources) < _SOURCES) or (prev is not None and ts > prev):
            sources[source] = ts
        # Heard now: a sample that arrives is the agent alive, whatever its (late) timestamp says.
        n["last"] = max(int(n["last"]), ts)
        n["heard"] = max(int(n.get("heard") or 0), ts, self._watermark)
        missing = n["missing"]
        if missing is None:
            return []
        n["missing"] = None
        return [self._finding(node, n, missing, ts, False, job) for job in missing.get("jobs", [""])]

    def advance(self, watermark: int) -> list[Finding]:
        """Report nodes of running jobs whose telemetry stopped."""
        self._watermark = max(self._watermark, watermark)
        if not self.check.due(watermark):
            return []
        out: list[Finding] = []
        freshest = max((n["last"] for n in self._nodes.values()), default=None)
        front = self.topology.telemetry_front
        if front is not None and (freshest is None or front > freshest):
            freshest = front
        if self._live_peer and (freshest is None or watermark - freshest > self._miss_min):
            # No node at all reports: the telemetry pipeline (or the input) stopped, not one
            # node's agent; the worker's wall-clock guard (docs/worker.md) covers that case.
            return out
        listed = self._job_nodes()
        # Linear in the nodes heard: only a node heard before can go missing (never heard from:
        # no agent is expected there), and only the silent ones are sorted.
        silent_nodes = []
        for node, n in self._nodes.items():
            limit = self._limit(n)
            if watermark - _heard(n) > limit and (node in listed or self._bound_running(node)):
                silent_nodes.append((node, limit))
        for node, limit in sorted(silent_nodes):
            n = self._nodes[node]
            missing = n["missing"]
            if missing is None:
                missing = n["missing"] = {"since": _heard(n) + limit, "limit": limit, "emit": watermark}
            elif watermark - missing["emit"] < self._reemit:
                continue
            missing["emit"] = watermark
            missing["jobs"] = sorted(set(missing.get("jobs", [])) | set(self.node_jobs.affected(node)))
            out.extend(self._finding(node, n, missing, watermark, True, job) for job in missing["jobs"])
        return out

    def _limit(self, n: dict[str, Any]) -> int:
        """How long a node may be silent: `missing_intervals` x its learned interval (at least
        `missing_min_s`), or `unlearned_s` before any of its sources has shown a gap."""
        interval = median(n["deltas"]) if n["deltas"] else None
        if interval is None:
            return max(self._unlearned, self._miss_min)
        return max(int(self._miss_n * interval), self._miss_min)

    def _job_nodes(self) -> frozenset[str]:
        """The nodes the running jobs list, gathered again only when the running jobs change."""
        jobs = self.topology.active_jobs()
        key = tuple((j.job_id, j.run_id, len(j.nodes)) for j in jobs)
        if key != self._listed:
            self._listed = key
            self._listed_nodes = frozenset(node for j in jobs for node in j.nodes)
        return self._listed_nodes

    def _bound_running(self, node: str) -> bool:
        """Whether a rank of a running job is bound on the node."""
        return any(self.node_jobs.running(b.job_id) for b in self.topology.bindings_on_node(node))

    def _finding(
        self, node: str, n: dict[str, Any], missing: dict[str, Any], ts: int, active: bool, job_id: str
    ) -> Finding:
        silent_s = (ts - _heard(n)) / 1000
        history = add_point(missing, ts, silent_s) if active else points_of(missing)
        summary = (
            f"node {node} has sent no GPU or host telemetry for {silent_s:.0f}s while its job runs"
            if active
            else f"node {node} sends telemetry again"
        )
        return TELEMETRY_MISSING.finding(
            key=(node, job_id) if job_id else (node,),
            active=active,
            ts=ts,
            job_id=job_id,
            node=node,
            since=int(missing["since"]),
            observed=silent_s if active else 0.0,
            expected=missing["limit"] / 1000,
            summary=summary,
            history_metric="seconds_since_sample",
            history=history,
            sustain_ms=0,
        )
