"""`ranksight evaluate --scenarios DIR`: simulate labelled scenarios, replay them, score the detectors."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from ranksight.console import console, err_console, fail, user_errors

if TYPE_CHECKING:
    from streams.offline.evaluate import EvaluationReport, ScenarioResult

__all__ = ["register"]


def _default_scenarios() -> Path:
    import producers

    return Path(producers.__file__).resolve().parent / "scenarios"


def _fmt(value: float | None, pattern: str = "{:.1f}") -> str:
    return "-" if value is None else pattern.format(value)


def _print_report(report: EvaluationReport) -> None:
    from rich.table import Table

    table = Table(title="detection by fault class")
    for col in ("fault", "labels", "detected", "recall", "mean TTD s", "max TTD s", "resolved"):
        table.add_column(col, justify="left" if col == "fault" else "right")
    for fault, row in report.by_fault().items():
        resolved = f"{row['resolved']}/{row['transient']}" if row["transient"] else "-"
        if not row["labels"]:
            table.add_row(fault, "0 (no alert expected)", "-", "-", "-", "-", "-")
            continue
        table.add_row(
            fault,
            str(row["labels"]),
            str(row["detected"]),
            _fmt(row["recall"], "{:.2f}"),
            _fmt(row["mean_ttd_s"]),
            _fmt(row["max_ttd_s"]),
            resolved,
        )
    console.print(table)
    fp = Table(title="alerts per scenario")
    for col in ("scenario", "firing", "matched", "false positives", "precision"):
        fp.add_column(col, justify="left" if col == "scenario" else "right")
    for s in report.scenarios:
        precision = s.matched / s.firing if s.firing else None
        fp.add_row(
            s.name, str(s.firing), str(s.matched), str(len(s.false_positives)), _fmt(precision, "{:.2f}")
        )
    console.print(fp)
    for s in report.scenarios:
        for a in s.false_positives:
            console.print(
                f"  false positive in {s.name}: {a['rule']} job={a['job_id']} rank={a['rank']} node={a['node']}",
                highlight=False,
            )
        for lab in s.labels:
            if lab.alert is not None and not lab.detected:
                why = " (fired, wrong team)" if lab.wrong_team else ""
                console.print(
                    f"  missed in {s.name}: {lab.alert} for {lab.job_id} {lab.identity}{why}", highlight=False
                )
            if lab.resolved is False:
                console.print(
                    f"  not resolved in {s.name}: {lab.alert} for {lab.job_id} {lab.identity}",
                    highlight=False,
                )
    console.print(f"overall recall {report.recall:.2f}, precision {report.precision:.2f}")


def evaluate(
    scenarios: Path | None = typer.Option(
        None, "--scenarios", help="Folder of scenario YAML files (default: the shipped ones)."
    ),
    seed: int = typer.Option(0, "--seed", help="Simulator seed."),
    config: Path | None = typer.Option(None, "--config", help="Detector config overrides (YAML)."),
    routing: Path | None = typer.Option(None, "--routing", help="Routing rules (YAML)."),
    deadline: float = typer.Option(
        120.0,  # streams.offline.evaluate.DEFAULT_DEADLINE_S, not imported: `ranksight --help` stays fast
        "--deadline",
        help="Seconds after a fault's start an alert counts as timely (plus the rule's inherent delay).",
    ),
    only: list[str] | None = typer.Option(
        None, "--only", help="Evaluate only these scenarios (file stems); repeatable."
    ),
    fail_under: float | None = typer.Option(
        None, "--fail-under", help="Exit 1 when the overall recall is below this (0..1)."
    ),
    generated: int | None = typer.Option(
        None,
        "--generated",
        min=1,
        help="Evaluate N generated cases (faults and must-not-alert twins, from --seed) instead of files.",
    ),
    workers: int = typer.Option(1, "--workers", min=1, help="Processes for --generated cases."),
) -> None:
    """Simulate every scenario, replay it offline, and print recall, precision and time to detect."""
    from ranksight.evaluation import scenario_cases
    from streams.alerting.routing import load_router
    from streams.config import load_config
    from streams.offline.evaluate import evaluate_cases, scenario_files

    with user_errors():
        cfg = load_config(config)
        router = load_router(routing)
        if generated is not None:
            _evaluate_generated(generated, seed, cfg, router, deadline, workers, fail_under)
            return
        files = scenario_files(scenarios or _default_scenarios())
        if only:
            files = [f for f in files if f.stem in set(only)]
            if not files:
                fail(f"no scenario named {', '.join(only)} in {scenarios or _default_scenarios()}")

        def progress(result: ScenarioResult) -> None:
            err_console.print(
                f"  {result.name}: {result.events:,} events, {result.firing} firing alert(s)", highlight=False
            )

        report = evaluate_cases(
            scenario_cases(files, seed), cfg, router, deadline_s=deadline, on_scenario=progress
        )
    _print_report(report)
    if fail_under is not None and report.recall < fail_under:
        fail(f"recall {report.recall:.2f} is below --fail-under {fail_under:.2f}")


def _evaluate_generated(
    n: int, seed: int, cfg: Any, router: Any, deadline: float, workers: int, fail_under: float | None
) -> None:
    """`--generated N`: score generated cases; print the summary and only the cases that went wrong."""
    import time

    from ranksight.evaluation import generated_cases
    from streams.offline.evaluate import EvaluationReport, evaluate_cases

    began = time.monotonic()
    done = [0]

    def progress(result: ScenarioResult) -> None:
        done[0] += 1
        if done[0] % 50 == 0 or done[0] == n:
            err_console.print(f"  {done[0]}/{n} generated cases", highlight=False)

    report = evaluate_cases(
        generated_cases(n, seed), cfg, router, deadline_s=deadline, workers=workers, on_scenario=progress
    )
    elapsed = time.monotonic() - began
    bad = EvaluationReport(
        [
            s
            for s in report.scenarios
            if s.false_positives or any(lab.alert and not lab.detected for lab in s.labels)
        ]
    )
    if bad.scenarios:
        _print_report(bad)
    console.print(
        f"{n} generated cases (seed {seed}) in {elapsed:.1f}s, {sum(s.events for s in report.scenarios):,} events: "
        f"recall {report.recall:.2f}, precision {report.precision:.2f}; {len(bad.scenarios)} case(s) went wrong",
        highlight=False,
    )
    if fail_under is not None and report.recall < fail_under:
        fail(f"recall {report.recall:.2f} is below --fail-under {fail_under:.2f}")


def register(app: typer.Typer) -> None:
    """Add the `evaluate` command."""
    app.command("evaluate")(evaluate)
