"""Knobs per workload: override any detector knob for the jobs a selector matches (issue 35.1).

```yaml
# in a config file passed with --config, beside `engine` and `detectors`
overrides:
  - name: a100-memory                    # optional; `ranksight rules explain` names it
    match: {gpu_class: "A100*"}          # globs on the job's identity (JobStarted)
    detectors:
      infrastructure: {gpu_mem_ratio: 0.95, throttle_clock_ratio: 0.8}
  - name: rlhf-gradients
    match: {workload_family: "rlhf*", team: llm-finetune}
    detectors:
      numerical: {grad_spike_factor: 20.0}
```

Selectors: `workload_family`, `model_name`, `model_version`, `gpu_class`, `cluster`, `team`,
`job_id` (shell-style globs; every key given must match). **Precedence**: the shipped defaults,
then the config file's `detectors`, then every matching override from the least specific (fewest
selector keys) to the most specific, later entries in the file after earlier ones of the same
specificity; the last one to set a knob decides.

How it runs: a detector class whose section no override touches runs as before (one instance,
the same snapshot). Otherwise `Profiled` holds one instance per distinct set of matching overrides
(a *profile*) and hands each record to the instance of its job's profile: a training record by its
`job_id`, a GPU sample by the job bound to that GPU, a host sample by the jobs on that node. A
job's profile is decided from its JobStarted (the topology sees it before the detectors); records
of a job that come before it, and node records of no job, go to the default instance. Everything
stays in event time: the same records and the same file give the same alerts.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Any

from schemas.records import Event
from streams.detectors.base import Detector, Finding, JobInfo, Topology
from streams.errors import ConfigError

__all__ = ["SELECTORS", "Override", "Profiled", "build_detector", "detector_class", "parse_overrides"]

SELECTORS = ("workload_family", "model_name", "model_version", "gpu_class", "cluster", "team", "job_id")
_KEYS = {"name", "match", "detectors"}


@dataclass(frozen=True)
class Override:
    """Knobs (section -> knob -> value) for the jobs `match` selects."""

    name: str
    match: dict[str, str]
    detectors: dict[str, dict[str, Any]] = field(default_factory=dict)
    index: int = 0  # its place in the file: breaks ties of specificity

    def selects(self, job: JobInfo | None, job_id: str) -> bool:
        """Whether the job's identity matches every selector (a job not seen yet matches only `{}`)."""
        if not self.match:
            return True
        if job is None:
            return False
        for key, pattern in self.match.items():
            value = job_id if key == "job_id" else str(getattr(job, key, "") or "")
            if not fnmatch.fnmatchcase(value, pattern):
                return False
        return True

    @property
    def precedence(self) -> tuple[int, int]:
        """Later in the merge wins: more selectors, then later in the file."""
        return (len(self.match), self.index)


def parse_overrides(raw: Any, source: str, known: dict[str, dict[str, Any] | None]) -> tuple[Override, ...]:
    """Validate `overrides:` against the known sections and their knobs (`known`: section -> defaults)."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ConfigError(f"{source}: `overrides` must be a list of {{match, detectors}} entries")
    out: list[Override] = []
    for i, entry in enumerate(raw):
        where = f"{source}: overrides[{i}]"
        if not isinstance(entry, dict):
            raise ConfigError(f"{where} must be a mapping with `match` and `detectors`")
        unknown = sorted(set(entry) - _KEYS)
        if unknown:
            raise ConfigError(f"{where}: unknown key {unknown[0]!r}; known: match, detectors, name")
        name = str(entry.get("name") or f"overrides[{i}]")
        match = entry.get("match")
        if not isinstance(match, dict) or not match:
            raise ConfigError(f"{where} ({name}): `match` must map some of {', '.join(SELECTORS)} to globs")
        for key, value in match.items():
            if key not in SELECTORS:
                raise ConfigError(
                    f"{where} ({name}): unknown selector match.{key}; known: {', '.join(SELECTORS)}"
                )
            if not isinstance(value, str):
                raise ConfigError(f"{where} ({name}): match.{key} must be a string (a glob)")
        sections = entry.get("detectors")
        if not isinstance(sections, dict) or not sections:
            raise ConfigError(f"{where} ({name}): `detectors` must map sections to the knobs it overrides")
        clean: dict[str, dict[str, Any]] = {}
        for section, knobs in sorted(sections.items()):
            if section not in known:
                raise ConfigError(
                    f"{where} ({name}): unknown detector section {section}; known: {', '.join(sorted(known))}"
                )
            if not isinstance(knobs, dict) or not knobs:
                raise ConfigError(f"{where} ({name}): detectors.{section} must be a mapping of knob -> value")
            defaults = known[section]
            for knob in sorted(knobs):
                if defaults is not None and knob not in defaults:
                    raise ConfigError(
                        f"{where} ({name}): unknown knob {section}.{knob}; known: {', '.join(sorted(defaults))}"
                    )
            clean[section] = dict(knobs)
        out.append(Override(name, {str(k): str(v) for k, v in sorted(match.items())}, clean, i))
    names = [o.name for o in out]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup is not None:
        raise ConfigError(f"{source}: two overrides are named {dup!r}; names must be unique")
    return tuple(out)


def merged_params(
    base: dict[str, Any], section: str, overrides: tuple[Override, ...]
) -> tuple[dict[str, Any], dict[str, str]]:
    """`base` with the overrides' knobs of `section` merged in precedence order; knob -> override that set it."""
    params = dict(base)
    source: dict[str, str] = {}
    for override in sorted(overrides, key=lambda o: o.precedence):
        for knob, value in override.detectors.get(section, {}).items():
            params[knob] = value
            source[knob] = override.name
    return params, source


def detector_class(det: Detector) -> type[Detector]:
    """The rule class a detector runs (a `Profiled` one's class, not the wrapper)."""
    return det.cls if isinstance(det, Profiled) else type(det)


def build_detector(cls: type[Detector], topology: Topology, config: Any) -> Detector:
    """The detector the engine runs for `cls`: plain when no override touches its section."""
    from streams.config import config_section  # late: config imports the detectors

    section = config_section(cls)
    overrides = tuple(o for o in getattr(config, "overrides", ()) if section in o.detectors)
    if not overrides:
        return cls(topology, config.params_for(cls))
    return Profiled(cls, topology, config.params_for(cls), section, overrides)


class Profiled(Detector):
    """One rule class run as one instance per override profile, each record to its job's instance."""

    def __init__(
        self,
        cls: type[Detector],
        topology: Topology,
        params: dict[str, Any],
        section: str,
        overrides: tuple[Override, ...],
    ) -> None:
        super().__init__(topology, params)
        self.cls = cls
        self.rules = cls.rules  # type: ignore[misc]  # the wrapped class's rules
        self._section = section
        self._overrides = overrides
        self._instances: dict[str, Detector] = {"": cls(topology, params)}
        self._profile_of: dict[str, str] = {}  # job id -> profile key (cache, rebuilt on JobStarted)

    # -- dispatch -----------------------------------------------------------------------
    def instance_for(self, job: JobInfo) -> Detector:
        """The instance a job of this identity is judged by (for `rules explain`)."""
        hits = [o for o in self._overrides if o.selects(job, job.job_id)]
        return self._instance("+".join(o.name for o in sorted(hits, key=lambda o: o.index)))

    def _profile(self, job_id: str) -> str:
        key = self._profile_of.get(job_id)
        if key is None:
            job = self.topology.jobs.get(job_id)
            hits = [o for o in self._overrides if o.selects(job, job_id)] if job is not None else []
            key = "+".join(o.name for o in sorted(hits, key=lambda o: o.index))
            if job is not None:
                self._profile_of[job_id] = key
        return key

    def _instance(self, key: str) -> Detector:
        det = self._instances.get(key)
        if det is None:
            names = set(key.split("+"))
            chosen = tuple(o for o in self._overrides if o.name in names)
            params, _ = merged_params(self.params, self._section, chosen)
            det = self._instances[key] = self.cls(self.topology, params)
        return det

    def _jobs_of(self, event: Event) -> list[str]:
        r = event.record
        job_id = r.get("job_id")
        if isinstance(job_id, str) and job_id:
            return [job_id]
        node = r.get("node")
        if event.type == "GpuSample" and node is not None and r.get("gpu_uuid") is not None:
            binding = self.topology.binding_for_gpu(node, r["gpu_uuid"])
            return [binding.job_id] if binding is not None else []
        if node is not None:
            named = [str(j) for j in r.get("job_ids") or () if j]
            bound = sorted({b.job_id for b in self.topology.bindings_on_node(node)})
            return sorted(set(named) | set(bound))
        return []

    def observe(self, event: Event) -> list[Finding]:
        """Hand the record to the instance(s) of its job's profile (the default one for no job)."""
        if event.type == "JobStarted":
            self._profile_of.pop(event.record["job_id"], None)
        keys = sorted({self._profile(j) for j in self._jobs_of(event)}) or [""]
        out: list[Finding] = []
        for key in keys:
            out.extend(self._instance(key).observe(event))
        return out

    def advance(self, watermark: int) -> list[Finding]:
        """Advance every instance (in profile order: deterministic)."""
        out: list[Finding] = []
        for key in sorted(self._instances):
            out.extend(self._instances[key].advance(watermark))
        return out

    def forget_job(self, job_id: str) -> None:
        """Drop a finished job everywhere."""
        self._profile_of.pop(job_id, None)
        for det in self._instances.values():
            det.forget_job(job_id)

    def forget_nodes(self, nodes: frozenset[str]) -> None:
        """Drop evicted nodes everywhere."""
        for det in self._instances.values():
            det.forget_nodes(nodes)

    # -- what some rule classes expose --------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        # drain_derived / drain_learned / adopt: combined over the instances when the class has them.
        if name in ("drain_derived", "drain_learned") and hasattr(self.cls, name):

            def drain() -> list[Any]:
                out: list[Any] = []
                for key in sorted(self._instances):
                    out.extend(getattr(self._instances[key], name)())
                return out

            return drain
        if name == "adopt" and hasattr(self.cls, name):

            def adopt(record: dict[str, Any]) -> None:
                for det in self._instances.values():
                    det.adopt(record)  # type: ignore[attr-defined]

            return adopt
        raise AttributeError(name)

    # -- state --------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """Each profile's state; a snapshot taken with no overrides restores as the default's."""
        return {
            "profiles": {k: self._instances[k].state() for k in sorted(self._instances)},
            "profile_of": dict(sorted(self._profile_of.items())),
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore from `state()` (or from a plain instance's state: the default profile's)."""
        if "profiles" not in state:
            self._instances[""].load_state(state)
            return
        self._profile_of = {str(k): str(v) for k, v in state.get("profile_of", {}).items()}
        for key, sub in state["profiles"].items():
            if key and any(n not in {o.name for o in self._overrides} for n in key.split("+")):
                continue  # an override removed from the file since: its jobs start over on defaults
            self._instance(key).load_state(sub)
        self._profile_of = {j: k for j, k in self._profile_of.items() if k in self._instances}


def explain(
    section: str,
    shipped: dict[str, Any],
    configured: dict[str, Any],
    overrides: tuple[Override, ...],
    job: JobInfo,
    learned: dict[str, tuple[Any, str]] | None = None,
) -> list[tuple[str, Any, str]]:
    """(knob, value, why) of every knob of a section for one job.

    `shipped`: the section's defaults (module DEFAULTS and streams/detectors.yaml); `configured`:
    the section as the loaded configuration has it (a knob that differs was set by the config file);
    `learned`: knob -> (value, why) a rule learned for the job's GPU class, used where neither an
    override nor the config file set the knob.
    """
    hits = tuple(o for o in overrides if section in o.detectors and o.selects(job, job.job_id))
    params, source = merged_params({**shipped, **configured}, section, hits)
    out = []
    for knob in sorted(params):
        if knob in source:
            winner = next(o for o in hits if o.name == source[knob])
            why = f"override {winner.name} (match {winner.match})"
        elif knob in configured and (knob not in shipped or configured[knob] != shipped[knob]):
            why = "the config file's detectors section"
        elif learned and knob in learned:
            params[knob], why = learned[knob]
        else:
            why = "shipped default"
        out.append((knob, params[knob], why))
    return out
