"""`ranksight demo`: the whole pipeline once on this machine, live, ending by itself.

Simulator -> Kafka -> the stream worker (detectors) -> rs.alerts, and every topic -> sink -> ClickHouse
(chDB). The demo owns `<home>/demo` (wiped at start) and a private topic prefix per run, so it
never touches the data of a real deployment pointed at by the same settings.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition
from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table

from infra.kafka.local import LocalKafka, ensure_jars
from infra.kafka.quiet import quiet_logger
from infra.kafka.topics import create_topics
from producers.publisher import open_publisher
from producers.simulator import load_scenario, paced, simulate
from ranksight.commands.sink import sink_time_bound
from ranksight.settings import Settings
from schemas.codec import Codec
from schemas.errors import RanksightError
from schemas.files import format_ts
from schemas.records import Event
from schemas.topics import (
    ALERTS,
    DEADLETTER,
    TELEMETRY_GPU,
    TELEMETRY_HOST,
    TRAINING_EVENTS,
    TRAINING_STEPS,
    WORKER_SOURCES,
)
from sinks.clickhouse import close as close_client
from sinks.clickhouse import connect
from sinks.consumer import SINK_TOPICS, SinkConsumer
from sinks.ddl import TABLE_NAMES, migrate

__all__ = ["DemoError", "DemoOptions", "run_demo"]

SOURCE_TOPICS = (TELEMETRY_GPU, TELEMETRY_HOST, TRAINING_STEPS, TRAINING_EVENTS)

# Three questions a platform engineer asks first, answered from the raw and derived tables.
EXAMPLE_QUERIES: tuple[tuple[str, str], ...] = (
    (
        "Which ranks of the pre-training job computed slowest, and who waited for them?",
        """SELECT rank,
       round(quantile(0.5)(forward_s + backward_s + optimizer_s), 3) AS compute_s,
       round(quantile(0.5)(comm_s), 3) AS comm_wait_s,
       count() AS steps
FROM steps
WHERE job_id = 'pretrain-13b-0301'
  AND ts BETWEEN (SELECT min(ts) FROM steps) + INTERVAL 7 MINUTE AND (SELECT min(ts) FROM steps) + INTERVAL 11 MINUTE
GROUP BY rank ORDER BY compute_s DESC LIMIT 4""",
    ),
    (
        "Which GPUs were throttled (thermal or power clock-event reasons) and how hard?",
        """SELECT node, gpu_index,
       countIf(bitAnd(clock_event_reasons, 0xEC) != 0) AS throttled_samples,
       round(minIf(sm_clock_mhz, bitAnd(clock_event_reasons, 0xEC) != 0)) AS min_sm_mhz,
       round(max(power_w)) AS max_power_w
FROM gpu_samples
GROUP BY node, gpu_index HAVING throttled_samples > 0
ORDER BY throttled_samples DESC LIMIT 4""",
    ),
    (
        "Every alert, routed to its team, with when it fired and resolved",
        """SELECT team, rule, job_id, ifNull(toString(rank), '-') AS rank, ifNull(node, '-') AS node,
       formatDateTime(min(starts_at), '%H:%i:%S') AS fired,
       ifNull(formatDateTime(max(ends_at), '%H:%i:%S'), 'firing') AS resolved
FROM alerts FINAL
GROUP BY team, rule, job_id, rank, node ORDER BY fired""",
    ),
)


class DemoError(RanksightError):
    """The demo could not run to the end."""


@dataclass(frozen=True)
class DemoOptions:
    """Knobs of `ranksight demo`."""

    scenario: str = "mixed"
    seed: int = 0
    speed: float = 20.0
    timeout_s: float = 240.0
    ui_port: int | None = 8088  # None: no UI; taken: any free port
    keep_ui: bool = True  # after the summary, keep the UI up until Enter / Ctrl-C (only on a terminal)


@dataclass
class _Board:
    """What the live view shows, updated by the publisher thread and the alert consumer."""

    published: Counter[str] = field(default_factory=Counter)
    sim_ts: int = 0
    sim_start: int = 0
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    firing: dict[str, dict[str, Any]] = field(default_factory=dict)
    log: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=12))
    alert_messages: int = 0
    fired: int = 0
    resolved: int = 0
    stored: int = 0
    phase: str = "starting"
    lock: threading.Lock = field(default_factory=threading.Lock)

    def on_published(self, event: Event) -> None:
        r = event.record
        with self.lock:
            self.published[event.type] += 1
            self.sim_ts = r["ts"]
            if not self.sim_start:
                self.sim_start = r["ts"]
            if event.type == "JobStarted":
                self.jobs[r["job_id"]] = {"team": r["team"], "step": 0, "world": r["world_size"]}
            elif event.type == "StepCompleted" and r["job_id"] in self.jobs:
                job = self.jobs[r["job_id"]]
                job["step"] = max(job["step"], r["step"])

    def on_alert(self, alert: dict[str, Any]) -> None:
        with self.lock:
            self.alert_messages += 1
            key = alert["fingerprint"]
            if alert["status"] == "firing":
                if key not in self.firing:
                    self.fired += 1
                self.firing[key] = alert
            else:
                if self.firing.pop(key, None) is not None:
                    self.resolved += 1
            self.log.appendleft(alert)


def _render(board: _Board, options: DemoOptions) -> Group:
    with board.lock:
        elapsed = (board.sim_ts - board.sim_start) / 60000 if board.sim_start else 0.0
        head = (
            f"[bold]scenario[/] {options.scenario} x{options.speed:g}   [bold]simulated[/] {elapsed:5.1f} min   "
            f"[bold]published[/] {sum(board.published.values()):,}   [bold]stored[/] {board.stored:,} rows   "
            f"[bold]alerts[/] {board.fired} fired / {board.resolved} resolved   [dim]{board.phase}[/]"
        )
        jobs = Table(title="jobs", expand=True, title_justify="left")
        for col in ("job", "team", "ranks", "step", "firing now"):
            jobs.add_column(col)
        for job_id, job in sorted(board.jobs.items()):
            rules = sorted({a["rule"] for a in board.firing.values() if a["job_id"] == job_id})
            jobs.add_row(
                job_id,
                job["team"],
                str(job["world"]),
                f"{job['step']:,}",
                "[red]" + ", ".join(rules) + "[/]" if rules else "[green]healthy[/]",
            )
        alerts = Table(title="alerts (newest first)", expand=True, title_justify="left")
        for col in ("event time", "status", "rule", "team", "where"):
            alerts.add_column(col, no_wrap=True)
        alerts.add_column("summary", no_wrap=True, overflow="ellipsis", ratio=1)
        for a in board.log:
            where = a["job_id"] or "-"
            if a.get("rank") is not None:
                where += f" rank {a['rank']}"
            elif a.get("node"):
                where += f" {a['node']}"
            colour = "red" if a["status"] == "firing" else "green"
            alerts.add_row(
                format_ts(a["ts"])[11:19],
                f"[{colour}]{a['status']}[/]",
                a["rule"],
                a["team"],
                where,
                a["summary"],
            )
    return Group(Panel(head, title="ranksight demo", border_style="cyan"), jobs, alerts)


@contextmanager
def _kafka(settings: Settings, home: Path, say: Callable[[str], None]) -> Iterator[str]:
    if settings.kafka_bootstrap:
        say(f"using Kafka at {settings.kafka_bootstrap}")
        yield settings.kafka_bootstrap
        return
    broker = LocalKafka(home / "kafka", libs=ensure_jars(progress=say), progress=say)
    say("starting a local Kafka broker (KRaft) ...")
    bootstrap = broker.start(timeout=120)
    say(f"Kafka is up on {bootstrap}")
    try:
        yield bootstrap
    finally:
        broker.stop()


@contextmanager
def _worker(
    bootstrap: str, prefix: str, home: Path, say: Callable[[str], None]
) -> Iterator[subprocess.Popen[bytes]]:
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP": bootstrap,
        "RANKSIGHT_TOPIC_PREFIX": prefix,
        "RANKSIGHT_HOME": str(home),
    }
    log = open(home / "worker.log", "wb")  # noqa: SIM115 - closed below
    cmd = [
        sys.executable,
        "-m",
        "ranksight.cli",
        "worker",
        "--workdir",
        str(home / "worker"),
        "--log-level",
        "warning",
    ]
    say("starting the detection worker ...")
    process = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)
        log.close()


def _consumer(bootstrap: str, group: str) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "log_level": 0,
        }
    )


def _topic_end_offsets(bootstrap: str, topics: list[str]) -> dict[tuple[str, int], int]:
    probe = _consumer(bootstrap, "ranksight-demo-probe")
    try:
        ends: dict[tuple[str, int], int] = {}
        metadata = probe.list_topics(timeout=10)
        for topic in topics:
            for partition in metadata.topics[topic].partitions:
                _, high = probe.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
                ends[(topic, partition)] = high
        return ends
    finally:
        probe.close()


def _group_lag(bootstrap: str, group: str, topics: list[str]) -> int:
    """Messages of `topics` the consumer group has not committed yet."""
    ends = _topic_end_offsets(bootstrap, topics)
    probe = _consumer(bootstrap, group)
    try:
        committed = probe.committed([TopicPartition(t, p) for t, p in ends], timeout=10)
    finally:
        probe.close()
    lag = 0
    for tp in committed:
        end = ends[(tp.topic, tp.partition)]
        lag += end - (tp.offset if tp.offset >= 0 else 0)
    return lag


def _wait(
    what: str, done: Callable[[], bool], timeout_s: float, board: _Board, tick: Callable[[], None]
) -> None:
    deadline = time.monotonic() + timeout_s
    with board.lock:
        board.phase = f"waiting for {what}"
    while not done():
        if time.monotonic() > deadline:
            raise DemoError(f"gave up waiting for {what} after {timeout_s:.0f} s")
        tick()
        time.sleep(0.5)


def run_demo(settings: Settings, options: DemoOptions, console: Console) -> dict[str, Any]:
    """Run the demo end to end; returns the summary numbers it printed."""
    home = (settings.home / "demo").resolve()
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    prefix = f"{settings.topic_prefix}demo{int(time.time())}."

    def say(message: str) -> None:
        console.print(f"[dim]{message}[/]", highlight=False)

    # The sink thread logs librdkafka through `sinks.kafka`: one line per state change.
    quiet_logger("sinks.kafka")
    started = time.monotonic()
    # Event time ends about now: recent enough for the tables' TTL, and the queries below are
    # written relative to the scenario's start.
    scenario = load_scenario(options.scenario)
    start_ms = (int(time.time()) // 60 * 60 - int(scenario.duration)) * 1000
    scenario = scenario.with_overrides(start_ms=start_ms)
    simulation = simulate(scenario, options.seed)
    events = list(simulation.events())
    say(
        f"simulated scenario {scenario.name!r}: {len(events):,} events, {len(simulation.labels)} injected faults"
    )
    board = _Board()
    with ExitStack() as stack:
        bootstrap = stack.enter_context(_kafka(settings, home, say))
        create_topics(bootstrap, prefix=prefix)
        say(f"topics created with prefix {prefix!r}")
        kafka_conf = {"bootstrap.servers": bootstrap}

        dsn = f"chdb://{home / 'chdb'}"
        client = connect(dsn)
        stack.callback(close_client, dsn)  # one chDB directory per process: let the next one open
        migrate(client, ttl_days=settings.ttl_days)
        ui_url = _start_ui(client, options, stack, say)
        sink, stop_sink, sink_thread = _start_sink(kafka_conf, client, prefix, stack)

        worker = stack.enter_context(_worker(bootstrap, prefix, home, say))
        alerts = _consumer(bootstrap, prefix + "demo-view")
        alerts.subscribe([prefix + ALERTS])
        stack.callback(alerts.close)
        codec = Codec()

        def tick() -> None:
            for message in alerts.consume(500, timeout=0.1):
                value = message.value()
                if message.error() is None and value is not None:
                    board.on_alert(codec.decode(value).record)
            board.stored = sink.stats()["inserted_rows"]
            if worker.poll() is not None:
                raise DemoError(
                    f"the detection worker exited with code {worker.returncode}; see {home / 'worker.log'}"
                )

        publisher = open_publisher(
            "kafka", kafka_conf=kafka_conf, topic_prefix=prefix, spool_dir=home / "spool"
        )
        publish_error: list[BaseException] = []

        def publish() -> None:
            try:
                for event in paced(events, options.speed):
                    publisher.publish(event)
                    board.on_published(event)
                if publisher.flush(60) != 0:
                    raise DemoError("some events could not be delivered to Kafka within 60 s")
            except BaseException as exc:  # reported on the main thread
                publish_error.append(exc)

        with Live(_render(board, options), console=console, refresh_per_second=4, transient=False) as live:
            board.phase = "publishing"
            publish_started = time.monotonic()
            producer_thread = threading.Thread(target=publish, name="simulator", daemon=True)
            producer_thread.start()
            while producer_thread.is_alive():
                tick()
                live.update(_render(board, options))
                time.sleep(0.25)
            publish_s = time.monotonic() - publish_started
            publisher.close()
            if publish_error:
                raise DemoError(f"publishing failed: {publish_error[0]}") from publish_error[0]

            def refresh() -> None:
                tick()
                live.update(_render(board, options))

            _wait_stored(bootstrap, prefix, options, board, refresh)
            board.phase = "done"
            refresh()

        console.print()
        stop_sink.set()
        sink_thread.join(30)
        counts = _print_summary(client, board, simulation.labels, console)
        for title, sql in EXAMPLE_QUERIES:
            _print_query(client, title, sql, console)
        wall = time.monotonic() - started
        stats = sink.stats()
        _print_done(console, board, options, stats, wall, publish_s, home)
        if ui_url is not None:
            _keep_ui(ui_url, dsn, options, console)
        return {
            "ui_url": ui_url,
            "wall_s": wall,
            "published": dict(board.published),
            "rows": counts,
            "sink": stats,
            "alerts": {"fired": board.fired, "resolved": board.resolved},
        }


def _start_sink(
    kafka_conf: dict[str, Any], client: Any, prefix: str, stack: ExitStack
) -> tuple[SinkConsumer, threading.Event, threading.Thread]:
    """The sink on a thread of its own, storing every topic; stopped and closed when `stack` unwinds."""
    sink = SinkConsumer(
        kafka_conf,
        client,
        [prefix + t for t in SINK_TOPICS],
        prefix + "sink",
        deadletter_topic=prefix + DEADLETTER,
        progress_interval_s=3600,
        time_bound=sink_time_bound(),  # the worker's bound on event times (shipped config)
    )
    stop_sink = threading.Event()
    sink_thread = threading.Thread(target=sink.run, kwargs={"stop": stop_sink}, name="sink", daemon=True)
    sink_thread.start()
    stack.callback(sink.close)
    stack.callback(sink_thread.join, 30)
    stack.callback(stop_sink.set)
    return sink, stop_sink, sink_thread


def _wait_stored(
    bootstrap: str, prefix: str, options: DemoOptions, board: _Board, refresh: Callable[[], None]
) -> None:
    """Wait until the worker has read every source and the sink has stored every topic (lag 0)."""
    source = [prefix + t for t in SOURCE_TOPICS]
    worker_source = [prefix + t for t in WORKER_SOURCES]
    _wait(
        "the worker to process everything",
        lambda: _group_lag(bootstrap, prefix + "ranksight-detect", worker_source) == 0,
        options.timeout_s,
        board,
        refresh,
    )
    derived_and_alerts = [prefix + t for t in SINK_TOPICS if t not in SOURCE_TOPICS]
    _wait(
        "the sink to store everything",
        lambda: _group_lag(bootstrap, prefix + "sink", [*source, *derived_and_alerts]) == 0,
        options.timeout_s,
        board,
        refresh,
    )


def _print_done(
    console: Console,
    board: _Board,
    options: DemoOptions,
    stats: dict[str, Any],
    wall: float,
    publish_s: float,
    home: Path,
) -> None:
    """The closing lines: what was published and stored, how fast, the alerts, where the store is."""
    rows = stats["inserted_rows"]
    console.print(
        f"\n[bold]done[/] in {wall:.0f} s: {sum(board.published.values()):,} events published at x{options.speed:g} "
        f"event time, {rows:,} rows stored in {stats['inserts']:,} inserts "
        f"({rows / max(stats['insert_s'], 1e-9):,.0f} rows per second of insert time; the sink kept pace with "
        f"the {sum(board.published.values()) / max(publish_s, 1e-9):,.0f} events/s published), "
        f"{board.fired} alerts fired, {board.resolved} resolved.",
        highlight=False,
    )
    console.print(
        f"the demo's store is {home / 'chdb'}: query it with "
        '`ranksight sql --demo "SELECT count() FROM steps"`',
        highlight=False,
        soft_wrap=True,
    )


def _start_ui(client: Any, options: DemoOptions, stack: ExitStack, say: Callable[[str], None]) -> str | None:
    """Serve the UI on the demo's store from this process (chDB allows one process per store)."""
    if options.ui_port is None:
        return None
    from ui.errors import UiError
    from ui.server import UiServer

    server = UiServer(client, "127.0.0.1", options.ui_port)
    try:
        url = server.start()
    except UiError:
        # The usual port is taken (another demo, a UI): any free one.
        server = UiServer(client, "127.0.0.1", 0)
        url = server.start()
    stack.callback(server.stop)
    say(f"UI: {url} (jobs, alerts and every panel fill in live)")
    return url


def _keep_ui(url: str, dsn: str, options: DemoOptions, console: Console) -> None:
    """On a terminal, keep the UI up until Enter or Ctrl-C; elsewhere (CI, pipes) return at once."""
    if options.keep_ui and sys.stdin is not None and sys.stdin.isatty():
        console.print(f"\n[bold]UI[/] on {url} - press Enter (or Ctrl-C) to stop the demo", highlight=False)
        with suppress(KeyboardInterrupt):
            sys.stdin.readline()
        return
    console.print(
        f"\nUI was on {url} during the run; to look again: CLICKHOUSE_URL={dsn} ranksight ui", highlight=False
    )


def _print_summary(
    client: Any, board: _Board, labels: list[dict[str, Any]], console: Console
) -> dict[str, int]:
    table = Table(title="rows stored vs events published", title_justify="left")
    for col in ("table", "published", "stored", ""):
        table.add_column(col, justify="right" if col in ("published", "stored") else "left")
    counts: dict[str, int] = {}
    mismatch = []
    for record_type, published in sorted(board.published.items()):
        name = TABLE_NAMES[record_type]
        stored = int(client.command(f"SELECT count() FROM {name}"))
        counts[name] = stored
        ok = stored == published
        if not ok:
            mismatch.append(name)
        table.add_row(name, f"{published:,}", f"{stored:,}", "[green]ok[/]" if ok else "[red]MISMATCH[/]")
    for name in ("alerts", "derived_rank_windows", "derived_job_windows"):
        stored = int(client.command(f"SELECT count() FROM {name}"))
        counts[name] = stored
        table.add_row(name, "(derived)", f"{stored:,}", "")
    console.print(table)
    faults = Table(title="injected faults vs alerts", title_justify="left")
    for col in ("fault", "job", "expected alert", "fired"):
        faults.add_column(col)
    fired_rules = {(a["rule"], a["job_id"]) for a in board.log} | {
        (a["rule"], a["job_id"]) for a in board.firing.values()
    }
    fired_rules |= {
        (row[0], row[1]) for row in client.query("SELECT DISTINCT rule, job_id FROM alerts").result_rows
    }
    for label in labels:
        expected = label["alert"] or "(none)"
        hit = label["alert"] is None or (label["alert"], label["job_id"]) in fired_rules
        faults.add_row(label["fault"], label["job_id"], expected, "[green]yes[/]" if hit else "[red]no[/]")
    console.print(faults)
    if mismatch:
        raise DemoError(f"stored rows differ from published events in: {', '.join(mismatch)}")
    return counts


def _print_query(client: Any, title: str, sql: str, console: Console) -> None:
    console.print(f"\n[bold]{title}[/]")
    console.print(f"[dim]{sql}[/]", highlight=False)
    result = client.query(sql)
    table = Table()
    for name in result.column_names:
        table.add_column(name)
    for row in result.result_rows:
        table.add_row(*("" if v is None else str(v) for v in row))
    console.print(table)
