"""The detector contract: findings, the shared job topology, and the `Detector` base class.

Detectors are pure: no Kafka, Faust or ClickHouse. Time is event time (UTC milliseconds).
A detector reports *conditions* (`Finding.active` true or false for an identity); the alert
state machine in `streams.alerting.lifecycle` turns conditions into pending -> firing ->
resolved alerts, so no detector re-implements sustain periods or de-duplication.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from schemas.progress import Estimate
from schemas.records import Event
from streams.detectors.pace import JobPace

if TYPE_CHECKING:
    from streams.detectors.catalogue import Rule

__all__ = [
    "LEADER_RANK",
    "Binding",
    "Category",
    "Detector",
    "Finding",
    "JobAndHostDetector",
    "JobInfo",
    "PerJobDetector",
    "Severity",
    "Topology",
    "dumps_state",
    "loads_state",
    "module_defaults",
]

# The rank whose steps carry the job's global values (loss, gradient norm, skips): the numerical,
# validation and skip rules read its steps only, and the rank stage passes them to the job stage.
LEADER_RANK = 0

Category = Literal["model", "data", "platform", "infra"]
_ENDED = ("completed", "failed")  # job states after which a job makes no more progress
Severity = Literal["info", "warning", "critical"]
_MAX_NODE_CLUSTERS = 200_000  # nodes whose cluster is remembered (a 100k-GPU fleet has ~12.5k)


@dataclass(frozen=True, slots=True)
class Finding:
    """A detector's verdict on one condition of one identity at one event time.

    `key` is the identity within the rule (e.g. `(job_id, "3")` for rank 3); the alert
    fingerprint is `rule` + `key`. `active=False` says the condition no longer holds.
    `sustain_ms` is how long the condition must hold before the alert fires (0: at once).
    """

    rule: str
    key: tuple[str, ...]
    active: bool
    ts: int
    category: Category = "platform"
    severity: Severity = "warning"
    job_id: str = ""
    node: str | None = None
    rank: int | None = None
    gpu_uuid: str | None = None
    gpu_index: int | None = None
    since: int | None = None  # when the condition began (event time), if known
    invariant: str = ""
    observed: float | None = None
    expected: float | None = None
    summary: str = ""
    suspected_layer: str = "unknown"
    history_metric: str = ""
    history: tuple[tuple[int, float], ...] = ()
    baseline: str | None = None
    baseline_runs: int | None = None
    sustain_ms: int = 0
    team: str = ""  # the team a declared rule names as its owner (acceptance rules); "": the job's team

    @property
    def fingerprint(self) -> str:
        """Rule + identity: stable while the condition lasts."""
        return "/".join((self.rule, *self.key))


@dataclass
class JobInfo:
    """What JobStarted and JobStateChanged said about a job (a pending job's cluster from the scheduler)."""

    job_id: str
    run_id: str = ""
    owner: str = ""
    team: str = ""
    cluster: str = ""
    model_name: str = ""
    model_version: str = ""
    dataset_version: str = ""
    workload_family: str = ""
    world_size: int = 0
    nodes: list[str] = field(default_factory=list)
    gpu_class: str = ""
    global_batch_size: int | None = None
    seq_len: int | None = None
    checkpoint_max_age_s: float | None = None
    checkpoint_timeout_s: float | None = None
    target_steps: int | None = None
    target_tokens: int | None = None
    target_epochs: float | None = None
    labels: dict[str, str] = field(default_factory=dict)
    # The parallel layout and the data path (part of the baseline key), and what a restore test
    # must match: code, runtime, configuration and checkpoint format; the image it runs in.
    data_parallel: int | None = None
    tensor_parallel: int | None = None
    pipeline_parallel: int | None = None
    expert_parallel: int | None = None
    zero_stage: int | None = None
    sharding: str = ""
    storage_tier: str = ""
    code_version: str = ""
    runtime_version: str = ""
    config_hash: str = ""
    checkpoint_format: str = ""
    image: str = ""
    workspace: str = ""
    state: str = "running"
    state_since: int = 0
    started_ts: int = 0
    restart_count: int = 0

    @classmethod
    def started(cls, r: dict[str, Any], restart_count: int) -> JobInfo:
        """What a JobStarted record `r` says of its job, running from its time: each field it states
        (one it lacks or leaves null keeps the default here), its nodes and labels copied."""
        stated = {name: r[name] for name in _STATED if r.get(name) is not None}
        return cls(
            job_id=r["job_id"],
            nodes=list(r.get("nodes") or []),
            labels=dict(r.get("labels") or {}),
            state="running",
            state_since=r["ts"],
            started_ts=r["ts"],
            restart_count=restart_count,
            **stated,
        )

    def node_set(self) -> frozenset[str]:
        """`nodes` as a set, made once per list the job names (a JobStarted may list 32,768 nodes:
        a rule asking "is this node the job's" must not walk the list at every check)."""
        cached = self.__dict__.get("_node_set")
        if cached is None or cached[0] is not self.nodes or cached[1] != len(self.nodes):
            cached = self.__dict__["_node_set"] = (self.nodes, len(self.nodes), frozenset(self.nodes))
        return cached[2]


# The JobInfo fields a JobStarted states as they are (the rest: the identity, the copied containers
# and what the states that follow set).
_STATED = tuple(
    f.name
    for f in fields(JobInfo)
    if f.name not in ("job_id", "nodes", "labels", "state", "state_since", "started_ts", "restart_count")
)


@dataclass
class Binding:
    """RankBound: which node, GPU and process a rank of a job runs on."""

    job_id: str
    rank: int
    node: str
    gpu_uuid: str | None
    gpu_index: int | None
    pid: int
    ts: int = 0


def drop_nodes(table: dict[str, Any], nodes: frozenset[str], prefix: str = "") -> None:
    """Delete the entries of `table` keyed by one of `nodes`: `node`, `node|gpu`, `prefix + node`."""
    cut = len(prefix)
    for key in [k for k in table if k.startswith(prefix) and k[cut:].split("|", 1)[0] in nodes]:
        del table[key]


class Topology:
    """Jobs and rank bindings seen so far: the join between training events and node telemetry.

    The engine feeds every event to `observe` before the detectors see it.
    """

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self.jobs: dict[str, JobInfo] = {}
        self.bindings: dict[tuple[str, int], Binding] = {}
        self._by_gpu: dict[tuple[str, str], Binding] = {}
        self._by_job: dict[str, dict[int, Binding]] = {}  # job -> rank -> binding
        self._by_node: dict[str, dict[tuple[str, int], Binding]] = {}  # node -> (job, rank) -> binding
        self._ranks: dict[str, list[Binding]] = {}  # job -> bindings by rank; rebuilt after a rank binds
        self._on_node: dict[tuple[str, str], list[Binding]] = {}  # (job, node) -> its bindings by rank
        self.pace: dict[str, JobPace] = {}  # job -> its current run's steps, rate, tokens, epochs
        # Newest telemetry time of the whole input (set by the runtime around a stage engine, which
        # hears only some nodes): a node's silence is news only while others still report.
        self.telemetry_front: int | None = None
        # node -> the cluster its agent says it is in (GpuSample/HostSample `cluster`): an alert
        # about a node names its cluster even with no job there, so ownership per cluster (a
        # provider's nodes) routes it. Bounded: a forged flood of node names stops adding at the cap.
        self.node_cluster: dict[str, str] = {}

    def observe(self, event: Event) -> None:
        """Update jobs and bindings from JobStarted, JobStateChanged and RankBound; the jobs' pace
        from StepCompleted and RankSummary."""
        r = event.record
        kind = event.type
        if kind == "StepCompleted":  # the most frequent record: first, and cheap
            pace = self.pace.get(r["job_id"])
            if pace is None or pace.step is None or r["step"] > pace.step:
                # Only the first report of a newer step moves the pace (one rank's tokens and
                # epoch sample the step); the other ranks' reports of it cost one comparison.
                pace = self._pace(r["job_id"], r.get("run_id") or "")
                pace.step_done(r["step"], r["ts"])
                if r.get("tokens"):
                    pace.tokens_done(r["tokens"])
                if r.get("epoch") is not None:
                    pace.epoch_at(r["epoch"], r["step"])
        elif kind in ("GpuSample", "HostSample"):
            cluster, node = r.get("cluster"), r["node"]
            known = self.node_cluster.get(node)
            if (
                cluster
                and known != cluster
                and (known is not None or len(self.node_cluster) < _MAX_NODE_CLUSTERS)
            ):
                self.node_cluster[node] = str(cluster)
        elif kind == "RankSummary":
            if r.get("last_step") is not None:
                pace = self._pace(r["job_id"], r.get("run_id") or "")
                pace.step_done(r["last_step"], r["last_step_ts"])
                if r.get("tokens") and r.get("steps"):
                    pace.tokens_done(r["tokens"] / r["steps"])
        elif kind == "JobStarted":
            job = self.jobs.get(r["job_id"])
            restart_count = job.restart_count if job else 0
            old = self.pace.get(r["job_id"])
            if old is not None and old.run_id != (r.get("run_id") or ""):
                del self.pace[r["job_id"]]  # a new run: its own pace
            self.jobs[r["job_id"]] = JobInfo.started(r, restart_count)
        elif kind == "JobStateChanged":
            job = self.jobs.setdefault(r["job_id"], JobInfo(job_id=r["job_id"]))
            if job.state != r["state"]:
                job.state, job.state_since = r["state"], r["ts"]
            job.restart_count = max(job.restart_count, r.get("restart_count", 0))
            job.owner = r.get("owner") or job.owner
            job.team = r.get("team") or job.team
            job.cluster = r.get("cluster") or job.cluster
            if r.get("run_id"):
                job.run_id = r["run_id"]
            if r["state"] in _ENDED and r["job_id"] in self.pace:
                self.pace[r["job_id"]].ended()
        elif kind == "RankBound":
            binding = Binding(
                r["job_id"], r["rank"], r["node"], r.get("gpu_uuid"), r.get("gpu_index"), r["pid"], r["ts"]
            )
            self._bind(binding)

    def _pace(self, job_id: str, run_id: str) -> JobPace:
        pace = self.pace.get(job_id)
        if pace is None or (run_id and run_id != pace.run_id and pace.run_id):
            pace = self.pace[job_id] = JobPace(run_id)
        elif run_id and not pace.run_id:
            pace.run_id = run_id
        return pace

    def progress(self, job_id: str) -> Estimate | None:
        """The job's progress towards its target and the ETA at its recent step rate; None for a
        job never seen (`schemas.progress.Estimate`: all None without a target)."""
        job = self.jobs.get(job_id)
        pace = self.pace.get(job_id)
        if job is None and pace is None:
            return None
        if pace is None:
            pace = JobPace()
        ranks = (job.world_size if job else 0) or len(self._by_job.get(job_id, {}))
        return pace.estimate(
            target_steps=job.target_steps if job else None,
            target_tokens=job.target_tokens if job else None,
            target_epochs=job.target_epochs if job else None,
            ranks=ranks,
            ended=job is not None and job.state in _ENDED,
        )

    def _bind(self, binding: Binding) -> None:
        """Record a binding in every index (a rank bound again replaces its old place)."""
        key = (binding.job_id, binding.rank)
        old = self.bindings.get(key)
        if old is not None:
            if old.gpu_uuid is not None:
                self._by_gpu.pop((old.node, old.gpu_uuid), None)
            self._by_node.get(old.node, {}).pop(key, None)
            self._on_node.pop((old.job_id, old.node), None)
        self.bindings[key] = binding
        if binding.gpu_uuid is not None:
            self._by_gpu[(binding.node, binding.gpu_uuid)] = binding
        self._by_job.setdefault(binding.job_id, {})[binding.rank] = binding
        self._by_node.setdefault(binding.node, {})[key] = binding
        self._ranks.pop(binding.job_id, None)
        self._on_node.pop((binding.job_id, binding.node), None)

    def forget_nodes(self, nodes: frozenset[str]) -> None:
        """Drop the clusters remembered for these nodes (evicted: past `engine.max_nodes`)."""
        drop_nodes(self.node_cluster, nodes)

    def forget_job(self, job_id: str) -> None:
        """Drop everything held about a job: its JobInfo, pace and rank bindings (an evicted job)."""
        self.jobs.pop(job_id, None)
        self.pace.pop(job_id, None)
        for rank, binding in self._by_job.pop(job_id, {}).items():
            key = (job_id, rank)
            self.bindings.pop(key, None)
            if binding.gpu_uuid is not None and self._by_gpu.get((binding.node, binding.gpu_uuid)) is binding:
                del self._by_gpu[(binding.node, binding.gpu_uuid)]
            on_node = self._by_node.get(binding.node)
            if on_node is not None:
                on_node.pop(key, None)
                if not on_node:
                    del self._by_node[binding.node]
            self._on_node.pop((job_id, binding.node), None)
        self._ranks.pop(job_id, None)

    def binding_for_gpu(self, node: str, gpu_uuid: str) -> Binding | None:
        """The rank bound to a GPU of a node, if any."""
        return self._by_gpu.get((node, gpu_uuid))

    def ranks_of(self, job_id: str) -> list[Binding]:
        """Bindings of a job, by rank."""
        ranks = self._ranks.get(job_id)
        if ranks is None:
            bound = self._by_job.get(job_id, {})
            ranks = self._ranks[job_id] = [bound[r] for r in sorted(bound)]
        return list(ranks)

    def ranks_on_node(self, job_id: str, node: str) -> list[Binding]:
        """Bindings of a job on one node, by rank (indexed: a 16k-rank job asks this per sample)."""
        ranks = self._on_node.get((job_id, node))
        if ranks is None:
            here = self._by_node.get(node, {})
            ranks = sorted((b for (j, _), b in here.items() if j == job_id), key=lambda b: b.rank)
            self._on_node[(job_id, node)] = ranks
        return list(ranks)

    def jobs_on_node(self, node: str) -> list[str]:
        """Jobs with a rank bound on a node now (a rank bound again elsewhere has left it) that have
        not ended, by id."""
        jobs = {job for job, _ in self._by_node.get(node, {})}
        return sorted(job for job in jobs if not self.ended(job))

    def ended(self, job_id: str) -> bool:
        """Whether the job's last state is an end (completed, failed)."""
        job = self.jobs.get(job_id)
        return job is not None and job.state in _ENDED

    def bindings_on_node(self, node: str) -> list[Binding]:
        """Bindings on a node, ordered by job and rank."""
        return [b for _, b in sorted(self._by_node.get(node, {}).items())]

    def active_jobs(self) -> list[JobInfo]:
        """Jobs currently running, ordered by id."""
        return [j for _, j in sorted(self.jobs.items()) if j.state == "running"]

    def state(self) -> dict[str, Any]:
        """JSON-able state."""
        return {
            "jobs": {k: asdict(v) for k, v in sorted(self.jobs.items())},
            "bindings": [asdict(b) for _, b in sorted(self.bindings.items())],
            "pace": {k: v.state() for k, v in sorted(self.pace.items())},
            "node_cluster": dict(sorted(self.node_cluster.items())),
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Topology:
        """Rebuild from `state()`."""
        topo = cls()
        topo.load_state(state)
        return topo

    def load_state(self, state: dict[str, Any]) -> None:
        """Replace everything with `state()` in place (detectors hold a reference to this object)."""
        self._reset()
        self.jobs = {k: JobInfo(**v) for k, v in state["jobs"].items()}
        for b in state["bindings"]:
            self._bind(Binding(**b))
        # Snapshots written before the pace was kept have none: it refills from the next steps.
        self.pace = {k: JobPace.from_state(v) for k, v in state.get("pace", {}).items()}
        self.node_cluster = {str(k): str(v) for k, v in state.get("node_cluster", {}).items()}


def module_defaults(cls: type, method: str | None = None) -> dict[str, Any] | None:
    """A detector's knobs and their defaults: the DEFAULTS of its module (with `method`: of the module
    of the class in its MRO that defines it). None where that module has none."""
    import sys

    owner = next((c for c in cls.__mro__ if method in vars(c)), cls) if method else cls
    defaults = getattr(sys.modules.get(owner.__module__), "DEFAULTS", None)
    return defaults if isinstance(defaults, dict) else None


def dumps_state(state: Any) -> bytes:
    """Deterministic bytes of a JSON-able state (sorted keys, no whitespace, NaN allowed)."""
    return json.dumps(state, sort_keys=True, separators=(",", ":"), allow_nan=True).encode()


def loads_state(data: bytes) -> Any:
    """Inverse of `dumps_state`."""
    return json.loads(data)


class Detector:
    """Base class: a pure, event-time detector over the shared topology.

    Subclasses set `rules` (the rule names they emit), implement `observe` and `advance`,
    and keep all their state in plain JSON-able values returned by `state()` and accepted by
    `load_state()`; `to_bytes`/`from_bytes` wrap those deterministically.
    """

    rules: ClassVar[tuple[str, ...]] = ()
    # "rank": runs where a job's node's records are (per rank, per node, per GPU); "job": on the
    # job's records and the rank stage's summaries of its ranks (streams/stages/engine.py).
    stage: ClassVar[str] = ""
    # The config section whose knobs it reads ("": its own, named after the class; see
    # `streams.config.config_section`): rules split out of one detector keep its section.
    section: ClassVar[str] = ""
    # The catalogue entry of a class that raises one rule (its `rules` is then that rule's name).
    declared: ClassVar[Rule]
    # The record types `observe` reads (None: every type). The engine hands a detector only these:
    # most records concern a few rules, and a call that returns at once is still a call per record.
    reads: ClassVar[frozenset[str] | None] = None

    def __init_subclass__(
        cls, *, rule: Rule | None = None, stage: str = "", section: str = "", **kwargs: Any
    ) -> None:
        """The class line says what is constant about a rule's detector: the catalogue `Rule` it
        raises (`rule=`, kept as `declared`; its `rules` is then that rule's name), the stage it
        runs in and the config section it reads, e.g.
        `class GradSpikeDetector(PerJobDetector, rule=GRAD_SPIKE, stage="job", section="numerical")`."""
        super().__init_subclass__(**kwargs)
        if rule is not None:
            cls.declared = rule
        if stage:
            cls.stage = stage
        if section:
            cls.section = section
        declared = cls.__dict__.get("declared")
        if declared is not None and "rules" not in cls.__dict__:
            cls.rules = (declared.name,)

    def __init__(self, topology: Topology, params: dict[str, Any] | None = None) -> None:
        self.topology = topology
        self.params = dict(params or {})
        self.configure({**(module_defaults(type(self), "configure") or {}), **self.params})

    def configure(self, p: dict[str, Any]) -> None:
        """Read the knobs (the DEFAULTS of the module that defines this method, under the
        configured values) and set up empty state."""

    def observe(self, event: Event) -> list[Finding]:
        """Take one event (event time `event.record['ts']`); return findings it settles."""
        return []

    def advance(self, watermark: int) -> list[Finding]:
        """Event time has reached `watermark`: close windows, check timeouts."""
        return []

    def state(self) -> dict[str, Any]:
        """JSON-able state of this detector."""
        return {}

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore from `state()`."""

    def to_bytes(self) -> bytes:
        """State as deterministic bytes."""
        return dumps_state(self.state())

    def from_bytes(self, data: bytes) -> None:
        """Restore state from `to_bytes()`."""
        self.load_state(loads_state(data))

    def forget_job(self, job_id: str) -> None:
        """Drop state of a job that ended (bounded memory)."""

    def forget_nodes(self, nodes: frozenset[str]) -> None:
        """Drop what is held per node for these nodes (evicted: past `engine.max_nodes`)."""


class PerJobDetector(Detector):
    """A detector whose whole state is one JSON-able dict per job, created by `new_job_state`."""

    def __init__(self, topology: Topology, params: dict[str, Any] | None = None) -> None:
        self._jobs: dict[str, dict[str, Any]] = {}
        super().__init__(topology, params)

    def new_job_state(self) -> dict[str, Any]:
        """The state of a job seen for the first time."""
        raise NotImplementedError

    def _job(self, job_id: str) -> dict[str, Any]:
        job = self._jobs.get(job_id)
        if job is None:
            job = self._jobs[job_id] = self.new_job_state()
        return job

    def _job_of_run(self, r: dict[str, Any]) -> dict[str, Any]:
        """The state of a record's job, which remembers the run it first heard of (state `run`)."""
        job = self._job(r["job_id"])
        if job["run"] is None:
            job["run"] = r.get("run_id", "")
        return job

    def _another_run(self, r: dict[str, Any]) -> dict[str, Any] | None:
        """The state of a JobStarted's job when it starts another run than the one held (None: the
        same run, or a job not held): its open conditions are over."""
        job = self._jobs.get(r["job_id"])
        if job is None or job["run"] == r.get("run_id", ""):
            return None
        job["run"] = r.get("run_id", "")
        return job

    def state(self) -> dict[str, Any]:
        """JSON-able state: the per-job dicts, by job id."""
        return {"jobs": {k: self._jobs[k] for k in sorted(self._jobs)}}

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore from `state()`."""
        self._jobs = dict(state.get("jobs", {}))

    def forget_job(self, job_id: str) -> None:
        """Drop a finished job's state."""
        self._jobs.pop(job_id, None)


class JobAndHostDetector(Detector):
    """A detector whose state is `jobs` (job id -> dict) plus `hosts` (node -> rows of host samples)."""

    def __init__(self, topology: Topology, params: dict[str, Any] | None = None) -> None:
        self.jobs: dict[str, dict[str, Any]] = {}
        self.hosts: dict[str, list[list[Any]]] = {}
        super().__init__(topology, params)

    def state(self) -> dict[str, Any]:
        """JSON-able state (sorted keys: deterministic bytes)."""
        return {
            "jobs": {k: self.jobs[k] for k in sorted(self.jobs)},
            "hosts": {k: self.hosts[k] for k in sorted(self.hosts)},
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore from `state()`."""
        self.jobs = {k: dict(v) for k, v in state.get("jobs", {}).items()}
        self.hosts = {k: list(v) for k, v in state.get("hosts", {}).items()}

    def forget_job(self, job_id: str) -> None:
        """Drop a finished job (its nodes' host rows age out with the window)."""
        self.jobs.pop(job_id, None)

    def forget_nodes(self, nodes: frozenset[str]) -> None:
        """Drop evicted nodes' host rows."""
        drop_nodes(self.hosts, nodes)
