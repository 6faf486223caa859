"""`ranksight rules explain RULE`: which value of each knob a rule uses for a job, and why."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from ranksight.console import console, fail, user_errors

if TYPE_CHECKING:
    from streams.detectors.base import JobInfo

__all__ = ["register"]

rules_app = typer.Typer(help="The detection rules and the knobs they use.")


@rules_app.command("explain")
def explain_rule(
    rule: str = typer.Argument(..., help="Rule name, e.g. gpu_memory_pressure."),
    job: str = typer.Option("job", "--job", help="The job's id (matched by `job_id` selectors)."),
    sets: list[str] = typer.Option(
        [],
        "--set",
        help="The job's identity, KEY=VALUE (workload_family, model_name, model_version, gpu_class, "
        "cluster, team); repeat it.",
    ),
    config: Path | None = typer.Option(
        None, "--config", help="Config file with `detectors` and `overrides`."
    ),
    learn_from: list[Path] = typer.Option(
        [],
        "--learn-from",
        help="Recording(s) to replay first: the values rules learn per GPU class from its healthy "
        "runs (memory headroom, throttle clocks) are shown where nothing set the knob.",
    ),
) -> None:
    """Print every knob of RULE's section with the value a job of that identity gets and where it comes from."""
    from rich.table import Table
    from rich.text import Text

    from streams.config import config_section, load_config, section_defaults
    from streams.detectors import ALL_DETECTORS
    from streams.overrides import SELECTORS, explain

    classes = [c for c in ALL_DETECTORS if rule in c.rules]
    if not classes:
        known = sorted({r for c in ALL_DETECTORS for r in c.rules})
        fail(f"unknown rule {rule!r}; known: {', '.join(known)}")
    identity: dict[str, str] = {}
    for item in sets:
        key, sep, value = item.partition("=")
        if not sep or key not in SELECTORS or key == "job_id":
            fail(
                f"--set {item!r}: expected KEY=VALUE with KEY one of {', '.join(s for s in SELECTORS if s != 'job_id')}"
            )
        identity[key] = value
    with user_errors():
        cfg = load_config(config)
    section = config_section(classes[0])
    shipped = {**(section_defaults(section) or {}), **load_config(None).detectors.get(section, {})}
    info = _job_info(job, identity)
    learned = _learned(learn_from, classes[0], cfg, info) if learn_from else None
    rows = explain(section, shipped, cfg.detectors.get(section, {}), cfg.overrides, info, learned)
    table = Table(title=Text(f"{rule}: knobs of detectors.{section} for job {job}"), title_justify="left")
    for name in ("knob", "value", "from"):
        table.add_column(name, overflow="fold")
    for knob, value, why in rows:
        table.add_row(
            Text(knob), Text(repr(value)), Text(why)
        )  # literal text: a glob like [ab]* is no markup
    console.print(table)


def _learned(paths: list[Path], cls: type, cfg: Any, job: JobInfo) -> dict[str, tuple[Any, str]]:
    """Replay the recordings offline and ask the rule what the job's GPU class taught it (every
    partition's runs together)."""
    from streams.detectors.base import Topology
    from streams.offline.detection import DetectionEngine
    from streams.offline.replay import merged_events
    from streams.overrides import Profiled, detector_class

    if not hasattr(cls, "learned_knobs"):
        return {}
    for path in paths:
        if not path.is_file():
            fail(
                f"--learn-from {path}: no such recording; pass a file `ranksight record` or `simulate` wrote"
            )
    with user_errors():
        engine = DetectionEngine(cfg)
        engine.run(merged_events(paths))
    found = [
        d.instance_for(job) if isinstance(d, Profiled) else d
        for d in engine.detectors
        if detector_class(d) is cls
    ]
    if not found:
        return {}
    merged = cls(Topology(), found[0].params)
    for det in found:  # each rank-stage partition learned from the GPUs it read
        for gpu_class, runs in det.normals.classes.items():  # type: ignore[attr-defined]
            for run in runs:
                merged.normals.classes.setdefault(gpu_class, []).append(list(run))
    for gpu_class, runs in merged.normals.classes.items():
        unique = {run[1]: run for run in sorted(runs)}
        merged.normals.classes[gpu_class] = sorted(unique.values())[-merged.normals.max_runs :]
    return dict(merged.learned_knobs(job.gpu_class))


def _job_info(job_id: str, identity: dict[str, str]) -> JobInfo:
    """A JobInfo with the identity fields given (the rest left empty)."""
    from streams.detectors.base import JobInfo

    info = JobInfo(job_id)
    for key, value in identity.items():
        setattr(info, key, value)
    return info


def register(app: typer.Typer) -> None:
    """Add the `rules` group."""
    app.add_typer(rules_app, name="rules")
