"""`ranksight alerts tail|forward`: follow the alert topic; bridge it to Prometheus Alertmanager."""

from __future__ import annotations

import functools
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ranksight.console import console, err_console, fail, literal, user_errors
from ranksight.signals import StopSignals, stop_signals
from schemas.topics import ALERTS, DEADLETTER

if TYPE_CHECKING:
    from schemas.files import JsonlFormat

__all__ = ["alert_json", "alert_line", "register"]

alerts_app = typer.Typer(help="Follow routed alerts (rs.alerts) or forward them to Alertmanager.")

_STATUS_STYLE = {"firing": "bold red", "resolved": "green"}
_SEVERITY_STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan"}


def alert_line(r: dict[str, Any]) -> str:
    """One rich-markup line for an Alert record, every string from the record shown literally."""
    from schemas.files import format_ts

    where = [f"job={literal(r.get('job_id') or '-')}"]
    for name in ("rank", "node", "gpu_index"):
        if r.get(name) is not None:
            where.append(f"{name}={literal(r[name])}")
    status = str(r.get("status", "?"))
    sev = str(r.get("severity", ""))
    return (
        f"{format_ts(int(r['ts']))} [{_STATUS_STYLE.get(status, 'white')}]{literal(f'{status:<8}')}[/] "
        f"[{_SEVERITY_STYLE.get(sev, 'white')}]{literal(f'{sev:<8}')}[/] [bold]{literal(r['rule'])}[/] "
        f"team={literal(r.get('team'))} {' '.join(where)} — {literal(r.get('summary', ''))}"
    )


def alert_json(record: dict[str, Any]) -> str:
    """One JSON line for an Alert record, timestamps as ISO-8601 strings like every other JSON output."""
    from schemas.records import Event

    return _jsonl_format().to_line(Event("Alert", record))


@functools.cache
def _jsonl_format() -> JsonlFormat:
    from schemas.files import JsonlFormat

    return JsonlFormat()


def _consumer(from_beginning: bool, topic: str) -> Any:
    from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaException, TopicPartition

    from infra.kafka.quiet import quiet_kafka_conf
    from ranksight.broker import check_broker, kafka_settings

    settings = kafka_settings()
    check_broker(settings)
    conf = {
        **quiet_kafka_conf(settings.kafka_config()),
        # Own throw-away group, manual assignment, no commits: tails never disturb each other.
        "group.id": f"ranksight-alerts-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False,
        "log_level": 0,
    }
    consumer = Consumer(conf)
    try:
        meta = consumer.list_topics(topic, timeout=10)
    except KafkaException as exc:
        consumer.close()
        fail(f"Kafka at {settings.kafka_bootstrap} does not answer ({exc.args[0].str()})")
    tmeta = meta.topics.get(topic)
    if tmeta is None or tmeta.error is not None or not tmeta.partitions:
        consumer.close()
        fail(
            f"no topic {topic!r}: create topics with `ranksight kafka topics` (check RANKSIGHT_TOPIC_PREFIX)"
        )
    start = OFFSET_BEGINNING if from_beginning else OFFSET_END
    consumer.assign([TopicPartition(topic, p, start) for p in sorted(tmeta.partitions)])
    return consumer


def _records(
    consumer: Any, team: str | None, idle_exit_s: float | None, stop: StopSignals | None = None
) -> Any:
    from ranksight.settings import load_settings
    from schemas.codec import codec_from_settings
    from schemas.errors import DecodeError

    settings = load_settings()
    codec = codec_from_settings(settings.schema_registry_url)
    last = time.monotonic()
    while stop is None or not stop.requested:
        msg = consumer.poll(0.5)
        if msg is None:
            if idle_exit_s is not None and time.monotonic() - last > idle_exit_s:
                return
            yield None
            continue
        if msg.error() is not None:
            err_console.print(f"[yellow]warning:[/] {literal(msg.error().str())}")
            continue
        last = time.monotonic()
        # Keys are the team: skip other teams without decoding.
        if team is not None and msg.key() is not None and msg.key().decode(errors="replace") != team:
            continue
        try:
            event = codec.decode(msg.value())
        except DecodeError as exc:
            err_console.print(
                f"[yellow]skipped:[/] {literal(exc.located(msg.topic(), msg.partition(), msg.offset()))}"
            )
            continue
        if team is not None and event.record.get("team") != team:
            continue
        yield event.record


@alerts_app.command("tail")
def tail(
    team: str | None = typer.Option(None, "--team", help="Only alerts routed to this team."),
    from_beginning: bool = typer.Option(False, "--from-beginning", help="Start at the oldest alert kept."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per line instead of coloured text."),
    topic: str = typer.Option(
        ALERTS, "--topic", help="Alert topic (e.g. rs.alerts.replay); prefix is added."
    ),
    idle_exit_s: float | None = typer.Option(
        None, "--idle-exit", help="Exit after N seconds without alerts."
    ),
) -> None:
    """Print routed alerts as they arrive (Ctrl-C stops)."""
    from ranksight.settings import load_settings

    settings = load_settings()
    with user_errors(), stop_signals(name="alerts tail", announce=False) as stop:
        consumer = _consumer(from_beginning, settings.topic_prefix + topic)
        err_console.print(
            f"[dim]following {settings.topic_prefix + topic} from "
            f"{'the oldest alert kept' if from_beginning else 'now'}; Ctrl-C to stop[/]",
            highlight=False,
        )
        try:
            for record in _records(consumer, team, idle_exit_s, stop):
                if record is None:
                    continue
                if as_json:
                    print(alert_json(record), flush=True)
                else:
                    console.print(alert_line(record), highlight=False, soft_wrap=True)
        finally:
            consumer.close()


_Alertmanager = Annotated[
    str, typer.Option("--alertmanager", help="Alertmanager base URL, e.g. http://127.0.0.1:9093.")
]
_Team = Annotated[str | None, typer.Option("--team", help="Only alerts routed to this team.")]
_ResendS = Annotated[float, typer.Option("--resend", min=1.0, help="Re-send firing alerts every N seconds.")]
_KeepaliveS = Annotated[
    float | None,
    typer.Option(
        "--keepalive",
        help="endsAt of a firing alert = now + N s (default 4 x --resend): how long Alertmanager "
        "keeps it firing if the forwarder stops.",
    ),
]
_Topic = Annotated[
    str, typer.Option("--topic", help="Alert topic to forward (e.g. rs.alerts.replay); prefix is added.")
]
_File = Annotated[
    Path | None,
    typer.Option(
        "--file", help="Forward the last state of every alert of a file (.avro or .jsonl) once, then exit."
    ),
]
_Group = Annotated[
    str | None,
    typer.Option(
        "--group",
        help="Consumer group keeping the committed offsets (default ranksight-alerts-forward.<topic>[.<team>]).",
    ),
]
_Lookback = Annotated[
    str | None,
    typer.Option(
        "--lookback",
        help="Rebuild the firing set from alerts of the last DURATION (e.g. 7d; default: every alert kept).",
    ),
]
_FromBeginning = Annotated[
    bool,
    typer.Option(
        "--from-beginning", help="Rebuild from the oldest alert kept (the default; overrides --lookback)."
    ),
]
_UiUrl = Annotated[
    str,
    typer.Option(
        "--ui-url",
        envvar="RANKSIGHT_UI_URL",
        help="ranksight UI base URL: generatorURL = <url>/alerts/<alert_id>; runbook links "
        "<url>/runbooks/<rule> unless --runbook-base-url says otherwise.",
    ),
]
_RunbookBaseUrl = Annotated[
    str,
    typer.Option(
        "--runbook-base-url",
        envvar="RANKSIGHT_RUNBOOK_BASE_URL",
        help="Base of the runbook_url annotation (<base>/<rule>) for alerts whose link is relative.",
    ),
]
_IdleExitS = Annotated[float | None, typer.Option("--idle-exit", help="Exit after N seconds without alerts.")]
_JobLabels = Annotated[
    list[str],
    typer.Option(
        "--job-label",
        envvar="RANKSIGHT_ALERT_JOB_LABELS",
        help="A job label (JobStarted labels) to send to Alertmanager as a label, its name in "
        "Alertmanager's syntax (ranksight.dev/tier -> ranksight_dev_tier); repeat for more. No others "
        "are sent, and none can set alertname, job, team, severity, receiver, inhibited_by or the like.",
    ),
]
_MetricsPort = Annotated[
    int,
    typer.Option(
        "--metrics-port",
        min=0,
        max=65535,
        envvar="RANKSIGHT_FORWARD_METRICS_PORT",
        help="Serve Prometheus /metrics on this port (0: off).",
    ),
]


@alerts_app.command("forward")
def forward(
    alertmanager: _Alertmanager,
    team: _Team = None,
    resend_s: _ResendS = 60.0,
    keepalive_s: _KeepaliveS = None,
    topic: _Topic = ALERTS,
    file: _File = None,
    group: _Group = None,
    lookback: _Lookback = None,
    from_beginning: _FromBeginning = False,
    ui_url: _UiUrl = "",
    runbook_base_url: _RunbookBaseUrl = "",
    idle_exit_s: _IdleExitS = None,
    job_labels: _JobLabels = [],  # noqa: B006 (typer reads it; nothing appends to it)
    metrics_port: _MetricsPort = 0,
) -> None:
    """Forward alerts to Alertmanager (POST /api/v2/alerts), keeping firing ones alive across restarts."""
    from infra.kafka.quiet import quiet_kafka_conf
    from producers.simulator import parse_duration
    from ranksight.broker import check_broker, kafka_settings
    from ranksight.settings import load_settings
    from schemas.codec import codec_from_settings
    from streams.alerting.alertmanager import AlertForwarder, AlertmanagerClient, AlertmanagerError
    from streams.alerting.delivery import DeliveryStats, forward_file, forward_topic

    settings = load_settings()
    with user_errors():
        lookback_s = None
        if lookback is not None and not from_beginning:
            try:
                lookback_s = parse_duration(lookback)
            except ValueError as exc:
                fail(f"--lookback: {exc}")
        client = AlertmanagerClient(alertmanager)
        try:
            forwarder = AlertForwarder(
                client.post,
                resend_s=resend_s,
                keepalive_s=keepalive_s,
                ui_url=ui_url,
                team=team,
                runbook_base_url=runbook_base_url,
                job_labels=job_labels,
            )
        except ValueError as exc:
            client.close()
            fail(f"--job-label: {exc}" if "job label" in str(exc) else f"--keepalive: {exc}")
        try:
            if file is not None:
                try:
                    sent = forward_file(file, forwarder)
                except AlertmanagerError as exc:
                    fail(str(exc))
                console.print(
                    f"sent the last state of {sent} alerts from {literal(file)} to {literal(client.shown_url)}",
                    highlight=False,
                )
                return
            full_topic = settings.topic_prefix + topic
            group_id = group or f"ranksight-alerts-forward.{full_topic}" + (f".{team}" if team else "")
            console.print(
                f"forwarding {full_topic} to {literal(client.shown_url)} as group {literal(group_id)} "
                f"(re-send every {resend_s:.0f} s, endsAt +{forwarder.keepalive_s:.0f} s)"
            )
            settings = kafka_settings()  # KAFKA_BOOTSTRAP, else the running `ranksight kafka up`
            check_broker(settings)
            codec = codec_from_settings(settings.schema_registry_url)

            run_stats: list[DeliveryStats] = []  # the run's own counters, known from the rebuild on
            _serve_forward_metrics(metrics_port, forwarder, run_stats)

            def rebuilt(stats: DeliveryStats) -> None:
                run_stats.append(stats)
                console.print(
                    f"rebuilt: {stats.restored} earlier alert records read, {forwarder.firing} firing",
                    highlight=False,
                )

            def record(r: dict[str, Any]) -> None:
                console.print(alert_line(r), highlight=False, soft_wrap=True)

            def warn(message: str) -> None:
                err_console.print(f"[yellow]warning:[/] {literal(message)}", highlight=False, soft_wrap=True)

            # The loop ends at the next poll after SIGINT/SIGTERM, commits what was sent and leaves.
            with stop_signals(name="alerts forward") as stop:
                stats = forward_topic(
                    quiet_kafka_conf(settings.kafka_config()),
                    full_topic,
                    group_id,
                    forwarder,
                    codec.decode,
                    lookback_s=lookback_s,
                    idle_exit_s=idle_exit_s,
                    stop=lambda: stop.requested,
                    on_record=record,
                    on_rebuilt=rebuilt,
                    warn=warn,
                    deadletter_topic=settings.topic_prefix + DEADLETTER,
                )
        finally:
            client.close()
    console.print(f"sent {stats.sent} alerts; {forwarder.firing} firing")


def _serve_forward_metrics(port: int, forwarder: Any, run_stats: list[Any]) -> None:
    """Serve the forwarder's /metrics (nothing when `port` is 0), refreshed every second.

    A daemon thread reads the forwarder's counters and firing set; a read that races the
    forwarding loop (its dict changing size) is skipped and retried a second later."""
    if not port:
        return
    import collections
    import threading

    from infra.metrics import MetricsServer
    from streams.alerting.delivery import forwarder_metrics

    server = MetricsServer(port)

    def refresh() -> None:
        while True:
            stats = run_stats[-1] if run_stats else None
            try:
                firing = collections.Counter(str(r.get("rule")) for r in forwarder.firing_records())
            except RuntimeError:  # changed while read: next time
                firing = None
            if firing is not None:
                server.publish(
                    forwarder_metrics(
                        received=stats.received if stats else 0,
                        sent=stats.sent if stats else 0,
                        firing_by_rule=firing,
                    )
                )
            time.sleep(1.0)

    threading.Thread(target=refresh, name="ranksight-forward-metrics", daemon=True).start()


@alerts_app.command("am-config")
def am_config(
    ownership: Path | None = typer.Option(
        None,
        "--ownership",
        help="Ownership YAML: teams, receivers, owners per category and cluster "
        "(default: the one the routing file names).",
    ),
    routing: Path | None = typer.Option(
        None, "--routing", help="Routing YAML whose inhibit rules and routes are rendered (default: shipped)."
    ),
    out: Path | None = typer.Option(
        None, "--out", "-o", help="Write the configuration here (default: stdout)."
    ),
) -> None:
    """Render an Alertmanager configuration: routes by team and category, repeat intervals, escalation, inhibition."""
    from streams.alerting.amconfig import render_alertmanager_config
    from streams.alerting.ownership import load_ownership
    from streams.alerting.routing import load_router

    with user_errors():
        router = load_router(routing)
        owners = load_ownership(ownership) if ownership is not None else router.ownership
        if owners is None:
            fail("the routing file names no ownership file: pass --ownership FILE")
        # The header names the file as the user would (relative to here when it is below).
        source = Path(owners.source)
        shown = str(source.relative_to(Path.cwd())) if source.is_relative_to(Path.cwd()) else str(source)
        rendered = render_alertmanager_config(owners, router.inhibit_rules, router.routes, source=shown)
    for warning in rendered.warnings:
        err_console.print(f"[yellow]warning:[/] {warning}", highlight=False, soft_wrap=True)
    if out is None:
        print(rendered.text, end="")
        return
    try:
        out.write_text(rendered.text, encoding="utf-8")
    except OSError as exc:
        fail(f"cannot write {out}: {exc.strerror}")
    err_console.print(
        f"wrote {out}: {len(owners.teams)} teams, {len(rendered.config['receivers'])} receivers, "
        f"{len(rendered.config['inhibit_rules'])} inhibit rules; check it with `amtool check-config {out}`",
        highlight=False,
        soft_wrap=True,
    )


def register(app: typer.Typer) -> None:
    """Add the `alerts` group."""
    app.add_typer(alerts_app, name="alerts")
