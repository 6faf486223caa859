"""Engine configuration: `streams/detectors.yaml` (every knob, with its default) deep-merged with overrides.

A user file passed with `--config` only needs the knobs it changes; an unknown key is an error
that names it, so a typo never silently leaves a default in place.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from streams.errors import ConfigError, StreamsError, refuse_unknown_keys

__all__ = [
    "DEFAULT_CONFIG_PATH",
    "EngineConfig",
    "config_section",
    "deep_merge",
    "load_config",
    "section_defaults",
    "state_key",
]

DEFAULT_CONFIG_PATH = Path(__file__).resolve().parent / "detectors.yaml"

_ENGINE_KEYS = {
    "allowed_lateness_s",
    "advance_every_s",
    "runbook_base_url",
    "job_end_states",
    "disabled_rules",
    "max_clock_skew_s",
    "clock_jump_sources",
    "max_record_age_s",
    "summary_bucket_s",
    "max_jobs",
    "max_ranks",
    "max_nodes",
    "alert_refresh_s",
    "alert_refresh_min_change",
    "late_cause_grace_s",
    "late_cause_rules",
}


# Knobs renamed when straggler and network_degradation moved from 60 s windows to 5 s summary
# buckets (issue 20.1): an old override file fails with the new name instead of a list of knobs.
_RENAMED = {
    "straggler_windows": "straggler_buckets",
    "cusum_skip_windows": "cusum_skip_buckets",
    "cusum_learn_windows": "cusum_learn_buckets",
    "network_learn_windows": "network_learn_buckets",
    "network_windows": "network_min_buckets",
}


def _own_section(cls: type) -> str:
    """The section named after a class: `ImbalanceDetector` -> `imbalance`."""
    name = cls.__name__
    return (name[: -len("Detector")] if name.endswith("Detector") else name).lower()


def config_section(cls: type) -> str:
    """Config section a detector class reads: its `section` ClassVar, else its name (`ImbalanceDetector` -> `imbalance`).

    Rules split out of one detector keep reading its section (`XidErrorDetector` reads
    `infrastructure`), so the knobs users set before the split keep working.
    """
    section = getattr(cls, "section", None)
    return section if isinstance(section, str) and section else _own_section(cls)


def state_key(cls: type) -> str:
    """Key of a detector class's state in an engine snapshot: unique per class.

    A class with a section of its own keeps the section as its key (a snapshot taken before other
    rules were split off still restores it); a class sharing a section is `section/ClassName`.
    """
    section = config_section(cls)
    return section if section == _own_section(cls) else f"{section}/{cls.__name__}"


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """A copy of `base` with `override` merged in (nested dicts merge, everything else replaces)."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def read_yaml(path: Path, what: str, error: type[StreamsError]) -> Any:
    """Parse a YAML file; a missing or malformed file is `error` naming `what` and the path."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise error(f"{what} file {path} does not exist; pass an existing YAML file") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise error(f"{what} file {path} is not valid YAML: {exc}") from None


def _read_yaml(path: Path) -> dict[str, Any]:
    data = read_yaml(path, "config", ConfigError)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must be a mapping with `engine` and `detectors` sections")
    return data


@dataclass(frozen=True)
class EngineConfig:
    """Validated engine settings plus one parameter mapping per detector section."""

    allowed_lateness_ms: int = 5_000
    advance_every_ms: int = 1_000
    runbook_base_url: str = "docs/runbooks/"
    job_end_states: tuple[str, ...] = ("completed", "failed")
    disabled_rules: tuple[str, ...] = ()
    max_clock_skew_ms: int = 300_000
    clock_jump_sources: int = 3
    max_record_age_ms: int = 0  # 0: off (replays and simulations publish old event times now)
    summary_bucket_ms: int = 5_000  # the rank stage summarises each rank per this much event time
    max_jobs: int = 10_000  # distinct jobs one partition's engine holds; the least recently heard is evicted
    max_ranks: int = (
        131_072  # distinct (job, rank) one partition's engine holds; the job with most is evicted
    )
    # Distinct nodes one partition's engine holds per-node state of (~2.2 KB each: GPU, host, clock,
    # telemetry pace); past it the least recently heard eighth is evicted (node names are claims).
    max_nodes: int = 32_768
    alert_refresh_ms: int = 60_000  # a firing alert is published again at most this often (0: never)...
    alert_refresh_min_change: float = (
        0.1  # ...when its value moved by this share (streams.alerting.lifecycle)
    )
    # A cause (a rank's fault, an XID, an ECC error) reported this long after its job's `failed`
    # state still pages, and resolves this long after that state (nothing else can clear it).
    late_cause_grace_ms: int = 60_000
    late_cause_rules: tuple[str, ...] = ("rank_failed", "xid_error", "ecc_uncorrectable")
    detectors: dict[str, dict[str, Any]] = field(default_factory=dict)
    overrides: tuple[Any, ...] = ()  # streams.overrides.Override: knobs per workload (issue 35.1)

    @classmethod
    def default(cls) -> EngineConfig:
        """The shipped defaults (`streams/detectors.yaml`)."""
        return load_config(None)

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, source: str = "config") -> EngineConfig:
        """Validate a merged mapping (`engine` + `detectors`) into a config."""
        from streams.detectors import ALL_DETECTORS  # late: detectors import nothing from here

        unknown = sorted(set(data) - {"engine", "detectors", "overrides"})
        if unknown:
            raise ConfigError(
                f"{source}: unknown top-level key {unknown[0]!r}; expected `engine`, `detectors` or `overrides`"
            )
        engine = data.get("engine") or {}
        if not isinstance(engine, dict):
            raise ConfigError(f"{source}: `engine` must be a mapping")
        refuse_unknown_keys(engine, _ENGINE_KEYS, source, ConfigError, "engine")
        detectors = data.get("detectors") or {}
        if not isinstance(detectors, dict):
            raise ConfigError(f"{source}: `detectors` must be a mapping of detector name -> knobs")
        known_sections = {config_section(c) for c in ALL_DETECTORS}
        params: dict[str, dict[str, Any]] = {}
        for section, knobs in sorted(detectors.items()):
            if section not in known_sections:
                raise ConfigError(
                    f"{source}: unknown detector section detectors.{section}; "
                    f"known: {', '.join(sorted(known_sections))}"
                )
            if knobs is None:
                knobs = {}
            if not isinstance(knobs, dict):
                raise ConfigError(f"{source}: detectors.{section} must be a mapping of knob -> value")
            defaults = section_defaults(section)
            if defaults is not None:
                for knob in sorted(knobs):
                    if knob not in defaults:
                        renamed = _RENAMED.get(knob)
                        raise ConfigError(
                            f"{source}: unknown knob detectors.{section}.{knob}; "
                            + (
                                f"it is {renamed} now (counted in 5 s summary buckets, not 60 s windows:"
                                " choose its value again)"
                                if renamed
                                else f"known: {', '.join(sorted(defaults))}"
                            )
                        )
            params[section] = dict(knobs)
        for detector in ALL_DETECTORS:
            check = getattr(detector, "check_params", None)
            if check is not None:
                check(params.get(config_section(detector), {}), source)
        overrides = _overrides(data.get("overrides"), source, known_sections, params)
        try:
            lateness = float(engine.get("allowed_lateness_s", 5))
            every = float(engine.get("advance_every_s", 1))
            skew = float(engine.get("max_clock_skew_s", 300))
            jump_sources = int(engine.get("clock_jump_sources", 3))
            max_age = float(engine.get("max_record_age_s", 0))
            bucket = float(engine.get("summary_bucket_s", 5))
            max_jobs = int(engine.get("max_jobs", 10_000))
            max_ranks = int(engine.get("max_ranks", 131_072))
            max_nodes = int(engine.get("max_nodes", 32_768))
            refresh = float(engine.get("alert_refresh_s", 60))
            refresh_change = float(engine.get("alert_refresh_min_change", 0.1))
            late_grace = float(engine.get("late_cause_grace_s", 60))
        except (TypeError, ValueError):
            raise ConfigError(
                f"{source}: engine.allowed_lateness_s, engine.advance_every_s, engine.max_clock_skew_s, "
                "engine.clock_jump_sources, engine.max_record_age_s, engine.alert_refresh_s and "
                "engine.alert_refresh_min_change must be numbers"
            ) from None
        if not (0 <= refresh < math.inf and 0 <= refresh_change < math.inf):
            raise ConfigError(
                f"{source}: engine.alert_refresh_s must be a finite number >= 0 (0: firing alerts are "
                "published only when they fire and resolve) and engine.alert_refresh_min_change one >= 0"
            )
        if not (lateness >= 0 and every > 0 and skew > 0 and max_age >= 0) or math.isinf(skew + max_age):
            raise ConfigError(
                f"{source}: engine.allowed_lateness_s must be >= 0, engine.advance_every_s > 0, "
                "engine.max_clock_skew_s a finite number > 0 and engine.max_record_age_s one >= 0 (0: off)"
            )
        if jump_sources < 1:
            raise ConfigError(f"{source}: engine.clock_jump_sources must be >= 1")
        if not 0 <= late_grace < math.inf:
            raise ConfigError(f"{source}: engine.late_cause_grace_s must be a finite number >= 0 (0: off)")
        if max_jobs < 1 or max_ranks < 1 or max_nodes < 8:
            raise ConfigError(
                f"{source}: engine.max_jobs and engine.max_ranks must be >= 1, engine.max_nodes >= 8"
            )
        if not bucket > 0 or math.isinf(bucket):
            raise ConfigError(f"{source}: engine.summary_bucket_s must be a finite number > 0")
        base_url = str(engine.get("runbook_base_url", "docs/runbooks/"))
        if not base_url.endswith("/"):
            base_url += "/"
        return cls(
            allowed_lateness_ms=int(lateness * 1000),
            advance_every_ms=max(1, int(every * 1000)),
            runbook_base_url=base_url,
            job_end_states=tuple(engine.get("job_end_states", ("completed", "failed"))),
            disabled_rules=tuple(sorted(engine.get("disabled_rules") or ())),
            max_clock_skew_ms=int(skew * 1000),
            clock_jump_sources=jump_sources,
            max_record_age_ms=int(max_age * 1000),
            summary_bucket_ms=max(1, int(bucket * 1000)),
            max_jobs=max_jobs,
            max_ranks=max_ranks,
            max_nodes=max_nodes,
            alert_refresh_ms=int(refresh * 1000),
            alert_refresh_min_change=refresh_change,
            late_cause_grace_ms=int(late_grace * 1000),
            late_cause_rules=tuple(
                str(r)
                for r in engine.get("late_cause_rules", ("rank_failed", "xid_error", "ecc_uncorrectable"))
            ),
            detectors=params,
            overrides=overrides,
        )

    def params_for(self, cls: type) -> dict[str, Any]:
        """Parameters for one detector class (its section; the module DEFAULTS fill the rest)."""
        return dict(self.detectors.get(config_section(cls), {}))


def _overrides(
    raw: Any, source: str, sections: set[str], params: dict[str, dict[str, Any]]
) -> tuple[Any, ...]:
    """Validate `overrides:` and try each profile's knobs on the classes they reach (a bad value
    fails at load, naming the override, not when the first job of that workload comes)."""
    from streams.detectors import ALL_DETECTORS
    from streams.detectors.base import Topology
    from streams.overrides import merged_params, parse_overrides

    overrides = parse_overrides(raw, source, {s: section_defaults(s) for s in sorted(sections)})
    for override in overrides:
        for detector in ALL_DETECTORS:
            section = config_section(detector)
            if section not in override.detectors:
                continue
            merged, _ = merged_params(params.get(section, {}), section, (override,))
            check = getattr(detector, "check_params", None)
            try:
                if check is not None:
                    check(merged, source)
                detector(Topology(), merged)
            except ConfigError:
                raise
            except (TypeError, ValueError) as exc:
                raise ConfigError(
                    f"{source}: override {override.name}: a knob of detectors.{section} has a bad value ({exc})"
                ) from None
    return overrides


def section_defaults(section: str) -> dict[str, Any] | None:
    """Every knob of a config section with its default: the DEFAULTS of each rule module reading it.

    None when a class of the section has no DEFAULTS (its knobs are not known, so not checked).
    """
    from streams.detectors import ALL_DETECTORS  # late: detectors import nothing from here
    from streams.detectors.base import module_defaults

    out: dict[str, Any] = {}
    for cls in ALL_DETECTORS:
        if config_section(cls) != section:
            continue
        defaults = module_defaults(cls)
        if defaults is None:
            return None
        out.update(defaults)
    return out


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> EngineConfig:
    """Shipped defaults, deep-merged with the YAML file at `path` and then `overrides`."""
    merged = _read_yaml(DEFAULT_CONFIG_PATH)
    source = str(DEFAULT_CONFIG_PATH)
    if path is not None:
        merged = deep_merge(merged, _read_yaml(Path(path)))
        source = str(path)
    if overrides:
        merged = deep_merge(merged, overrides)
    _inline_acceptance_files(merged, Path(path).resolve().parent if path is not None else Path.cwd(), source)
    return EngineConfig.from_dict(merged, source=source)


def _inline_acceptance_files(merged: dict[str, Any], base: Path, source: str) -> None:
    """Read `detectors.acceptance.files` (relative to the config file) into its `rules` list.

    A team keeps its acceptance rules in a file of its own; each file is a mapping with a `rules:`
    list. The file's rules come after the inline ones; the loader refuses duplicate names.
    """
    section = (merged.get("detectors") or {}).get("acceptance")
    if not isinstance(section, dict) or not section.get("files"):
        return
    files = section["files"]
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        raise ConfigError(f"{source}: detectors.acceptance.files must be a list of file paths")
    rules = list(section.get("rules") or [])
    for name in files:
        path = Path(name) if Path(name).is_absolute() else base / name
        data = read_yaml(path, "acceptance rules", ConfigError)
        if not isinstance(data, dict) or not isinstance(data.get("rules"), list) or set(data) - {"rules"}:
            raise ConfigError(
                f"acceptance rules file {path} must be a mapping with one key, `rules:` (a list)"
            )
        rules += data["rules"]
    section["rules"] = rules
    section["files"] = []
