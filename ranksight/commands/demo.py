"""`ranksight demo`: simulate a cluster, detect, store and show alerts live, then summarise."""

from __future__ import annotations

import typer

from ranksight.console import console, user_errors

__all__ = ["register"]


def demo(
    scenario: str = typer.Option(
        "mixed", "--scenario", help="Built-in scenario name or YAML file to simulate."
    ),
    speed: float = typer.Option(
        20.0, "--speed", min=0.1, help="Event time runs this many times faster than real time."
    ),
    seed: int = typer.Option(0, "--seed", help="Simulator seed (same seed, same events)."),
    timeout: float = typer.Option(
        240.0, "--timeout", help="Give up waiting for the pipeline to catch up after this many seconds."
    ),
    ui_port: int = typer.Option(8088, "--ui-port", min=0, max=65535, help="Port of the UI on 127.0.0.1."),
    no_ui: bool = typer.Option(False, "--no-ui", help="Do not serve the UI."),
) -> None:
    """Run the whole pipeline once (local Kafka unless KAFKA_BOOTSTRAP is set; chDB under <home>/demo) and exit."""
    from rich.console import Console

    from ranksight.demo import DemoOptions, run_demo
    from ranksight.settings import load_settings

    # Piped output (CI logs, `make demo | tee`) would otherwise be cut to 80 columns.
    out = console if console.is_terminal else Console(width=140)
    with user_errors():
        run_demo(
            load_settings(),
            DemoOptions(
                scenario=scenario,
                seed=seed,
                speed=speed,
                timeout_s=timeout,
                ui_port=None if no_ui else ui_port,
            ),
            out,
        )


def register(app: typer.Typer) -> None:
    """Add the `demo` command."""
    app.command("demo")(demo)
