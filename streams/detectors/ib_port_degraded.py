"""Rule `ib_port_degraded`: a node's InfiniBand / RoCE port is down or keeps counting errors.

Category `infra`, identity node (and the affected job: one alert per job on the node, see
`infra_signal.py`; a node that no job holds is still paged, with job_id "" and the node's
cluster, to whoever owns that cluster's infrastructure). From HostSample (the node agent reads
`/sys/class/infiniband/*/ports/*/`):

- a port down (`ib_ports_down` > 0): critical at once;
- link errors (`ib_errors`: symbol, receive, link-downed, link-recovery, integrity, overrun
  increments) of at least `ib_errors_min` within `ib_window_s`, in at least
  `ib_error_samples` samples of that window (a single burst of a port retraining is not a degraded
  port): warning.

Congestion (`ib_xmit_wait_s`, ECN marks, CNPs) is quoted as evidence in the summary, never a
trigger on its own: a busy fabric is not a broken port. The condition resolves once every port
is up and no error came for `ib_quiet_s`. A job's slowdown through the port is
`network_degradation`'s (it names the node with port errors).
"""

from __future__ import annotations

from typing import Any, ClassVar

from schemas.records import Event
from streams.detectors.base import Detector, Finding, Topology, drop_nodes
from streams.detectors.catalogue import catalogued
from streams.detectors.infra_signal import NodeJobs

__all__ = ["DEFAULTS", "IbPortDegradedDetector"]

DEFAULTS: dict[str, Any] = {
    "ib_errors_min": 10,  # link error increments within the window that make a degraded port ...
    "ib_error_samples": 2,  # ... seen in at least this many samples of the window
    "ib_window_s": 120.0,  # the window, seconds
    "ib_quiet_s": 300.0,  # a degraded port is well again after this long without errors, every port up
}

_POINTS = 8  # error increments carried on a finding

IB_PORT_DEGRADED = catalogued("ib_port_degraded")


class IbPortDegradedDetector(Detector, rule=IB_PORT_DEGRADED, stage="rank", section="infrastructure"):
    """InfiniBand / RoCE ports down or erroring per node, reported to each job on it (or to nobody's job)."""

    reads: ClassVar[frozenset[str] | None] = frozenset({"HostSample"})

    def __init__(self, topology: Topology, params: dict[str, Any] | None = None) -> None:
        super().__init__(topology, params)
        p = {**DEFAULTS, **self.params}
        self._errors_min = int(p["ib_errors_min"])
        self._samples_min = int(p["ib_error_samples"])
        self._window = int(float(p["ib_window_s"]) * 1000)
        self._quiet = int(float(p["ib_quiet_s"]) * 1000)
        self._ports: dict[str, dict[str, Any]] = {}  # node -> its ports' state
        self.node_jobs = NodeJobs(topology)

    def state(self) -> dict[str, Any]:
        """JSON-able state: per node, and the jobs HostSamples named."""
        return {
            "ports": {k: self._ports[k] for k in sorted(self._ports)},
            "node_jobs": self.node_jobs.state(),
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore from `state()`."""
        self._ports = dict(state.get("ports", {}))
        self.node_jobs.load_state(state.get("node_jobs", {}))

    def forget_nodes(self, nodes: frozenset[str]) -> None:
        """Drop evicted nodes' port state (past `engine.max_nodes`)."""
        drop_nodes(self._ports, nodes)
        self.node_jobs.forget_nodes(nodes)

    def observe(self, event: Event) -> list[Finding]:
        """Judge a HostSample's InfiniBand port state and error increments."""
        if event.type != "HostSample":
            return []
        r = event.record
        self.node_jobs.observe_host(r)
        errors, down = r.get("ib_errors"), r.get("ib_ports_down")
        if errors is None and down is None:
            return []  # no InfiniBand on this node
        node, ts = r["node"], int(r["ts"])
        h = self._ports.get(node)
        if h is None:
            h = self._ports[node] = {"recent": [], "last_error_ts": None, "cond": None}
        if errors:
            h["recent"].append([ts, int(errors)])
            h["last_error_ts"] = ts
        h["recent"] = [e for e in h["recent"] if ts - e[0] <= self._window]
        in_window = sum(e[1] for e in h["recent"])
        erroring = in_window >= self._errors_min and len(h["recent"]) >= self._samples_min
        ports_down = int(down or 0)
        congestion = {
            "xmit_wait_s": r.get("ib_xmit_wait_s"),
            "ecn_s": r.get("ib_ecn_marked_s"),
            "cnp_s": r.get("ib_cnp_s"),
        }
        cond = h["cond"]
        if ports_down or erroring:
            if cond is None:
                cond = h["cond"] = {"since": ts, "points": [], "jobs": []}
            cond.update(down=ports_down, errors=in_window, congestion=congestion)
            cond["points"] = [*cond["points"], [ts, float(errors or 0)]][-_POINTS:]
            cond["jobs"] = sorted(set(cond["jobs"]) | set(self.node_jobs.affected(node)))
            return [self._finding(node, cond, ts, True, job) for job in cond["jobs"]]
        if cond is None:
            return []
        last = h["last_error_ts"]
        if last is not None and ts - last < self._quiet:
            # Still inside the quiet period: the port keeps its alert (no flapping on a lull).
            cond.update(down=0, errors=in_window, congestion=congestion)
            return []
        cond.update(down=0, errors=in_window, congestion=congestion)
        out = [self._finding(node, cond, ts, False, job) for job in cond["jobs"] or [""]]
        h["cond"] = None
        return out

    def _finding(self, node: str, cond: dict[str, Any], ts: int, active: bool, job_id: str) -> Finding:
        window_s = self._window / 1000
        parts = []
        if cond["down"]:
            parts.append(f"{cond['down']} port(s) down")
        if cond["errors"]:
            parts.append(f"{cond['errors']} link errors in the last {window_s:g} s")
        congestion = cond.get("congestion") or {}
        seen = [
            f"{label} {value:,.0f}/s"
            for label, value in (
                ("xmit wait", congestion.get("xmit_wait_s")),
                ("ECN marks", congestion.get("ecn_s")),
                ("CNPs", congestion.get("cnp_s")),
            )
            if value
        ]
        evidence = "; ".join(parts) or "ports up, no errors"
        if seen:
            evidence += f" (congestion: {', '.join(seen)})"
        summary = (
            f"node {node}: InfiniBand/RoCE port degraded: {evidence}"
            if active
            else f"node {node}: InfiniBand/RoCE ports are well again ({evidence})"
        )
        return IB_PORT_DEGRADED.finding(
            key=(node, job_id) if job_id else (node,),
            active=active,
            ts=ts,
            severity="critical" if cond["down"] else "warning",
            job_id=job_id,
            node=node,
            since=cond["since"],
            invariant=IB_PORT_DEGRADED.says(errors=self._errors_min, window_s=window_s),
            observed=float(cond["errors"]),
            expected=float(self._errors_min),
            summary=summary,
            history_metric="ib_errors",
            history=tuple((int(t), float(v)) for t, v in cond["points"]),
            sustain_ms=0,
        )
