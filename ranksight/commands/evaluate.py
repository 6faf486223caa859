"""`ranksight evaluate --scenarios DIR`: simulate labelled scenarios, replay them, score the detectors."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from ranksight.console import console, err_console, fail, literal, user_errors
from ranksight.signals import StopRequested, stop_signals

if TYPE_CHECKING:
    from streams.offline.evaluate import EvaluationReport, ScenarioResult

__all__ = ["register"]


def _default_scenarios() -> Path:
    import producers

    return Path(producers.__file__).resolve().parent / "scenarios"


def _fmt(value: float | None, pattern: str = "{:.1f}") -> str:
    return "-" if value is None else pattern.format(value)


def _print_rules(report: EvaluationReport) -> None:
    """Per alert rule: recall, time to detect (median, p90, max) and precision of its pages."""
    from rich.table import Table

    table = Table(title="per rule (each alert counted once; muted alerts are not pages)")
    cols = (
        "rule",
        "labels",
        "detected",
        "recall",
        "TTD median s",
        "TTD p90 s",
        "TTD max s",
        "paged",
        "matched",
    )
    for col in (*cols, "precision"):
        table.add_column(col, justify="left" if col == "rule" else "right")
    rows = report.by_rule()
    for rule, row in rows.items():
        table.add_row(
            literal(rule),
            str(row["labels"]),
            str(row["detected"]),
            _fmt(row["recall"], "{:.2f}"),
            _fmt(row["median_ttd_s"]),
            _fmt(row["p90_ttd_s"]),
            _fmt(row["max_ttd_s"]),
            str(row["paged"]),
            str(row["matched"]),
            _fmt(row["precision"], "{:.2f}"),
        )
    console.print(table)
    ramped = [
        f"{rule} {row['ramped']} (p90 {row['ramped_p90_from_full_s']:+.1f} s)"
        for rule, row in rows.items()
        if row["ramped"] and row["ramped_p90_from_full_s"] is not None
    ]
    if ramped:
        console.print(
            "faults that ramp up count their TTD from the ramp's start; from full strength "
            "(negative: paged while still growing): " + ", ".join(ramped),
            highlight=False,
        )


def _print_report(report: EvaluationReport, *, summary: bool = True) -> None:
    """Per fault class, per scenario, what was missed; with `summary` the per-rule table and totals."""
    from rich.table import Table

    table = Table(title="detection by fault class")
    cols = ("fault", "labels", "detected", "recall", "median TTD s", "p90 TTD s", "max TTD s", "resolved")
    for col in cols:
        table.add_column(col, justify="left" if col == "fault" else "right")
    for fault, row in report.by_fault().items():
        resolved = f"{row['resolved']}/{row['transient']}" if row["transient"] else "-"
        if not row["labels"]:
            table.add_row(fault, "0 (no alert expected)", "-", "-", "-", "-", "-", "-")
            continue
        table.add_row(
            fault,
            str(row["labels"]),
            str(row["detected"]),
            _fmt(row["recall"], "{:.2f}"),
            _fmt(row["median_ttd_s"]),
            _fmt(row["p90_ttd_s"]),
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
                if lab.late_s is not None:
                    why += f" (fired late, {lab.late_s:.0f} s after the fault began)"
                console.print(
                    f"  missed in {s.name}: {lab.alert} for {lab.job_id} {lab.identity}{why}", highlight=False
                )
            if lab.resolved is False:
                console.print(
                    f"  not resolved in {s.name}: {lab.alert} for {lab.job_id} {lab.identity}",
                    highlight=False,
                )
    if summary:
        _print_rules(report)
        _print_totals(report)


def _print_totals(report: EvaluationReport) -> None:
    muted = sum(s.inhibited for s in report.scenarios)
    late = sum(s.muted_late for s in report.scenarios)
    console.print(
        f"overall recall {report.recall:.3f}, precision {report.precision:.3f} "
        f"({sum(s.firing for s in report.scenarios)} paged alerts, {muted} muted by their cause, "
        f"{late} muted only after they paged)",
        highlight=False,
    )


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
    mute_grace: float = typer.Option(
        30.0,  # streams.offline.evaluate.DEFAULT_MUTE_GRACE_S
        "--mute-grace",
        help="Seconds after an alert fired within which a cause's mute still stops its page (Alertmanager's group_wait).",
    ),
) -> None:
    """Simulate every scenario, replay it offline, and print recall, precision and time to detect."""
    # SIGINT/SIGTERM stop the run where it is (its worker processes too), whatever disposition
    # it inherited (`cmd &`, nohup): nothing is printed but that it stopped, and it exits non-zero.
    with user_errors(), stop_signals(name="evaluate", interrupt=True) as stop:
        try:
            _evaluate(
                config, routing, scenarios, seed, deadline, only, fail_under, generated, workers, mute_grace
            )
        except StopRequested:
            err_console.print(f"evaluate: stopped by {stop.signal_name}, nothing scored", highlight=False)
            raise typer.Exit(stop.exit_code) from None


def _evaluate(
    config: Path | None,
    routing: Path | None,
    scenarios: Path | None,
    seed: int,
    deadline: float,
    only: list[str] | None,
    fail_under: float | None,
    generated: int | None,
    workers: int,
    mute_grace: float,
) -> None:
    """The command's work (the options as given)."""
    from ranksight.evaluation import scenario_cases
    from streams.alerting.routing import load_router
    from streams.config import load_config
    from streams.offline.evaluate import evaluate_cases, scenario_files

    cfg = load_config(config)
    router = load_router(routing)
    if generated is not None:
        _evaluate_generated(generated, seed, cfg, router, deadline, workers, fail_under, mute_grace)
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
        scenario_cases(files, seed),
        cfg,
        router,
        deadline_s=deadline,
        on_scenario=progress,
        mute_grace_s=mute_grace,
    )
    _print_report(report)
    if fail_under is not None and report.recall < fail_under:
        fail(f"recall {report.recall:.2f} is below --fail-under {fail_under:.2f}")


def _evaluate_generated(
    n: int,
    seed: int,
    cfg: Any,
    router: Any,
    deadline: float,
    workers: int,
    fail_under: float | None,
    mute_grace: float,
) -> None:
    """`--generated N`: score generated cases; print the summary and only the cases that went wrong."""
    import time

    from ranksight.evaluation import generated_cases
    from streams.offline.evaluate import EvaluationReport, evaluate_cases

    began = time.monotonic()
    done = [0]
    err_console.print(
        f"evaluating {n:,} generated cases (seed {seed}) in {workers} process(es)", highlight=False
    )

    def progress(result: ScenarioResult) -> None:
        done[0] += 1
        if done[0] % 50 == 0 or done[0] == n:
            err_console.print(f"  {done[0]}/{n} generated cases", highlight=False)

    report = evaluate_cases(
        generated_cases(n, seed),
        cfg,
        router,
        deadline_s=deadline,
        workers=workers,
        on_scenario=progress,
        mute_grace_s=mute_grace,
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
        _print_report(bad, summary=False)
    _print_rules(report)
    console.print(
        f"{n} generated cases (seed {seed}) in {elapsed:.1f}s, {sum(s.events for s in report.scenarios):,} events: "
        f"recall {report.recall:.3f}, precision {report.precision:.3f}; {len(bad.scenarios)} case(s) went wrong",
        highlight=False,
    )
    _print_totals(report)
    if fail_under is not None and report.recall < fail_under:
        fail(f"recall {report.recall:.2f} is below --fail-under {fail_under:.2f}")


def register(app: typer.Typer) -> None:
    """Add the `evaluate` command."""
    app.command("evaluate")(evaluate)
