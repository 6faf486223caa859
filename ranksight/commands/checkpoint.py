"""`ranksight checkpoint restore-test`: report that a checkpoint was restored and resumed (or not)."""

from __future__ import annotations

import typer

from ranksight.console import console, fail, literal, user_errors

__all__ = ["register"]

checkpoint_app = typer.Typer(help="Checkpoint recovery readiness.")


@checkpoint_app.command("restore-test")
def restore_test(
    job: str = typer.Option(..., "--job", help="The training job whose checkpoint was restored."),
    checkpoint: str = typer.Option(..., "--checkpoint", help="checkpoint_id of the restored checkpoint."),
    restored: str = typer.Option(
        "", "--restored", help="What was restored, comma-separated: model,optimizer,scheduler,data."
    ),
    steps_resumed: int = typer.Option(
        0, "--steps-resumed", min=0, help="Training steps run after the restore."
    ),
    run: str = typer.Option("", "--run", help="Run of the job that wrote the checkpoint."),
    step: int | None = typer.Option(None, "--step", help="Step the checkpoint captures."),
    loss_before: float | None = typer.Option(
        None, "--loss-before", help="Loss the original run had at that step."
    ),
    loss_after: float | None = typer.Option(None, "--loss-after", help="Loss of the first resumed step."),
    tolerance: float = typer.Option(0.05, "--tolerance", min=0, help="Relative loss jump still continuous."),
    code_version: str | None = typer.Option(
        None, "--code-version", help="e.g. the git commit that restored it."
    ),
    runtime_version: str | None = typer.Option(
        None, "--runtime-version", help="e.g. 'torch 2.4.0 cuda 12.4'."
    ),
    passed: bool | None = typer.Option(
        None, "--passed/--failed", help="The verdict; without it ranksight judges from the values above."
    ),
    error: str | None = typer.Option(None, "--error", help="Why it failed."),
    duration: float | None = typer.Option(None, "--duration", min=0, help="Seconds the test took."),
    to: str = typer.Option("kafka", "--to", help="'kafka' (KAFKA_BOOTSTRAP) or file:///path/events.avro."),
) -> None:
    """Publish a RestoreTest (a failed one alerts the owning team); exits 0 once it is delivered."""
    from producers.training.restore_test import publish_restore_test, restore_test_event
    from ranksight.settings import load_settings

    settings = load_settings()
    parts = [p.strip() for p in restored.split(",") if p.strip()]
    with user_errors():
        event = restore_test_event(
            job,
            checkpoint,
            restored=parts,
            steps_resumed=steps_resumed,
            run_id=run,
            step=step,
            loss_before=loss_before,
            loss_after=loss_after,
            loss_tolerance=tolerance,
            code_version=code_version,
            runtime_version=runtime_version,
            passed=passed,
            error=error,
            duration_s=duration,
        )
        kafka_conf = None
        spool_dir = None
        if to == "kafka":
            if not settings.kafka_bootstrap:
                fail(
                    "no Kafka bootstrap: set KAFKA_BOOTSTRAP, run `ranksight kafka up`, or use --to file:///path.avro"
                )
            kafka_conf = settings.kafka_config()
            spool_dir = settings.home / "spool" / "restore-test"
        publish_restore_test(
            event, to, kafka_conf=kafka_conf, topic_prefix=settings.topic_prefix, spool_dir=spool_dir
        )
    r = event.record
    verdict = "[green]passed[/]" if r["passed"] else f"[bold red]failed[/]: {literal(r['error'])}"
    console.print(f"restore test of checkpoint {checkpoint} (job {literal(job)}) {verdict}", highlight=False)


def register(app: typer.Typer) -> None:
    """Add the `checkpoint` group."""
    app.add_typer(checkpoint_app, name="checkpoint")
