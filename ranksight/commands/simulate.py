"""`ranksight simulate`: a simulated cluster's telemetry and training events with labelled faults."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from ranksight.console import console, err_console, fail, user_errors
from ranksight.signals import StopRequested, StopSignals, stop_signals

__all__ = ["register"]


def _list() -> None:
    from producers.simulator import FAULTS, builtin_scenarios, load_scenario

    for name in builtin_scenarios():
        sc = load_scenario(name)
        faults = (
            ", ".join(f"{f.type} -> {FAULTS[f.type].alert or 'no alert'}" for f in sc.faults) or "no faults"
        )
        console.print(
            f"[bold]{name}[/]  {sc.duration / 60:g} min, {len(sc.jobs)} job(s): {faults}", highlight=False
        )
        if sc.description:
            console.print(f"    [dim]{sc.description}[/]", highlight=False)


class _Progress:
    """Prints a line every few seconds of wall time while events are generated; never goes backwards.

    With `stop`, each call is also where a SIGINT/SIGTERM ends the generation (`StopRequested`)."""

    def __init__(
        self,
        total_s: float,
        quiet: bool,
        clock: Callable[[], float] = time.monotonic,
        stop: StopSignals | None = None,
    ) -> None:
        self.total_s = total_s
        self.quiet = quiet
        self.clock = clock
        self.stop = stop
        self.last = clock()
        # The engine generates job by job, then node by node: each pass restarts at minute 0.
        self.furthest_s = 0.0

    def __call__(self, events: int, sim_s: float) -> None:
        if self.stop is not None:
            self.stop.check()
        self.furthest_s = max(self.furthest_s, sim_s)
        now = self.clock()
        if self.quiet or now - self.last < 2.0:
            return
        self.last = now
        err_console.print(
            f"  generated {events:,} events, simulated {self.furthest_s / 60:.1f} of {self.total_s / 60:.1f} min",
            highlight=False,
        )


def simulate_command(
    scenario: str | None = typer.Option(
        None, "--scenario", "-s", help="Built-in scenario name (see --list) or a scenario YAML file."
    ),
    seed: int = typer.Option(0, "--seed", help="Random seed: the same seed gives byte-identical output."),
    out: Path | None = typer.Option(
        None, "--out", "-o", help="Write an Avro container file of events (offline, as fast as possible)."
    ),
    labels: Path | None = typer.Option(
        None,
        "--labels",
        help="Where to write the fault labels (JSON Lines); default labels.jsonl next to --out "
        "(with --to-kafka alone: none unless asked).",
    ),
    to_kafka: bool = typer.Option(
        False,
        "--to-kafka",
        help="Publish to Kafka, paced by event time: real time unless --speed (mixed: 25 min at 1x).",
    ),
    speed: float = typer.Option(
        1.0, "--speed", min=0.001, help="Pace for --to-kafka: 1 = real time, 10 = 10x."
    ),
    topic_prefix: str | None = typer.Option(None, "--topic-prefix", help="Prefix of every topic name."),
    duration: str | None = typer.Option(None, "--duration", help="Override the scenario length, e.g. 20m."),
    start: str | None = typer.Option(
        None,
        "--start",
        help="Event time of the scenario start (ISO-8601, UTC), e.g. 2026-01-01T00:00:00Z. "
        "Default: the scenario's own start for --out; now minus the duration for --to-kafka "
        "(live data, inside the store's retention).",
    ),
    list_: bool = typer.Option(False, "--list", help="List the built-in scenarios and exit."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress output."),
    generate: int | None = typer.Option(
        None,
        "--generate",
        min=1,
        help="Write N generated scenario files (random jobs, noise, co-location, faults and their "
        "must-not-alert twins, from --seed) to the folder --out (default: generated/).",
    ),
) -> None:
    """Generate a cluster's GPU/host telemetry and training events, with labelled faults."""
    from producers.simulator import load_scenario, parse_duration, simulate, write_labels
    from schemas.files import parse_ts, write_container

    # SIGINT/SIGTERM end the generation at its next progress point and the publishing before the
    # next event; what was handed to Kafka is flushed (or spooled) within the stop budget.
    with user_errors(), stop_signals(name="simulate") as stop:
        if list_:
            _list()
            return
        if generate is not None:
            _write_generated(generate, seed, out or Path("generated"))
            return
        if scenario is None:
            fail("give a scenario: --scenario NAME|FILE.yaml (see --list)")
        if out is None and not to_kafka:
            fail("say where the events go: --out events.avro, or --to-kafka")
        if to_kafka:
            from ranksight.broker import check_broker, kafka_settings

            # No Kafka known at all, or one refusing our credentials: say so before simulating.
            # An absent broker is fine: the events are spooled.
            check_broker(kafka_settings(), allow_unreachable=True)
        sc = load_scenario(_known_scenario(scenario))
        overrides: dict[str, Any] = {}
        if duration is not None:
            try:
                overrides["duration"] = parse_duration(duration)
            except ValueError as exc:
                fail(f"--duration: {exc}")
            if overrides["duration"] <= 0:
                fail("--duration must be positive")
        if start is not None:
            try:
                overrides["start_ms"] = parse_ts(start)
            except ValueError as exc:
                fail(f"--start: {exc}")
        elif to_kafka:
            # Live data must be recent: a fixed 2026-01-01 start falls outside the store's retention
            # (the TTL drops it on insert) and looks like a months-old backlog to the worker.
            overrides["start_ms"] = live_start_ms(overrides.get("duration", sc.duration))
        sc = sc.with_overrides(**overrides)
        if duration is not None:
            _say_cut_faults(sc)
        # Labels go next to --out, or where --labels says; a Kafka-only run writes none unless asked
        # (it used to leave labels.jsonl in whatever directory the user stood in).
        labels_path = labels or (out.parent / "labels.jsonl" if out is not None else None)
        if out is not None and labels_path is not None and labels_path.resolve() == out.resolve():
            fail("--labels and --out name the same file")
        sim = simulate(sc, seed, progress=_Progress(sc.duration, quiet, stop=stop))
        if not quiet:
            err_console.print(
                f"simulating {sc.name}: {len(sc.jobs)} job(s), {sc.cluster.nodes} node(s), "
                f"{len(sc.faults)} fault(s), {sc.duration / 60:g} min of event time, seed {seed}",
                highlight=False,
            )
        began = time.monotonic()
        try:
            events = list(sim.events())
        except StopRequested:
            console.print(f"stopped by {stop.signal_name} while generating: nothing written or published")
            raise typer.Exit(stop.exit_code) from None
        if out is not None:
            count = write_container(out, events)
            console.print(
                f"wrote {count:,} events to {out} in {time.monotonic() - began:.1f}s", highlight=False
            )
        if labels_path is not None:
            n_labels = write_labels(labels_path, sim.labels)
            console.print(f"wrote {n_labels} label(s) to {labels_path}", highlight=False)
        if to_kafka:
            # Live, the worker cannot tell a finished simulation from stalled jobs: end every job the
            # scenario left running, as a scheduler would (none for --out: a replay ends by itself).
            from producers.simulator import run_ends

            _publish(events + run_ends(events), speed, topic_prefix, quiet, stop)


def _known_scenario(name: str) -> str:
    """`name` unchanged, unless it is neither a file nor a built-in: then one sentence with the closest names."""
    import difflib

    from producers.simulator import builtin_scenarios

    names = builtin_scenarios()
    if Path(name).suffix or Path(name).exists() or name in names:
        return name
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    fail(f"no scenario {name!r}: {hint}(`ranksight simulate --list` shows the built-ins; a file needs .yaml)")


def _say_cut_faults(sc: Any) -> None:
    """After `--duration`: name each fault that no longer happens, or is cut short, in the shorter run."""
    for fault in sc.faults:
        where = f"{fault.type} on job {fault.job}" + (f" rank {fault.rank}" if fault.rank is not None else "")
        if fault.start >= sc.duration:
            err_console.print(
                f"[yellow]warning:[/] --duration {sc.duration / 60:g} min drops fault {where}: it starts at "
                f"{fault.start / 60:g} min, so it is neither simulated nor labelled",
                highlight=False,
                soft_wrap=True,
            )
        elif fault.end is not None and fault.end > sc.duration:
            err_console.print(
                f"[yellow]warning:[/] --duration {sc.duration / 60:g} min cuts fault {where} short: it would "
                f"last until {fault.end / 60:g} min",
                highlight=False,
                soft_wrap=True,
            )


def live_start_ms(duration_s: float, now_ms: int | None = None) -> int:
    """The start of a live simulation: `duration_s` before now, so its last event is about now."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    return now - int(duration_s * 1000)


def _write_generated(n: int, seed: int, folder: Path) -> None:
    """`--generate N`: one scenario YAML file per generated case, loadable by --scenario and evaluate."""
    import yaml

    from producers.simulator.generator import generate_mappings

    if folder.exists() and not folder.is_dir():
        fail(f"--out {folder} is a file; --generate writes scenario files into a folder")
    folder.mkdir(parents=True, exist_ok=True)
    for mapping in generate_mappings(n, seed):
        (folder / f"{mapping['name']}.yaml").write_text(
            f"# {mapping['description']}\n" + yaml.safe_dump(mapping, sort_keys=False), encoding="utf-8"
        )
    console.print(
        f"wrote {n} generated scenario(s) (seed {seed}) to {folder}/; "
        f"score them with `ranksight evaluate --scenarios {folder}`",
        highlight=False,
    )


def _publish(
    events: list[Any], speed: float, topic_prefix: str | None, quiet: bool, stop: StopSignals
) -> None:
    """Publish through the shared publisher, paced by event time; spool to <home>/spool/simulate if Kafka is away.

    Exits non-zero when Kafka took none of the events (all spooled), or when a signal stopped it."""
    from producers.simulator import paced
    from ranksight.broker import kafka_settings
    from ranksight.producing import (
        drain_other_spools,
        finish,
        open_kafka_publisher,
        outcome_exit,
        progress_verb,
    )
    from schemas.codec import codec_from_settings

    settings = kafka_settings()
    assert settings.kafka_bootstrap is not None
    if not events:
        return
    codec = codec_from_settings(settings.schema_registry_url)
    drain_other_spools(settings, exclude=("simulate",), codec=codec)
    span_s = (events[-1].record["ts"] - events[0].record["ts"]) / 1000
    if not quiet:
        err_console.print(
            f"publishing {len(events):,} events to {settings.kafka_bootstrap} at {speed:g}x "
            f"(about {span_s / speed / 60:.1f} min)",
            highlight=False,
        )
    pub = open_kafka_publisher(settings, "simulate", codec=codec, topic_prefix=topic_prefix)
    sent = 0
    last = time.monotonic()
    try:
        for event in paced(events, speed, sleep=stop.sleep):
            stop.check()
            pub.publish(event)
            sent += 1
            now = time.monotonic()
            if not quiet and now - last >= 5.0:
                last = now
                lag = (event.record["ts"] - events[0].record["ts"]) / 1000
                err_console.print(
                    f"  {progress_verb(pub.stats)} {sent:,} events, event time +{lag / 60:.1f} min",
                    highlight=False,
                )
    except StopRequested:
        pass
    finally:
        # During an outage nothing is delivered: do not hold the user for the whole 30 s.
        finish(pub, 30.0, stop)
    outcome_exit(pub, sent, settings.kafka_bootstrap, stop=stop, total=len(events))


def register(app: typer.Typer) -> None:
    """Add the `simulate` command."""
    app.command("simulate")(simulate_command)
