"""Infrastructure invariants: healthy GPUs and hosts, and telemetry from every node of a running job.

Rules (category `infra`):

- `xid_error` (node + GPU): a GpuSample with `xid` set fires at once; critical for the XID
  classes in `xid_critical` (48 DBE, 63/64 row remapping, 74 NVLink, 79 fallen off the bus,
  94/95 contained/uncontained ECC), warning otherwise; resolves after `xid_quiet_s` without one.
- `ecc_uncorrectable` (node + GPU): `ecc_uncorrected` or `remapped_rows_uncorrectable` goes up
  between two samples of the GPU: critical, at once; resolves after `ecc_quiet_s` without one.
- `gpu_throttling` (node + GPU): a thermal or power clock-event reason (SW power cap 0x4, HW
  slowdown 0x8, SW thermal 0x20, HW thermal 0x40, HW power brake 0x80; GPU idle 0x1 and
  application clocks 0x2 are ignored) with the SM clock below `throttle_clock_ratio` x its maximum,
  sustained for `throttle_sustain_s`.
- `gpu_memory_pressure` (node + GPU): used / total above `gpu_mem_ratio` for `gpu_mem_sustain_s`.
- `host_memory_pressure` (node): available / total below `host_mem_available_ratio` for
  `host_mem_sustain_s`, or an `oom_kills` increment (at once; the condition lasts `oom_quiet_s`).
- `telemetry_missing` (node): a node that hosts ranks of a running job and has sent telemetry
  before sends no GpuSample/HostSample for more than max(`missing_intervals` x its learned sample
  interval, `missing_min_s`), measured on the watermark (which the other nodes and the steps
  keep moving), while some other node's telemetry is still fresh (`require_live_peer`: when every
  node is silent, the pipeline or the input stopped, not one agent); resolves on its next sample.

Ownership on shared nodes: a GPU-level finding carries the job holding that GPU (its RankBound
binding, else the `job_id` the node agent attributed the sample to) and routes to that job's team.
A host-level finding (`host_memory_pressure`, `telemetry_missing`) concerns every job with ranks on
the node: it is reported once per affected job (key `(node, job_id)`, so each has its own
fingerprint and reaches its own team), the affected jobs being the running jobs bound to the node,
the jobs whose JobStarted lists it, and the jobs its last HostSample named (`job_ids`). The jobs a
condition was reported for are kept with it, so each is resolved too. A GPU or node that no job
holds has job_id "" (the platform's default route).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

from schemas.records import Event
from streams.detectors.base import Detector, Finding, Severity, Topology
from streams.detectors.history import add_point, points_of
from streams.detectors.stats import median

__all__ = ["DEFAULTS", "THROTTLE_REASONS", "InfrastructureDetector"]

DEFAULTS: dict[str, Any] = {
    "xid_critical": [48, 63, 64, 74, 79, 94, 95],  # XID codes reported as critical
    "xid_quiet_s": 300.0,  # an XID condition resolves after this long without another XID
    "ecc_quiet_s": 300.0,  # an uncorrectable-ECC condition resolves after this long without a new error
    "throttle_mask": 0xEC,  # clock-event reason bits that count as throttling (0x4|0x8|0x20|0x40|0x80)
    "throttle_clock_ratio": 0.85,  # ... and only while the SM clock is below this x its maximum
    "throttle_sustain_s": 120.0,  # throttling must last this long to fire
    "gpu_mem_ratio": 0.97,  # device memory used / total above this is pressure
    "gpu_mem_sustain_s": 60.0,  # ... for this long
    "host_mem_available_ratio": 0.05,  # host memory available / total below this is pressure
    "host_mem_sustain_s": 60.0,  # ... for this long
    "oom_quiet_s": 120.0,  # after an OOM kill the condition holds this long
    "missing_intervals": 3.0,  # silent for this many learned sample intervals ...
    "missing_min_s": 30.0,  # ... and at least this long -> telemetry_missing
    "default_interval_s": 10.0,  # sample interval assumed before one is learned
    "require_live_peer": True,  # only while another node's telemetry is fresh (else the pipeline stopped)
    "check_every_s": 5.0,  # timeouts are re-checked at most this often (watermark time)
    "reemit_s": 60.0,  # re-report an active timed condition at most this often
}

# Clock-event reason bits, from NVML's nvmlClocksEventReason* constants.
THROTTLE_REASONS: dict[int, str] = {
    0x4: "SW power cap",
    0x8: "HW slowdown",
    0x20: "SW thermal slowdown",
    0x40: "HW thermal slowdown",
    0x80: "HW power brake",
}

_HISTORY = 8


class InfrastructureDetector(Detector):
    """XID, ECC, throttling, GPU and host memory pressure, and missing node telemetry."""

    rules: ClassVar[tuple[str, ...]] = (
        "xid_error",
        "ecc_uncorrectable",
        "gpu_throttling",
        "gpu_memory_pressure",
        "host_memory_pressure",
        "telemetry_missing",
    )

    def __init__(self, topology: Topology, params: dict[str, Any] | None = None) -> None:
        super().__init__(topology, params)
        p = {**DEFAULTS, **self.params}
        self._xid_critical = {int(x) for x in p["xid_critical"]}
        self._xid_quiet = int(float(p["xid_quiet_s"]) * 1000)
        self._ecc_quiet = int(float(p["ecc_quiet_s"]) * 1000)
        self._thr_mask = int(p["throttle_mask"])
        self._thr_ratio = float(p["throttle_clock_ratio"])
        self._thr_sustain = int(float(p["throttle_sustain_s"]) * 1000)
        self._gmem_ratio = float(p["gpu_mem_ratio"])
        self._gmem_sustain = int(float(p["gpu_mem_sustain_s"]) * 1000)
        self._hmem_ratio = float(p["host_mem_available_ratio"])
        self._hmem_sustain = int(float(p["host_mem_sustain_s"]) * 1000)
        self._oom_quiet = int(float(p["oom_quiet_s"]) * 1000)
        self._miss_n = float(p["missing_intervals"])
        self._miss_min = int(float(p["missing_min_s"]) * 1000)
        self._default_interval = int(float(p["default_interval_s"]) * 1000)
        self._live_peer = bool(p["require_live_peer"])
        self._check_every = int(float(p["check_every_s"]) * 1000)
        self._reemit = int(float(p["reemit_s"]) * 1000)
        self._gpus: dict[str, dict[str, Any]] = {}  # "node|uuid" -> per-GPU state
        self._hosts: dict[str, dict[str, Any]] = {}  # node -> host memory state
        self._nodes: dict[str, dict[str, Any]] = {}  # node -> last sample, intervals, missing
        self._checked = -(2**62)

    # -- state -------------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """JSON-able state: per GPU, per host and per node."""
        return {
            "gpus": {k: self._gpus[k] for k in sorted(self._gpus)},
            "hosts": {k: self._hosts[k] for k in sorted(self._hosts)},
            "nodes": {k: self._nodes[k] for k in sorted(self._nodes)},
            "checked": self._checked,
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore from `state()`."""
        self._gpus = dict(state.get("gpus", {}))
        self._hosts = dict(state.get("hosts", {}))
        self._nodes = dict(state.get("nodes", {}))
        self._checked = int(state.get("checked", -(2**62)))

    # -- identity ----------------------------------------------------------------------------

    def _gpu_identity(self, node: str, uuid: str) -> tuple[str, int | None]:
        binding = self.topology.binding_for_gpu(node, uuid)
        if binding is not None:
            return binding.job_id, binding.rank
        g = self._gpus.get(f"{node}|{uuid}")
        return (g.get("job") or "", None) if g is not None else ("", None)

    def _node_jobs(self, node: str) -> list[str]:
        """Every job a host-level fault on `node` affects (sorted); [""] when no job is known there."""
        bindings = self.topology.bindings_on_node(node)
        jobs = {b.job_id for b in bindings if self._running(b.job_id)}
        jobs.update(j.job_id for j in self.topology.active_jobs() if node in j.nodes)
        h = self._hosts.get(node)
        if h is not None:
            jobs.update(j for j in h.get("jobs", ()) if j and self._running(j))
        if jobs:
            return sorted(jobs)
        return [bindings[0].job_id] if bindings else [""]

    def _running(self, job_id: str) -> bool:
        job = self.topology.jobs.get(job_id)
        return job is not None and job.state == "running"

    # -- events ------------------------------------------------------------------------------

    def observe(self, event: Event) -> list[Finding]:
        """Check a GpuSample or HostSample; note the node's telemetry as alive."""
        if event.type == "GpuSample":
            out = self._alive(event.record)
            return out + self._gpu_sample(event.record)
        if event.type == "HostSample":
            out = self._alive(event.record)
            return out + self._host_sample(event.record)
        return []

    def _gpu_sample(self, r: dict[str, Any]) -> list[Finding]:
        node, uuid, ts = r["node"], r["gpu_uuid"], r["ts"]
        key = f"{node}|{uuid}"
        g = self._gpus.get(key)
        if g is None:
            g = self._gpus[key] = {
                "index": r["gpu_index"],
                "xid": None,
                "ecc_last": None,
                "rows_last": None,
                "ecc": None,
                "thr": None,
                "mem": None,
                "clock": [],
            }
        g["index"] = r["gpu_index"]
        g["job"] = r.get("job_id") or None
        out: list[Finding] = []
        # XID: a sample carries the code at the moment of the event.
        xid = r.get("xid")
        if xid is not None:
            cond = g["xid"]
            if cond is None or cond["code"] != xid or ts - cond["emit"] >= self._reemit:
                if cond is None:
                    cond = g["xid"] = {"since": ts, "code": xid, "n": 0, "emit": ts}
                cond.update(code=xid, last=ts, emit=ts)
                cond["n"] += 1
                out += self._shared(self._xid_finding(node, uuid, g, ts, True), node, cond)
            else:
                cond["last"] = ts
                cond["n"] += 1
        # ECC: volatile counters; only an increase between two samples is news.
        ecc, rows = r.get("ecc_uncorrected"), r.get("remapped_rows_uncorrectable")
        inc = 0
        if ecc is not None and g["ecc_last"] is not None and ecc > g["ecc_last"]:
            inc += int(ecc - g["ecc_last"])
        if rows is not None and g["rows_last"] is not None and rows > g["rows_last"]:
            inc += int(rows - g["rows_last"])
        g["ecc_last"] = ecc if ecc is not None else g["ecc_last"]
        g["rows_last"] = rows if rows is not None else g["rows_last"]
        if inc:
            cond = g["ecc"]
            if cond is None:
                cond = g["ecc"] = {"since": ts, "n": 0, "emit": ts}
            cond["n"] += inc
            cond["last"] = cond["emit"] = ts
            cond["total"] = ecc
            out += self._shared(self._ecc_finding(node, uuid, g, ts, True), node, cond)
        out += self._throttle(node, uuid, g, r)
        out += self._gpu_memory(node, uuid, g, r)
        return out

    def _throttle(self, node: str, uuid: str, g: dict[str, Any], r: dict[str, Any]) -> list[Finding]:
        ts = r["ts"]
        reasons = int(r.get("clock_event_reasons") or 0) & self._thr_mask
        clock, clock_max = r.get("sm_clock_mhz"), r.get("sm_clock_max_mhz")
        ratio = clock / clock_max if clock is not None and clock_max else None
        if ratio is not None:
            g["clock"] = [*g["clock"], [ts, round(ratio, 4)]][-_HISTORY:]
        throttled = bool(reasons) and ratio is not None and ratio < self._thr_ratio
        cond = g["thr"]
        if throttled:
            if cond is None:
                cond = g["thr"] = {"since": ts}
            cond.update(reasons=reasons, ratio=ratio, clock=clock, clock_max=clock_max)
            return [self._throttle_finding(node, uuid, g, ts, True)]
        if cond is not None:
            out = [self._throttle_finding(node, uuid, g, ts, False)]
            g["thr"] = None
            return out
        return []

    def _gpu_memory(self, node: str, uuid: str, g: dict[str, Any], r: dict[str, Any]) -> list[Finding]:
        used, total = r.get("mem_used_bytes"), r.get("mem_total_bytes")
        if used is None or not total:
            return []
        ratio = used / total
        cond = g["mem"]
        if ratio > self._gmem_ratio:
            if cond is None:
                cond = g["mem"] = {"since": r["ts"], "points": []}
            cond["ratio"] = ratio
            cond["points"] = [*cond["points"], [r["ts"], round(ratio, 4)]][-_HISTORY:]
            return [self._gpu_mem_finding(node, uuid, g, r["ts"], True)]
        if cond is not None:
            cond["ratio"] = ratio
            out = [self._gpu_mem_finding(node, uuid, g, r["ts"], False)]
            g["mem"] = None
            return out
        return []

    def _host_sample(self, r: dict[str, Any]) -> list[Finding]:
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
        if r.get("job_ids"):
            h["jobs"] = sorted(str(j) for j in r["job_ids"])
        avail, total, ooms = r.get("mem_available_bytes"), r.get("mem_total_bytes"), r.get("oom_kills")
        if ooms is not None:
            if h["oom_last"] is not None and ooms > h["oom_last"]:
                h["oom_ts"] = ts
                h["oom_n"] += int(ooms - h["oom_last"])
            h["oom_last"] = ooms
        frac = avail / total if avail is not None and total else None
        low = frac is not None and frac < self._hmem_ratio
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
            cond["jobs"] = sorted(set(cond.get("jobs", [])) | set(self._node_jobs(node)))
            if frac is not None:
                cond["points"] = [*cond["points"], [ts, round(frac, 4)]][-_HISTORY:]
            return [self._host_finding(node, h, ts, True, job) for job in cond["jobs"]]
        if cond is not None:
            cond["frac"], cond["oom"] = frac, False
            out = [self._host_finding(node, h, ts, False, job) for job in cond.get("jobs", [""])]
            h["cond"] = None
            h["oom_n"] = 0
            return out
        return []

    def _alive(self, r: dict[str, Any]) -> list[Finding]:
        node, ts = r["node"], r["ts"]
        n = self._nodes.get(node)
        if n is None:
            n = self._nodes[node] = {"last": ts, "deltas": [], "missing": None}
            return []
        if ts > n["last"]:
            # Samples of all GPUs of a node share one timestamp; only distinct times teach the interval.
            n["deltas"] = [*n["deltas"], ts - n["last"]][-_HISTORY:]
            n["last"] = ts
        missing = n["missing"]
        if missing is None:
            return []
        n["missing"] = None
        return [self._missing_finding(node, n, missing, ts, False, job) for job in missing.get("jobs", [""])]

    # -- timeouts ----------------------------------------------------------------------------

    def advance(self, watermark: int) -> list[Finding]:
        """Resolve quiet XID/ECC conditions; report nodes of running jobs whose telemetry stopped."""
        if watermark - self._checked < self._check_every:
            return []
        self._checked = watermark
        out: list[Finding] = []
        for key in sorted(self._gpus):
            g = self._gpus[key]
            node, uuid = key.split("|", 1)
            if g["xid"] is not None and watermark - g["xid"]["last"] >= self._xid_quiet:
                out += self._shared(self._xid_finding(node, uuid, g, watermark, False), node, g["xid"])
                g["xid"] = None
            if g["ecc"] is not None and watermark - g["ecc"]["last"] >= self._ecc_quiet:
                out += self._shared(self._ecc_finding(node, uuid, g, watermark, False), node, g["ecc"])
                g["ecc"] = None
        out += self._check_missing(watermark)
        return out

    def _check_missing(self, wm: int) -> list[Finding]:
        nodes: set[str] = set()
        for job in self.topology.active_jobs():
            nodes.update(job.nodes)
            nodes.update(b.node for b in self.topology.ranks_of(job.job_id))
        out: list[Finding] = []
        freshest = max((n["last"] for n in self._nodes.values()), default=None)
        if self._live_peer and (freshest is None or wm - freshest > self._miss_min):
            # No node at all reports: the telemetry pipeline (or the input) stopped, not one
            # node's agent; the worker's wall-clock guard (docs/worker.md) covers that case.
            return out
        for node in sorted(nodes):
            n = self._nodes.get(node)
            if n is None:
                continue  # never heard from: no agent is expected there
            interval = median(n["deltas"]) if n["deltas"] else self._default_interval
            limit = max(int(self._miss_n * (interval or self._default_interval)), self._miss_min)
            silent = wm - n["last"]
            if silent <= limit:
                continue
            missing = n["missing"]
            if missing is None:
                missing = n["missing"] = {"since": n["last"] + limit, "limit": limit, "emit": wm}
            elif wm - missing["emit"] < self._reemit:
                continue
            missing["emit"] = wm
            missing["jobs"] = sorted(set(missing.get("jobs", [])) | set(self._node_jobs(node)))
            out.extend(self._missing_finding(node, n, missing, wm, True, job) for job in missing["jobs"])
        return out

    # -- findings ----------------------------------------------------------------------------

    def _gpu_finding(self, rule: str, node: str, uuid: str, g: dict[str, Any], ts: int, **kw: Any) -> Finding:
        job_id, rank = self._gpu_identity(node, uuid)
        return Finding(
            rule=rule,
            key=(node, uuid),
            ts=ts,
            category="infra",
            job_id=job_id,
            node=node,
            rank=rank,
            gpu_uuid=uuid,
            gpu_index=g["index"],
            suspected_layer="gpu",
            **kw,
        )

    def _shared(self, finding: Finding, node: str, cond: dict[str, Any]) -> list[Finding]:
        """An XID or ECC error of one GPU, also reported to every other job running on its node.

        Recovering the GPU means a GPU reset, which on NVSwitch systems resets the whole baseboard,
        or a node drain: the co-located jobs stop too, so their teams hear of it with their own
        job's identity (key + job, one alert each); the jobs are fixed when the condition starts.
        """
        if finding.active:
            others = {j for j in self._node_jobs(node) if j and j != finding.job_id}
            cond["shared"] = sorted(set(cond.get("shared", ())) | others)
        out = [finding]
        for job_id in cond.get("shared", ()):
            summary = finding.summary
            if finding.active:
                summary += (
                    f" (a GPU of {'job ' + finding.job_id if finding.job_id else 'no known job'}; recovering it"
                    f" needs a GPU reset or a node drain, which stops job {job_id} too)"
                )
            out.append(
                replace(finding, key=(*finding.key, job_id), job_id=job_id, rank=None, summary=summary)
            )
        return out

    def _where(self, node: str, g: dict[str, Any]) -> str:
        return f"GPU {g['index']} of node {node}"

    def _xid_finding(self, node: str, uuid: str, g: dict[str, Any], ts: int, active: bool) -> Finding:
        cond = g["xid"]
        code = int(cond["code"])
        history = add_point(cond, ts, float(code)) if active else points_of(cond)
        severity: Severity = "critical" if code in self._xid_critical else "warning"
        summary = (
            f"{self._where(node, g)} reported XID {code}"
            if active
            else f"{self._where(node, g)} reported no XID for {self._xid_quiet // 1000}s (last: XID {code})"
        )
        return self._gpu_finding(
            "xid_error",
            node,
            uuid,
            g,
            ts,
            active=active,
            severity=severity,
            since=cond["since"],
            invariant="the GPU driver reports no XID errors",
            observed=float(code),
            summary=summary,
            history_metric="xid",
            history=history,
            sustain_ms=0,
        )

    def _ecc_finding(self, node: str, uuid: str, g: dict[str, Any], ts: int, active: bool) -> Finding:
        cond = g["ecc"]
        history = add_point(cond, ts, float(cond["n"])) if active else points_of(cond)
        summary = (
            f"{self._where(node, g)} had {cond['n']} new uncorrectable ECC error(s) or row remapping(s)"
            if active
            else f"{self._where(node, g)} had no new uncorrectable ECC error for {self._ecc_quiet // 1000}s"
        )
        return self._gpu_finding(
            "ecc_uncorrectable",
            node,
            uuid,
            g,
            ts,
            active=active,
            severity="critical",
            since=cond["since"],
            invariant="the uncorrectable ECC error count of a GPU does not increase",
            observed=float(cond["n"]),
            expected=0.0,
            summary=summary,
            history_metric="ecc_uncorrected",
            history=history,
            sustain_ms=0,
        )

    def _throttle_finding(self, node: str, uuid: str, g: dict[str, Any], ts: int, active: bool) -> Finding:
        cond = g["thr"]
        names = ", ".join(name for bit, name in sorted(THROTTLE_REASONS.items()) if cond["reasons"] & bit)
        summary = (
            f"{self._where(node, g)} is throttled ({names}): SM clock {cond['clock']} of {cond['clock_max']} MHz"
            if active
            else f"{self._where(node, g)} is no longer throttled"
        )
        return self._gpu_finding(
            "gpu_throttling",
            node,
            uuid,
            g,
            ts,
            active=active,
            severity="warning",
            since=cond["since"],
            invariant=f"no thermal or power throttling with the SM clock below {100 * self._thr_ratio:g}% of max",
            observed=cond["ratio"],
            expected=self._thr_ratio,
            summary=summary,
            history_metric="sm_clock_ratio",
            history=tuple((int(t), float(v)) for t, v in g["clock"]),
            sustain_ms=self._thr_sustain,
        )

    def _gpu_mem_finding(self, node: str, uuid: str, g: dict[str, Any], ts: int, active: bool) -> Finding:
        cond = g["mem"]
        summary = (
            f"{self._where(node, g)} has {100 * cond['ratio']:.1f}% of its memory in use"
            if active
            else f"{self._where(node, g)} memory use is back to {100 * cond['ratio']:.1f}%"
        )
        return self._gpu_finding(
            "gpu_memory_pressure",
            node,
            uuid,
            g,
            ts,
            active=active,
            severity="warning",
            since=cond["since"],
            invariant=f"GPU memory in use stays below {100 * self._gmem_ratio:g}% of total",
            observed=cond["ratio"],
            expected=self._gmem_ratio,
            summary=summary,
            history_metric="gpu_mem_used_ratio",
            history=tuple((int(t), float(v)) for t, v in cond["points"]),
            sustain_ms=self._gmem_sustain,
        )

    def _host_finding(self, node: str, h: dict[str, Any], ts: int, active: bool, job_id: str) -> Finding:
        cond = h["cond"]
        frac = cond["frac"]
        avail = f"{100 * frac:.1f}% of host memory available" if frac is not None else "host memory unknown"
        if active and cond["oom"]:
            summary = f"node {node}: the kernel OOM-killed {h['oom_n']} process(es); {avail}"
        elif active:
            summary = f"node {node} has only {avail}"
        else:
            summary = f"node {node} memory pressure is over ({avail})"
        return Finding(
            rule="host_memory_pressure",
            key=(node, job_id) if job_id else (node,),
            active=active,
            ts=ts,
            category="infra",
            severity="critical" if cond["oom"] else "warning",
            job_id=job_id,
            node=node,
            since=cond["since"],
            invariant=(
                f"host memory available stays above {100 * self._hmem_ratio:g}% of total and the kernel kills no "
                "process for lack of memory"
            ),
            observed=frac,
            expected=self._hmem_ratio,
            summary=summary,
            suspected_layer="host",
            history_metric="host_mem_available_ratio",
            history=tuple((int(t), float(v)) for t, v in cond["points"]),
            sustain_ms=0 if cond["oom"] else self._hmem_sustain,
        )

    def _missing_finding(
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
