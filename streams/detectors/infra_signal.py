"""The machinery shared by the infrastructure rules: per-GPU state, who a node's fault concerns, periodic checks.

Not a rule itself. The GPU rules (`xid_error`, `ecc_uncorrectable`, `gpu_throttling`,
`gpu_memory_pressure`) subclass `GpuDetector`, which keeps one dict per GPU (`node|uuid`) with
the GPU's index and the job its last sample was attributed to, and builds their findings; the GPU
faults that need a reset (`xid_error`, `ecc_uncorrectable`) subclass `GpuFaultDetector`, which
reports them to every job on the node and resolves them after a quiet period. The host-level
rules (`host_memory_pressure`, `telemetry_missing`) report once per job their node's fault
affects (`NodeJobs`).

Ownership on shared nodes: a GPU-level finding carries the job holding that GPU (its RankBound
binding, else the `job_id` the node agent attributed the sample to) and routes to that job's team.
A host-level finding concerns every job with ranks on the node: it is reported once per affected
job (key `(node, job_id)`, so each has its own fingerprint and reaches its own team), the affected
jobs being the running jobs bound to the node, the jobs whose JobStarted lists it, and the jobs
its last HostSample named (`job_ids`). The jobs a condition was reported for are kept with it, so
each is resolved too. A GPU or node that no job holds has job_id "" (the platform's default route).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

from schemas.records import Event
from streams.detectors.base import Detector, Finding, Topology, drop_nodes, module_defaults
from streams.detectors.catalogue import Rule

__all__ = ["CHECK_DEFAULTS", "GpuDetector", "GpuFaultDetector", "NodeJobs", "PeriodicCheck"]

CHECK_DEFAULTS: dict[str, Any] = {
    "check_every_s": 5.0,  # timeouts are re-checked at most this often (watermark time)
}


class NodeJobs:
    """The jobs a host-level fault on a node affects; remembers the jobs each node's HostSamples named."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self.named: dict[str, list[str]] = {}  # node -> job_ids of its last HostSample that named any

    def observe_host(self, r: dict[str, Any]) -> None:
        """Note the jobs a HostSample names (a sample naming none keeps the last ones)."""
        if r.get("job_ids"):
            self.named[r["node"]] = sorted(str(j) for j in r["job_ids"])

    def forget_nodes(self, nodes: frozenset[str]) -> None:
        """Drop evicted nodes' job lists."""
        drop_nodes(self.named, nodes)

    def affected(self, node: str) -> list[str]:
        """Every job a host-level fault on `node` affects (sorted); [""] when no job is known there."""
        bindings = self.topology.bindings_on_node(node)
        jobs = {b.job_id for b in bindings if self.running(b.job_id)}
        jobs.update(j.job_id for j in self.topology.active_jobs() if node in j.node_set())
        jobs.update(j for j in self.named.get(node, ()) if j and self.running(j))
        if jobs:
            return sorted(jobs)
        return [bindings[0].job_id] if bindings else [""]

    def running(self, job_id: str) -> bool:
        """Whether a job is known and running."""
        job = self.topology.jobs.get(job_id)
        return job is not None and job.state == "running"

    def state(self) -> dict[str, Any]:
        """JSON-able state."""
        return {k: self.named[k] for k in sorted(self.named)}

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore from `state()`."""
        self.named = {k: list(v) for k, v in state.items()}


class PeriodicCheck:
    """Timeouts re-checked at most once per `every_ms` of watermark time (its state: the last check)."""

    def __init__(self, every_ms: int) -> None:
        self.every_ms = every_ms
        self.last = -(2**62)

    def due(self, watermark: int) -> bool:
        """Whether to check at `watermark` (and, if so, note it as the last check)."""
        if watermark - self.last < self.every_ms:
            return False
        self.last = watermark
        return True


class GpuDetector(Detector):
    """A rule judged per GPU from its GpuSamples; see the module doc."""

    reads: ClassVar[frozenset[str] | None] = frozenset({"GpuSample"})

    def __init__(self, topology: Topology, params: dict[str, Any] | None = None) -> None:
        super().__init__(topology, params)
        self.p = {**(module_defaults(type(self)) or {}), **self.params}  # the subclass module's knobs
        self._gpus: dict[str, dict[str, Any]] = {}  # "node|uuid" -> per-GPU state

    def forget_nodes(self, nodes: frozenset[str]) -> None:
        """Drop evicted nodes' GPUs."""
        drop_nodes(self._gpus, nodes)

    # -- what a subclass says --------------------------------------------------------------------

    def new_gpu(self) -> dict[str, Any]:
        """The rule's own state of a GPU seen for the first time."""
        return {}

    def sample(self, node: str, uuid: str, g: dict[str, Any], r: dict[str, Any]) -> list[Finding]:
        """Judge one GpuSample `r` of the GPU whose state is `g`."""
        raise NotImplementedError

    # -- state -----------------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """JSON-able state: per GPU."""
        return {"gpus": {k: self._gpus[k] for k in sorted(self._gpus)}}

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore from `state()`."""
        self._gpus = dict(state.get("gpus", {}))

    # -- events ----------------------------------------------------------------------------------

    def observe(self, event: Event) -> list[Finding]:
        """Note a GpuSample's GPU index and job, then judge it."""
        if event.type != "GpuSample":
            return []
        r = event.record
        node, uuid = r["node"], r["gpu_uuid"]
        key = f"{node}|{uuid}"
        g = self._gpus.get(key)
        if g is None:
            g = self._gpus[key] = {"index": r["gpu_index"], **self.new_gpu()}
        g["index"] = r["gpu_index"]
        g["job"] = r.get("job_id") or None
        return self.sample(node, uuid, g, r)

    # -- findings --------------------------------------------------------------------------------

    def gpu_identity(self, node: str, uuid: str) -> tuple[str, int | None]:
        """The job (and rank) holding a GPU: its binding, else the job its last sample named."""
        binding = self.topology.binding_for_gpu(node, uuid)
        if binding is not None:
            return binding.job_id, binding.rank
        g = self._gpus.get(f"{node}|{uuid}")
        return (g.get("job") or "", None) if g is not None else ("", None)

    def gpu_finding(self, rule: Rule, node: str, uuid: str, g: dict[str, Any], ts: int, **kw: Any) -> Finding:
        """A finding of `rule` about one GPU, for the job holding it."""
        job_id, rank = self.gpu_identity(node, uuid)
        return rule.finding(
            key=(node, uuid),
            ts=ts,
            job_id=job_id,
            node=node,
            rank=rank,
            gpu_uuid=uuid,
            gpu_index=g["index"],
            **kw,
        )

    @staticmethod
    def where(node: str, g: dict[str, Any]) -> str:
        """`GPU 3 of node node-02`."""
        return f"GPU {g['index']} of node {node}"


class GpuFaultDetector(GpuDetector):
    """A GPU fault that needs a reset: reported to every job on its node, resolved after a quiet period.

    A subclass keeps its condition in `g[slot]` (with `since` and `last`, the time of the latest
    error), names the knob of its quiet period and builds its finding in `finding`. The quiet
    period is checked at most every `check_every_s` of watermark time.
    """

    reads: ClassVar[frozenset[str] | None] = frozenset({"GpuSample", "HostSample"})
    slot: ClassVar[str] = ""  # the per-GPU key of the condition
    quiet_knob: ClassVar[str] = ""  # the knob of the quiet period, in seconds

    def __init__(self, topology: Topology, params: dict[str, Any] | None = None) -> None:
        super().__init__(topology, params)
        self.quiet_ms = int(float(self.p[self.quiet_knob]) * 1000)
        self.node_jobs = NodeJobs(topology)
        self.check = PeriodicCheck(int(float(self.p["check_every_s"]) * 1000))

    def forget_nodes(self, nodes: frozenset[str]) -> None:
        """Drop evicted nodes' GPUs and the jobs their HostSamples named."""
        super().forget_nodes(nodes)
        self.node_jobs.forget_nodes(nodes)

    def finding(self, node: str, uuid: str, g: dict[str, Any], ts: int, active: bool) -> Finding:
        """The rule's finding for GPU `g`'s condition."""
        raise NotImplementedError

    def state(self) -> dict[str, Any]:
        """JSON-able state: per GPU, the jobs HostSamples named, the last periodic check."""
        return {**super().state(), "node_jobs": self.node_jobs.state(), "checked": self.check.last}

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore from `state()`."""
        super().load_state(state)
        self.node_jobs.load_state(state.get("node_jobs", {}))
        self.check.last = int(state.get("checked", -(2**62)))

    def observe(self, event: Event) -> list[Finding]:
        """A HostSample names the node's jobs; a GpuSample is judged."""
        if event.type == "HostSample":
            self.node_jobs.observe_host(event.record)
            return []
        return super().observe(event)

    def advance(self, watermark: int) -> list[Finding]:
        """Resolve the conditions quiet for the quiet period."""
        if not self.check.due(watermark):
            return []
        out: list[Finding] = []
        for key in sorted(self._gpus):
            g = self._gpus[key]
            cond = g[self.slot]
            if cond is not None and watermark - cond["last"] >= self.quiet_ms:
                node, uuid = key.split("|", 1)
                out += self.shared(self.finding(node, uuid, g, watermark, False), node, cond)
                g[self.slot] = None
        return out

    def shared(self, finding: Finding, node: str, cond: dict[str, Any]) -> list[Finding]:
        """A fault of one GPU, also reported to every other job running on its node.

        Recovering the GPU means a GPU reset, which on NVSwitch systems resets the whole baseboard,
        or a node drain: the co-located jobs stop too, so their teams hear of it with their own
        job's identity (key + job, one alert each); the jobs are fixed when the condition starts.
        """
        if finding.active:
            others = {j for j in self.node_jobs.affected(node) if j and j != finding.job_id}
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
