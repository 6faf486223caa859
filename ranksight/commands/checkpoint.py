"""`ranksight checkpoint restore-test`: report that a checkpoint was restored and resumed (or not)."""

from __future__ import annotations

import sys
from pathlib import Path

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
    config_hash: str | None = typer.Option(
        None, "--config-hash", help="Hash of the training configuration the checkpoint was restored with."
    ),
    checkpoint_format: str | None = typer.Option(
        None, "--checkpoint-format", help="Format of the restored checkpoint, e.g. 'torch-dcp-2'."
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
            config_hash=config_hash,
            checkpoint_format=checkpoint_format,
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


@checkpoint_app.command("restore-job")
def restore_job(
    job: str = typer.Option(..., "--job", help="The training job whose checkpoint is to be restore-tested."),
    checkpoint: str = typer.Option(..., "--checkpoint", help="checkpoint_id to restore."),
    command: str = typer.Option(
        ..., "--command", help="Your restore-and-resume command; its exit status is the verdict."
    ),
    slurm: bool = typer.Option(False, "--slurm", help="Render a Slurm batch script (sbatch it)."),
    kubernetes: bool = typer.Option(
        False, "--kubernetes", help="Render a Kubernetes Job (kubectl apply -f)."
    ),
    image: str = typer.Option("", "--image", help="With --kubernetes: the training image."),
    namespace: str = typer.Option("default", "--namespace", help="With --kubernetes: the Job's namespace."),
    partition: str = typer.Option("", "--partition", help="With --slurm: the partition."),
    gpus: int = typer.Option(1, "--gpus", min=0, help="GPUs the restore test needs."),
    restored: str = typer.Option(
        "model,optimizer,scheduler,data", "--restored", help="What the command restores (reported as such)."
    ),
    steps_resumed: int = typer.Option(
        10, "--steps-resumed", min=0, help="Steps the command trains after it."
    ),
    code_version: str = typer.Option("", "--code-version", help="Code version the test runs."),
    runtime_version: str = typer.Option("", "--runtime-version", help="Runtime the test runs."),
    config_hash: str = typer.Option("", "--config-hash", help="Configuration hash the test runs."),
    checkpoint_format: str = typer.Option("", "--checkpoint-format", help="Format of the checkpoint."),
    to: str = typer.Option(
        "kafka",
        "--to",
        help="Where the rendered job reports: 'kafka' (KAFKA_BOOTSTRAP) or file:///path.avro.",
    ),
    output: Path | None = typer.Option(None, "-o", "--output", help="Write here instead of standard output."),
) -> None:
    """Render a restore test as a scheduler job that reports its verdict as a RestoreTest (docs/acceptance.md)."""
    from producers.training.restore_schedule import RestoreJob, kubernetes_job, slurm_script

    if slurm == kubernetes:
        fail("give exactly one of --slurm or --kubernetes")
    with user_errors():
        spec = RestoreJob(
            job_id=job,
            checkpoint_id=checkpoint,
            command=command,
            restored=restored,
            steps_resumed=steps_resumed,
            code_version=code_version,
            runtime_version=runtime_version,
            config_hash=config_hash,
            checkpoint_format=checkpoint_format,
            to=to,
        )
        text = (
            slurm_script(spec, partition=partition, gpus=gpus)
            if slurm
            else kubernetes_job(spec, image=image, namespace=namespace, gpus=gpus)
        )
    if output is None:
        sys.stdout.write(text)
    else:
        output.write_text(text)
        print(f"wrote {output}", file=sys.stderr)


def register(app: typer.Typer) -> None:
    """Add the `checkpoint` group."""
    app.add_typer(checkpoint_app, name="checkpoint")
