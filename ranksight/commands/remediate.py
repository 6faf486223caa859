"""`ranksight remediate`: follow rs.alerts and ask the scheduler to act, behind the policy's safeguards."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from ranksight.console import console, err_console, fail, literal, user_errors
from ranksight.signals import stop_signals
from schemas.topics import ACTIONS, ALERTS, TRAINING_EVENTS

__all__ = ["decision_line", "register"]

_STYLE = {"acted": "bold red", "dry_run": "yellow", "skipped": "dim", "failed": "bold magenta"}


_Policy = Annotated[
    Path, typer.Option("--policy", help="Remediation policy YAML (docs/operations.md lists every knob).")
]
_Slurm = Annotated[bool, typer.Option("--slurm", help="Act through Slurm (scancel / scontrol requeue).")]
_Kubernetes = Annotated[
    bool, typer.Option("--kubernetes", help="Act through Kubernetes (suspend the Job, delete its Pods).")
]
_Namespace = Annotated[
    list[str],
    typer.Option(
        "--namespace",
        help="Kubernetes: a namespace remediate may act in (repeatable; required with --kubernetes).",
    ),
]
_Cluster = Annotated[
    str, typer.Option("--cluster", help="Kubernetes: the cluster's name in decisions and the hourly budget.")
]
_Execute = Annotated[
    bool,
    typer.Option("--execute", help="Really act. Without it every action is a dry run, recorded as such."),
]
_Lookback = Annotated[
    str | None,
    typer.Option(
        "--lookback",
        help="Rebuild alerts and job state from the last DURATION (e.g. 2d; default: everything kept).",
    ),
]
_TickS = Annotated[float, typer.Option("--tick", min=0.1, help="Seconds between decisions.")]
_IdleExitS = Annotated[
    float | None, typer.Option("--idle-exit", help="Exit after N seconds without new records.")
]
_AlertsTopic = Annotated[str, typer.Option("--alerts-topic", help="Alert topic (prefix is added).")]
_EventsTopic = Annotated[str, typer.Option("--events-topic", help="Training events topic.")]
_ActionsTopic = Annotated[str, typer.Option("--actions-topic", help="Where decisions go (ActionTaken).")]


def remediate(
    policy: _Policy,
    slurm: _Slurm = False,
    kubernetes: _Kubernetes = False,
    namespace: _Namespace = [],  # noqa: B006 (typer reads it; nothing appends to it)
    cluster: _Cluster = "",
    execute: _Execute = False,
    lookback: _Lookback = None,
    tick_s: _TickS = 1.0,
    idle_exit_s: _IdleExitS = None,
    alerts_topic: _AlertsTopic = ALERTS,
    events_topic: _EventsTopic = TRAINING_EVENTS,
    actions_topic: _ActionsTopic = ACTIONS,
) -> None:
    """Cancel or requeue jobs that alerts say are stuck (zombie_job, rank_hang, restart_loop), safely; dry run by default."""
    from infra.kafka.quiet import quiet_kafka_conf
    from producers.simulator import parse_duration
    from ranksight.broker import check_broker, kafka_settings
    from ranksight.settings import load_settings
    from schemas.codec import codec_from_settings
    from streams.alerting.remediation import Remediator, load_policy
    from streams.alerting.remediation_loop import RemediationTopics, follow_remediation

    if slurm == kubernetes:
        fail("choose the scheduler to act through: --slurm or --kubernetes")
    settings = load_settings()
    with user_errors():
        rules = load_policy(policy)
        lookback_s = None
        if lookback is not None:
            try:
                lookback_s = parse_duration(lookback)
            except ValueError as exc:
                fail(f"--lookback: {exc}")
        if kubernetes and not namespace:
            fail("--kubernetes needs --namespace: name each namespace remediate may act in")
        team_for = None
        if rules.team_map is not None:
            from producers.scheduler.teams import TeamMap

            team_for = TeamMap.load(rules.team_map).team_for
        actions = _actions(slurm, namespace, cluster)
        remediator = Remediator(
            rules, lookup=actions.lookup, execute=execute, scheduler=actions.name, team_for=team_for
        )
        kafka = kafka_settings()
        check_broker(kafka)  # wrong credentials or an untrusted certificate: one sentence, not retries
        prefix = settings.topic_prefix
        topics = RemediationTopics(prefix + alerts_topic, prefix + events_topic, prefix + actions_topic)
        mode = "[bold red]EXECUTING[/]" if execute else "dry run (no --execute)"
        err_console.print(
            f"remediate: {', '.join(sorted(rules.rules))} through {actions.name}, {mode}; "
            f"following {topics.alerts} and {topics.events}, decisions to {topics.actions}",
            highlight=False,
            soft_wrap=True,
        )

        def describe(decision: Any) -> str:
            return str(actions.describe(decision.action, decision.scheduler_job))

        def act(decision: Any) -> Any:
            from producers.scheduler.actions import SchedulerActionError
            from streams.alerting.remediation import Outcome

            target = decision.scheduler_job.target
            try:
                return Outcome(True, actions.act(decision.action, decision.scheduler_job), target)
            except SchedulerActionError as exc:
                return Outcome(False, str(exc), target)

        def show(record: dict[str, Any]) -> None:
            console.print(decision_line(record), highlight=False, soft_wrap=True)

        def caught_up(stats: Any) -> None:
            err_console.print(
                f"caught up: {stats.alerts} alert records, {stats.events} training events, "
                f"{stats.restored_actions} earlier decisions; deciding every {tick_s:g} s",
                highlight=False,
            )

        def warn(message: str) -> None:
            err_console.print(f"[yellow]warning:[/] {literal(message)}", highlight=False, soft_wrap=True)

        codec = codec_from_settings(kafka.schema_registry_url)
        # The loop checks the stop flag every poll (0.2 s) and flushes within the 5 s budget.
        with stop_signals(name="remediate") as stop:
            stats = follow_remediation(
                quiet_kafka_conf(kafka.kafka_config()),
                topics,
                remediator,
                codec,
                describe=describe,
                act=act,
                lookback_s=lookback_s,
                tick_s=tick_s,
                idle_exit_s=idle_exit_s,
                stop=lambda: stop.requested,
                on_record=show,
                on_caught_up=caught_up,
                warn=warn,
            )
    summary = ", ".join(f"{n} {k}" for k, n in sorted(stats.decisions.items())) or "no decisions"
    console.print(
        f"{summary}; read {stats.alerts} alert records, {stats.events} training events, "
        f"{stats.restored_actions} earlier decisions",
        highlight=False,
    )
    if stop.requested:
        raise typer.Exit(stop.exit_code)


def decision_line(record: dict[str, Any]) -> str:
    """One rich-markup line for an ActionTaken record, every string from the records shown literally."""
    style = _STYLE.get(record["decision"], "white")
    action = literal(record["action"]) if record["action"] != "none" else ""
    return (
        f"[{style}]{literal(str(record['decision']).ljust(8))}[/] {literal(record['rule'])} "
        f"job={literal(record['job_id'])} {action} — {literal(record['reason'])}"
    )


def _actions(slurm: bool, namespaces: list[str], cluster: str) -> Any:
    if slurm:
        from producers.scheduler.actions import SlurmActions

        return SlurmActions()
    from producers.scheduler.actions import KubernetesActions

    return KubernetesActions(namespaces=namespaces, cluster=cluster)


def register(app: typer.Typer) -> None:
    """Add the `remediate` command."""
    app.command("remediate")(remediate)
