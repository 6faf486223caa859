"""Rule `host_memory_pressure`: a node runs out of host memory, or its kernel OOM-killed a process.

Category `infra`, identity node (and the affected job: one alert per job on the node, see
`infra_signal.py`). From HostSample: available / total memory below `host_mem_available_ratio`
(warning; the alert fires once that lasts `host_mem_sustain_s`), or an `oom_kills` increment
(critical, at once; the condition lasts `oom_quiet_s` after the kill). Resolves on the first
sample with neither.
"""

from __future__ import annotations

from typing import Any, ClassVar

from schemas.records import Event
from streams.detectors.base import Detector, Finding, drop_nodes
from streams.detectors.catalogue import catalogued
from streams.detectors.infra_signal import NodeJobs

__all__ = ["DEFAULTS", "HostMemoryPressureDetector"]

DEFAULTS: dict[str, Any] = {
    "host_mem_available_ratio": 0.05,  # host memory available / total below this is pressure
    "host_mem_sustain_s": 60.0,  # ... for this long
    "oom_quiet_s": 120.0,  # after an OOM kill the condition holds this long
}

_POINTS = 8  # available-memory ratios carried on a finding


HOST_MEMORY_PRESSURE = catalogued("host_memory_pressure")


class HostMemoryPressureDetector(Detector, rule=HOST_MEMORY_PRESSURE, stage="rank", section="infrastructure"):
    """Host memory pressure and OOM kills per node, reported to each job on it."""

    reads: ClassVar[frozenset[str] | None] = frozenset({"HostSample"})

    def configure(self, p: dict[str, Any]) -> None:
        """The knobs (DEFAULTS under the configured values) and empty state."""
        self._ratio = float(p["host_mem_available_ratio"])
        self._sustain = int(float(p["host_mem_sustain_s"]) * 1000)
        self._oom_quiet = int(float(p["oom_quiet_s"]) * 1000)
        self._hosts: dict[str, dict[str, Any]] = {}  # node -> host memory state
        self.node_jobs = NodeJobs(self.topology)

    def forget_nodes(self, nodes: frozenset[str]) -> None:
        """Drop evicted nodes' host memory state."""
        drop_nodes(self._hosts, nodes)
        self.node_jobs.forget_nodes(nodes)

    def state(self) -> dict[str, Any]:
        """JSON-able state: per host, and the jobs HostSamples named."""
        return {
            "hosts": {k: self._hosts[k] for k in sorted(self._hosts)},
            "node_jobs": self.node_jobs.state(),
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore from `state()`."""
        self._hosts = dict(state.get("hosts", {}))
        self.node_jobs.load_state(state.get("node_jobs", {}))

    def observe(self, event: Event) -> list[Finding]:
        """Judge a HostSample's memory and OOM kill counter."""
        if event.type != "HostSample":
            return []
        r = event.record
        node, ts = r["node"], r["ts"]
        h = self._hosts.get(node)
        if h is None:
            h = self._hosts[node] = {
                "oom_last": None,
                "oom_ts": None,
                "oom_n": 0,
                "low_since": None,
                "cond": None,
            }
        self.node_jobs.observe_host(r)
        avail, total, ooms = r.get("mem_available_bytes"), r.get("mem_total_bytes"), r.get("oom_kills")
        if ooms is not None:
            if h["oom_last"] is not None and ooms > h["oom_last"]:
                h["oom_ts"] = ts
                h["oom_n"] += int(ooms - h["oom_last"])
            h["oom_last"] = ooms
        frac = avail / total if avail is not None and total else None
        low = frac is not None and frac < self._ratio
        if low:
            h["low_since"] = h["low_since"] if h["low_since"] is not None else ts
        elif frac is not None:
            h["low_since"] = None
        oom_recent = h["oom_ts"] is not None and ts - h["oom_ts"] <= self._oom_quiet
        cond = h["cond"]
        if low or oom_recent:
            if cond is None:
                cond = h["cond"] = {"since": ts if not low else h["low_since"], "points": [], "jobs": []}
            cond["frac"] = frac
            cond["oom"] = oom_recent
            cond["jobs"] = sorted(set(cond.get("jobs", [])) | set(self.node_jobs.affected(node)))
            if frac is not None:
                cond["points"] = [*cond["points"], [ts, round(frac, 4)]][-_POINTS:]
            return [self._finding(node, h, ts, True, job) for job in cond["jobs"]]
        if cond is not None:
            cond["frac"], cond["oom"] = frac, False
            out = [self._finding(node, h, ts, False, job) for job in cond.get("jobs", [""])]
            h["cond"] = None
            h["oom_n"] = 0
            return out
        return []

    def _finding(self, node: str, h: dict[str, Any], ts: int, active: bool, job_id: str) -> Finding:
        cond = h["cond"]
        frac = cond["frac"]
        avail = f"{100 * frac:.1f}% of host memory available" if frac is not None else "host memory unknown"
        if active and cond["oom"]:
            summary = f"node {node}: the kernel OOM-killed {h['oom_n']} process(es); {avail}"
        elif active:
            summary = f"node {node} has only {avail}"
        else:
            summary = f"node {node} memory pressure is over ({avail})"
        return HOST_MEMORY_PRESSURE.finding(
            key=(node, job_id) if job_id else (node,),
            active=active,
            ts=ts,
            severity="critical" if cond["oom"] else "warning",
            job_id=job_id,
            node=node,
            since=cond["since"],
            invariant=HOST_MEMORY_PRESSURE.says(ratio_pct=100 * self._ratio),
            observed=frac,
            expected=self._ratio,
            summary=summary,
            history_metric="host_mem_available_ratio",
            history=tuple((int(t), float(v)) for t, v in cond["points"]),
            sustain_ms=0 if cond["oom"] else self._sustain,
        )
