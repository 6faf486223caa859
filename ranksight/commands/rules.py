"""`ranksight rules explain RULE`: which value of each knob a rule uses for a job, and why."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

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
    rows = explain(section, shipped, cfg.detectors.get(section, {}), cfg.overrides, _job_info(job, identity))
    table = Table(title=Text(f"{rule}: knobs of detectors.{section} for job {job}"), title_justify="left")
    for name in ("knob", "value", "from"):
        table.add_column(name, overflow="fold")
    for knob, value, why in rows:
        table.add_row(
            Text(knob), Text(repr(value)), Text(why)
        )  # literal text: a glob like [ab]* is no markup
    console.print(table)


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
