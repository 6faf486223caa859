"""Every long-running command stops on SIGINT and on SIGTERM, also when started with SIGINT ignored.

Scripts and supervisors start programs with SIGINT ignored (`cmd &` in a non-interactive shell,
nohup); Python then never raises KeyboardInterrupt (issue 21.4). Each command is started both
that way and with the default disposition, waited for until it says it is working, signalled,
and must end through its own stop path: status 0 for a service, 128 + signal for a run cut
short, within the stop budget, having flushed what it owes (the sink stored and committed what
it read; a producer's events are in Kafka or its spool).
"""

from __future__ import annotations

import re
import signal
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil
import pytest
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from infra.kafka.topics import create_topics, delete_topics, prefixed
from producers.publisher import KafkaPublisher
from ranksight.signals import STOP_GRACE_S
from schemas.files import iter_container
from schemas.topics import TELEMETRY_GPU, TELEMETRY_HOST, TRAINING_EVENTS, TRAINING_STEPS
from sinks.ddl import table_for
from tests.integration.stopping import RANKSIGHT, Running, Stopped

SOURCES = (TELEMETRY_GPU, TELEMETRY_HOST, TRAINING_STEPS, TRAINING_EVENTS)
# The stop budget is 5 s; a busy 2-core CI machine gets a margin before this fails. The hard
# deadline (10 s) would show as its own message, which the clean-exit checks reject.
STOP_LIMIT_S = STOP_GRACE_S + 3.0

# Both dispositions of SIGINT, both signals. SIGTERM's own disposition is the default either way
# (`&` and nohup leave it alone), so "SIGINT ignored, then SIGTERM" would repeat "default, SIGTERM"
# and is left out to keep the suite's time (each case starts a process; CI has two cores).
VARIANTS = [
    pytest.param(True, signal.SIGINT, id="sigint-ignored-SIGINT"),
    pytest.param(False, signal.SIGINT, id="default-SIGINT"),
    pytest.param(False, signal.SIGTERM, id="default-SIGTERM"),
]


@dataclass(frozen=True)
class Recorded:
    """The module's events: a file, how many of each type, and a topic prefix that already holds them."""

    path: Path
    counts: Counter[str]
    prefix: str

    @property
    def total(self) -> int:
        return sum(self.counts.values())


@pytest.fixture(scope="module")
def recorded(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Recorded]:
    """One minute of a healthy job, stamped just before now (inside the store's retention and time bound)."""
    folder = tmp_path_factory.mktemp("signals")
    path = folder / "events.avro"
    start = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 120))
    made = subprocess.run(
        [RANKSIGHT, "simulate", "-s", "healthy", "--duration", "1m", "--start", start, "-o", str(path), "-q"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=folder,
    )
    assert made.returncode == 0, made.stderr
    events = list(iter_container(path))
    prefix = f"sig{uuid.uuid4().hex[:6]}."
    create_topics(kafka_bootstrap, prefix=prefix)
    publisher = KafkaPublisher({"bootstrap.servers": kafka_bootstrap}, topic_prefix=prefix)
    for event in events:
        publisher.publish(event)
    assert publisher.flush(60) == 0
    publisher.close()
    yield Recorded(path, Counter(e.type for e in events), prefix)
    delete_topics(kafka_bootstrap, prefixed(prefix).values())


@pytest.fixture
def own_topics(kafka_bootstrap: str) -> Iterator[str]:
    """A fresh, empty prefix for a command that produces (its output is counted there)."""
    prefix = f"sig{uuid.uuid4().hex[:6]}."
    create_topics(kafka_bootstrap, prefix=prefix)
    yield prefix
    delete_topics(kafka_bootstrap, prefixed(prefix).values())


@pytest.fixture
def alertmanager() -> Iterator[str]:
    """An HTTP endpoint that accepts Alertmanager's POST /api/v2/alerts (the forwarder's target)."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _env(bootstrap: str, home: Path, prefix: str) -> dict[str, str]:
    return {"KAFKA_BOOTSTRAP": bootstrap, "RANKSIGHT_HOME": str(home), "RANKSIGHT_TOPIC_PREFIX": prefix}


def _run_and_stop(
    tmp_path: Path,
    args: list[str],
    env: dict[str, str],
    ready: str,
    ignore_sigint: bool,
    sig: signal.Signals,
    before_signal: Callable[[Running], None] | None = None,
) -> Stopped:
    running = Running.start(args, env=env, log=tmp_path / "command.log", ignore_sigint=ignore_sigint)
    try:
        running.wait_for(ready)
        if before_signal is not None:
            before_signal(running)
        stopped = running.stop(sig)
    finally:
        running.kill()
    print(f"{args[0]} {' '.join(args[1:2])}: stopped {stopped.seconds:.2f} s after {sig.name}")
    assert "Traceback" not in stopped.output, stopped.output
    assert "exiting now" not in stopped.output, stopped.output  # not the hard deadline, not a 2nd signal
    assert stopped.seconds < STOP_LIMIT_S, stopped.output
    return stopped


def _service_stopped(stopped: Stopped) -> None:
    """A service's clean stop is exit status 0."""
    assert stopped.code == 0, stopped.output


def _cut_short(stopped: Stopped, sig: signal.Signals) -> None:
    """A run cut short by a signal exits 128 + signal (what shells report), through its stop path."""
    assert stopped.code == 128 + sig, stopped.output
    assert f"stopped by {sig.name}" in stopped.output, stopped.output


def _sizes(bootstrap: str, topics: list[str], wait_s: float = 60.0) -> dict[str, int]:
    """Records per topic; asked again while a just-created topic's partitions have no leader yet."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "sizes", "log_level": 0})
    deadline = time.monotonic() + wait_s
    try:
        while True:
            try:
                out = {}
                for topic in topics:
                    partitions = consumer.list_topics(topic, timeout=15).topics[topic].partitions
                    out[topic] = sum(
                        high - low
                        for low, high in (
                            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=15)
                            for p in partitions
                        )
                    )
                return out
            except KafkaException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    finally:
        consumer.close()


def _committed(bootstrap: str, group: str) -> int:
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    futures = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])
    result = futures[group].result(30)
    return sum(tp.offset for tp in result.topic_partitions if tp.offset >= 0)


def _stored_rows(home: Path, record_types: list[str]) -> int:
    tables = sorted({table_for(t).name for t in record_types})
    statement = "SELECT " + " + ".join(f"(SELECT count() FROM {t})" for t in tables)
    done = subprocess.run(
        [RANKSIGHT, "sql", "-f", "csv", statement],
        env={**_env("", home, ""), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return int(done.stdout.strip().splitlines()[-1])


# --- services --------------------------------------------------------------------------------


@pytest.mark.parametrize(("ignore_sigint", "sig"), VARIANTS)
def test_sink_flushes_and_commits_what_it_read(
    kafka_bootstrap: str, recorded: Recorded, tmp_path: Path, ignore_sigint: bool, sig: signal.Signals
) -> None:
    """Nothing is due before the signal (minute-long batches): the stop itself inserts and commits."""
    group = f"sink-{uuid.uuid4().hex[:6]}"
    stopped = _run_and_stop(
        tmp_path,
        ["sink", "--group", group, "--batch-interval", "600", "--batch-size", "1000000",
         "--progress-interval", "0.3"],
        _env(kafka_bootstrap, tmp_path / "home", recorded.prefix),
        rf"consumed {recorded.total:,}, inserted 0 rows",
        ignore_sigint,
        sig,
    )  # fmt: skip
    _service_stopped(stopped)
    assert f"sink stopped: inserted {recorded.total:,} rows" in stopped.output, stopped.output
    assert _committed(kafka_bootstrap, recorded.prefix + group) == recorded.total
    assert _stored_rows(tmp_path / "home", list(recorded.counts)) == recorded.total


@pytest.mark.parametrize(("ignore_sigint", "sig"), VARIANTS)
def test_serve_stops_its_sink_and_its_ui(
    kafka_bootstrap: str, recorded: Recorded, tmp_path: Path, ignore_sigint: bool, sig: signal.Signals
) -> None:
    group = f"serve-{uuid.uuid4().hex[:6]}"

    def some_committed(_: Running) -> None:
        deadline = time.monotonic() + 120
        while _committed(kafka_bootstrap, recorded.prefix + group) == 0:
            assert time.monotonic() < deadline, "serve committed nothing in 120 s"
            time.sleep(0.2)

    stopped = _run_and_stop(
        tmp_path,
        ["serve", "--port", "0", "--group", group, "--batch-interval", "0.2"],
        _env(kafka_bootstrap, tmp_path / "home", recorded.prefix),
        r"serve: sink .* UI on http://",
        ignore_sigint,
        sig,
        some_committed,
    )
    _service_stopped(stopped)
    committed = _committed(kafka_bootstrap, recorded.prefix + group)
    assert f"serve stopped: inserted {committed:,} rows" in stopped.output, stopped.output
    assert _stored_rows(tmp_path / "home", list(recorded.counts)) == committed


@pytest.mark.parametrize(("ignore_sigint", "sig"), VARIANTS)
def test_ui_stops(kafka_bootstrap: str, tmp_path: Path, ignore_sigint: bool, sig: signal.Signals) -> None:
    stopped = _run_and_stop(
        tmp_path,
        ["ui", "--port", "0"],
        _env(kafka_bootstrap, tmp_path / "home", ""),
        r"ranksight UI on http://",
        ignore_sigint,
        sig,
    )
    _service_stopped(stopped)


@pytest.mark.parametrize(("ignore_sigint", "sig"), VARIANTS)
def test_alerts_tail_stops(
    kafka_bootstrap: str, recorded: Recorded, tmp_path: Path, ignore_sigint: bool, sig: signal.Signals
) -> None:
    stopped = _run_and_stop(
        tmp_path,
        ["alerts", "tail"],
        _env(kafka_bootstrap, tmp_path / "home", recorded.prefix),
        r"following \S+rs\.alerts from now",
        ignore_sigint,
        sig,
    )
    _service_stopped(stopped)


@pytest.mark.parametrize(("ignore_sigint", "sig"), VARIANTS)
def test_alerts_forward_stops_and_reports(
    kafka_bootstrap: str,
    recorded: Recorded,
    alertmanager: str,
    tmp_path: Path,
    ignore_sigint: bool,
    sig: signal.Signals,
) -> None:
    stopped = _run_and_stop(
        tmp_path,
        ["alerts", "forward", "--alertmanager", alertmanager, "--group", f"fwd-{uuid.uuid4().hex[:6]}"],
        _env(kafka_bootstrap, tmp_path / "home", recorded.prefix),
        r"rebuilt: \d+ earlier alert records read",
        ignore_sigint,
        sig,
    )
    _service_stopped(stopped)
    assert "sent 0 alerts; 0 firing" in stopped.output, stopped.output


@pytest.mark.parametrize(("ignore_sigint", "sig"), VARIANTS)
def test_agent_delivers_every_sample_it_took(
    kafka_bootstrap: str, own_topics: str, tmp_path: Path, ignore_sigint: bool, sig: signal.Signals
) -> None:
    stopped = _run_and_stop(
        tmp_path,
        [
            "agent",
            "--simulate",
            "--gpus",
            "2",
            "--interval",
            "0.1",
            "--report-every",
            "1",
            "--no-attribution",
        ],
        _env(kafka_bootstrap, tmp_path / "home", own_topics),
        r"^3 intervals: ",
        ignore_sigint,
        sig,
    )
    _service_stopped(stopped)
    assert "not delivered" not in stopped.output, stopped.output
    found = re.search(r"sampled \d+ intervals: (\d+) GPU samples, (\d+) host samples", stopped.output)
    assert found is not None, stopped.output
    sizes = _sizes(kafka_bootstrap, [own_topics + TELEMETRY_GPU, own_topics + TELEMETRY_HOST])
    assert sizes == {own_topics + TELEMETRY_GPU: int(found[1]), own_topics + TELEMETRY_HOST: int(found[2])}


@pytest.mark.parametrize(("ignore_sigint", "sig"), VARIANTS)
@pytest.mark.parametrize("runtime", ["direct", "faust"])
def test_worker_stops(
    kafka_bootstrap: str,
    own_topics: str,
    tmp_path: Path,
    runtime: str,
    ignore_sigint: bool,
    sig: signal.Signals,
) -> None:
    stopped = _run_and_stop(
        tmp_path,
        ["worker", "--runtime", runtime, "--log-level", "info", "--group", f"w-{uuid.uuid4().hex[:6]}"],
        _env(kafka_bootstrap, tmp_path / "home", own_topics),
        r"assigned partitions|[Aa]ssigned.*partitions|Worker ready",
        ignore_sigint,
        sig,
    )
    _service_stopped(stopped)


# --- runs cut short: producers -----------------------------------------------------------------


def _published_count(output: str) -> int:
    found = re.search(
        r"stopped by SIG\w+ after ([\d,]+)(?: of [\d,]+)? events: .*published ([\d,]+) events", output
    )
    assert found is not None, output
    assert found[1] == found[2], output  # every event handed over was delivered (none spooled)
    return int(found[2].replace(",", ""))


@pytest.mark.parametrize(("ignore_sigint", "sig"), VARIANTS)
def test_evaluate_stops_its_worker_processes(
    tmp_path: Path, ignore_sigint: bool, sig: signal.Signals
) -> None:
    """A long evaluation (200 generated cases on 2 processes: minutes) stops at once, cases in flight
    too, and leaves none of its processes behind."""
    children: list[psutil.Process] = []

    def pool_started(running: Running) -> None:
        # Signalled once the pool's two processes exist (they take their first cases at once).
        parent = psutil.Process(running.proc.pid)
        deadline = time.monotonic() + 120
        while len(children) < 2:
            assert time.monotonic() < deadline, "the evaluation's 2 processes did not start"
            time.sleep(0.05)
            children[:] = parent.children(recursive=True)

    stopped = _run_and_stop(
        tmp_path,
        ["evaluate", "--generated", "200", "--workers", "2"],
        {},
        r"evaluating 200 generated cases",
        ignore_sigint,
        sig,
        pool_started,
    )
    _cut_short(stopped, sig)
    assert "nothing scored" in stopped.output and "overall recall" not in stopped.output
    _, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, f"left running: {[p.pid for p in alive]}"


@pytest.mark.parametrize(("ignore_sigint", "sig"), VARIANTS)
def test_simulate_to_kafka_flushes_what_it_published(
    kafka_bootstrap: str, own_topics: str, tmp_path: Path, ignore_sigint: bool, sig: signal.Signals
) -> None:
    stopped = _run_and_stop(
        tmp_path,
        ["simulate", "-s", "healthy", "--duration", "2m", "--to-kafka", "--speed", "1"],
        _env(kafka_bootstrap, tmp_path / "home", own_topics),
        r"publishing [\d,]+ events to \S+ at 1x",
        ignore_sigint,
        sig,
        lambda _: _wait_for_some(kafka_bootstrap, [own_topics + t for t in SOURCES]),
    )
    _cut_short(stopped, sig)
    sent = _published_count(stopped.output)
    assert sent > 0
    assert sum(_sizes(kafka_bootstrap, [own_topics + t for t in SOURCES]).values()) == sent


@pytest.mark.parametrize(("ignore_sigint", "sig"), VARIANTS)
@pytest.mark.parametrize("command", ["publish", "replay"])
def test_publish_and_replay_to_kafka_flush_what_they_published(
    kafka_bootstrap: str,
    recorded: Recorded,
    own_topics: str,
    tmp_path: Path,
    command: str,
    ignore_sigint: bool,
    sig: signal.Signals,
) -> None:
    args = [command, str(recorded.path), "--speed", "1"] + (["--to-kafka"] if command == "replay" else [])
    stopped = _run_and_stop(
        tmp_path,
        args,
        _env(kafka_bootstrap, tmp_path / "home", own_topics),
        r"publishing \S+ to \S+, paced at 1x",
        ignore_sigint,
        sig,
        lambda _: _wait_for_some(kafka_bootstrap, [own_topics + t for t in SOURCES]),
    )
    _cut_short(stopped, sig)
    sent = _published_count(stopped.output)
    assert 0 < sent < recorded.total
    assert sum(_sizes(kafka_bootstrap, [own_topics + t for t in SOURCES]).values()) == sent


def _wait_for_some(bootstrap: str, topics: list[str]) -> None:
    deadline = time.monotonic() + 120
    while sum(_sizes(bootstrap, topics).values()) == 0:
        assert time.monotonic() < deadline, "nothing published in 120 s"
        time.sleep(0.2)
