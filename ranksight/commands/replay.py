"""`ranksight replay FILE.avro... --offline`: run the detectors over recorded events, write the alerts."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import typer

from ranksight.console import console, err_console, fail, literal, user_errors

__all__ = ["register", "write_summary"]


def write_summary(alert_counts: Counter[tuple[str, str]], stats: dict[str, object]) -> None:
    """Print the alerts-by-rule table and the engine counters."""
    from rich.table import Table

    table = Table(title="alerts by rule")
    table.add_column("rule")
    table.add_column("firing", justify="right")
    table.add_column("resolved", justify="right")
    for rule in sorted({r for r, _ in alert_counts}):
        table.add_row(
            literal(rule), str(alert_counts[(rule, "firing")]), str(alert_counts[(rule, "resolved")])
        )
    if not alert_counts:
        table.add_row("(none)", "0", "0")
    console.print(table)
    console.print(
        f"events {stats['events']}, late dropped {stats['late_dropped']}, derived {stats['derived']}, "
        f"alerts firing {stats['alerts_firing']}, resolved {stats['alerts_resolved']}, "
        f"refreshed while firing {stats.get('alerts_refreshed', 0)}"
    )


def replay(
    files: list[Path] | None = typer.Argument(
        None,
        help="Avro container files of events (e.g. from `ranksight simulate --out` or `ranksight record`).",
    ),
    offline: bool = typer.Option(
        False,
        "--offline",
        help="Replay files through the detectors in this process (no Kafka); the default for files.",
    ),
    to_kafka: bool = typer.Option(
        False, "--to-kafka", help="Publish the files to Kafka instead, paced by --speed."
    ),
    speed: float = typer.Option(
        0.0, "--speed", min=0.0, help="With --to-kafka: 1 = real time, 0 = as fast as possible."
    ),
    start: str | None = typer.Option(
        None, "--from", help="No files: re-read Kafka history from this time (now, -30m, ISO-8601 or UTC ms)."
    ),
    end: str = typer.Option("now", "--to", help="With --from: end of the time range (inclusive)."),
    topics: str | None = typer.Option(None, "--topics", help="With --from: comma-separated source topics."),
    alerts_topic: str | None = typer.Option(
        None,
        "--alerts-topic",
        help="With --from: where replay alerts go (default rs.alerts.replay, never rs.alerts).",
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="With --from: print the alerts, publish nothing."),
    alerts_out: Path = typer.Option(
        Path("alerts.jsonl"), "--alerts-out", help="Where to write the alerts, one JSON object per line."
    ),
    derived_out: Path | None = typer.Option(
        None, "--derived-out", help="Also write RankWindowStats/JobWindowStats here (JSON lines)."
    ),
    config: Path | None = typer.Option(
        None, "--config", help="Detector config overrides (YAML, deep-merged over streams/detectors.yaml)."
    ),
    routing: Path | None = typer.Option(
        None, "--routing", help="Routing rules (YAML); default: streams/alerting/routing.yaml."
    ),
    baselines_out: Path | None = typer.Option(
        None, "--baselines-out", help="Write the learned baselines here (JSON)."
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress output."),
) -> None:
    """Replay history through the detectors: files offline, files onto Kafka, or Kafka by time.

    \b
    ranksight replay FILE.avro... --offline --alerts-out alerts.jsonl   detectors in process, no broker
    ranksight replay FILE.avro... --to-kafka [--speed 10]               publish a recording
    ranksight replay --from T1 --to T2 [--topics ...]                   Kafka history -> separate engine -> rs.alerts.replay
    """
    from ranksight.commands import record as kafka_modes
    from schemas.topics import ALERTS_REPLAY

    files = files or []
    if start is not None:
        if files or to_kafka or offline:
            fail("--from replays Kafka history: give no files and no --offline/--to-kafka")
        kafka_modes.replay_kafka(
            start=start,
            end=end,
            topics=topics or kafka_modes.SOURCES,
            alerts_topic=alerts_topic or ALERTS_REPLAY,
            config=config,
            routing=routing,
            dry_run=dry_run,
        )
        return
    if not files:
        fail("nothing to replay: give event files (offline or --to-kafka), or --from/--to for Kafka history")
    if to_kafka:
        if offline:
            fail("choose one of --offline and --to-kafka")
        for path in files:
            kafka_modes.publish(src=path, speed=speed)
        return
    _replay_offline(files, alerts_out, derived_out, config, routing, baselines_out, quiet)


def _replay_offline(
    files: list[Path],
    alerts_out: Path,
    derived_out: Path | None,
    config: Path | None,
    routing: Path | None,
    baselines_out: Path | None,
    quiet: bool,
) -> None:
    """Run the detectors over files in this process and write the alerts they raise."""
    from schemas.files import JsonlFormat, format_ts
    from streams import gc_policy
    from streams.alerting.routing import load_router
    from streams.config import load_config
    from streams.offline.detection import DetectionEngine
    from streams.offline.replay import replay_offline

    fmt = JsonlFormat()
    counts: Counter[tuple[str, str]] = Counter()
    seen: set[tuple[str, str]] = set()
    records = 0
    with user_errors():
        cfg = load_config(config)
        router = load_router(routing)
        gc_policy.for_long_lived_state()  # the engine's state lives as long as the replay
        engine = DetectionEngine(cfg, router)

        def progress(n: int, ts: int) -> None:
            if not quiet:
                err_console.print(f"  {n:,} events replayed, event time {format_ts(ts)}", highlight=False)

        alerts_tmp = alerts_out.with_name(alerts_out.name + ".tmp")
        derived_tmp = derived_out.with_name(derived_out.name + ".tmp") if derived_out else None
        try:
            with alerts_tmp.open("w") as alerts_fh:
                derived_fh = derived_tmp.open("w") if derived_tmp else None
                try:
                    for event in replay_offline(files, cfg, router, on_progress=progress, engine=engine):
                        if event.type == "Alert":
                            # Alerts, not records: routed copies and refreshes of one alert count once.
                            state = (str(event.record["alert_id"]), str(event.record["status"]))
                            if state not in seen:
                                seen.add(state)
                                counts[(event.record["rule"], event.record["status"])] += 1
                            records += 1
                            alerts_fh.write(fmt.to_line(event) + "\n")
                        elif derived_fh is not None:
                            derived_fh.write(fmt.to_line(event) + "\n")
                finally:
                    if derived_fh is not None:
                        derived_fh.close()
            # Renamed only when complete: a failed replay leaves no half-written output.
            alerts_tmp.replace(alerts_out)
            if derived_tmp is not None and derived_out is not None:
                derived_tmp.replace(derived_out)
        finally:
            alerts_tmp.unlink(missing_ok=True)
            if derived_tmp is not None:
                derived_tmp.unlink(missing_ok=True)
        if baselines_out is not None:
            baselines_out.write_text(json.dumps(engine.baselines(), indent=2, sort_keys=True) + "\n")
    write_summary(counts, engine.stats)
    console.print(f"wrote {records} alert records to {alerts_out}")


def register(app: typer.Typer) -> None:
    """Add the `replay` command."""
    app.command("replay")(replay)
