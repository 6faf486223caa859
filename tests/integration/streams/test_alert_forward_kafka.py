"""`alerts forward` over a real broker and a real HTTP server standing in for Alertmanager: a
forwarder restarted mid-incident keeps firing alerts alive and never re-pages resolved ones."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from schemas.codec import Codec
from schemas.records import Event, default_schemas
from schemas.topics import ALERTS, ALERTS_REPLAY
from streams.alerting.alertmanager import AlertForwarder, AlertmanagerClient
from streams.alerting.delivery import DeliveryStats, forward_topic

CODEC = Codec()
T0 = 1_767_225_600_000


class Post:
    """One alert as Alertmanager received it, with the wall-clock time it arrived."""

    def __init__(self, alert: dict[str, Any], at: float) -> None:
        self.fingerprint = alert["labels"]["fingerprint"]
        self.alert = alert
        self.at = at

    @property
    def ends_at(self) -> float | None:
        end = self.alert.get("endsAt")
        return None if end is None else datetime.fromisoformat(end.replace("Z", "+00:00")).timestamp()

    @property
    def is_resolution(self) -> bool:
        """Alertmanager treats an alert whose endsAt has passed as resolved."""
        return self.ends_at is not None and self.ends_at <= self.at


class AlertmanagerStandIn:
    """A real HTTP server answering POST /api/v2/alerts and recording every alert it got."""

    def __init__(self) -> None:
        self.posts: list[Post] = []
        self.lock = threading.Condition()
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with recorder.lock:
                    recorder.posts.extend(Post(a, time.time()) for a in body)
                    recorder.lock.notify_all()
                self.send_response(200 if self.path == "/api/v2/alerts" else 404)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def wait_for(self, what: str, done: Callable[[list[Post]], bool], timeout: float = 60.0) -> None:
        """Block until `done(posts)` holds (progress, not time: the timeout only catches a hang)."""
        with self.lock:
            if not self.lock.wait_for(lambda: done(self.posts), timeout=timeout):
                raise AssertionError(
                    f"Alertmanager never got {what}; got {[p.fingerprint for p in self.posts]}"
                )

    def since(self, index: int) -> list[Post]:
        with self.lock:
            return list(self.posts[index:])


@pytest.fixture
def alertmanager() -> Iterator[AlertmanagerStandIn]:
    am = AlertmanagerStandIn()
    am.thread.start()
    try:
        yield am
    finally:
        am.server.shutdown()
        am.server.server_close()


def _alert(fingerprint: str, status: str, at_s: int = 0) -> Event:
    record: dict[str, Any] = {}
    for f in default_schemas().records["Alert"].json["fields"]:
        if "default" in f:
            record[f["name"]] = f["default"]
    record.update(
        alert_id=f"{fingerprint}@{T0}",
        fingerprint=fingerprint,
        rule=fingerprint.split("/")[0],
        category="platform",
        severity="critical",
        status=status,
        ts=T0 + at_s * 1000,
        starts_at=T0,
        ends_at=T0 + at_s * 1000 if status == "resolved" else None,
        team="llm-pretrain",
        receiver="default",
        summary=f"{fingerprint} {status}",
        job_id="job-1",
        run_id="job-1-r0",
        observed=1.23456,
        invariant="test invariant",
    )
    return Event("Alert", record)


def _publish(bootstrap: str, topic: str, events: list[Event]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "log_level": 0})
    for event in events:
        producer.produce(topic, key=b"llm-pretrain", value=CODEC.encode(event))
    assert producer.flush(30) == 0


class Forwarder:
    """One `alerts forward` process, in a thread: started, stopped like a restart."""

    def __init__(self, bootstrap: str, topic: str, group: str, url: str, ui_url: str = "") -> None:
        self.client = AlertmanagerClient(url)
        self.forwarder = AlertForwarder(self.client.post, resend_s=60, ui_url=ui_url)
        self.rebuilt = threading.Event()
        self._stop = threading.Event()
        self.stats: DeliveryStats | None = None
        self.errors: list[str] = []

        def run() -> None:
            try:
                self.stats = forward_topic(
                    {"bootstrap.servers": bootstrap},
                    topic,
                    group,
                    self.forwarder,
                    CODEC.decode,
                    stop=self._stop.is_set,
                    on_rebuilt=lambda stats: self.rebuilt.set(),
                    warn=self.errors.append,
                )
            except Exception as exc:
                self.errors.append(repr(exc))
                self.rebuilt.set()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert self.rebuilt.wait(60), "the forwarder never finished rebuilding its firing set"
        assert not self.errors

    def stop(self) -> DeliveryStats:
        self._stop.set()
        self.thread.join(60)
        self.client.close()
        assert self.stats is not None
        return self.stats


def _committed(bootstrap: str, topic: str, group: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "log_level": 0})
    try:
        return sum(
            max(0, tp.offset)
            for tp in consumer.committed([TopicPartition(topic, p) for p in range(3)], timeout=10)
        )
    finally:
        consumer.close()


def test_restart_mid_incident_keeps_firing_alerts_and_never_repages_resolved_ones(
    kafka_bootstrap: str, topics: dict[str, str], group_id: str, alertmanager: AlertmanagerStandIn
) -> None:
    topic = topics[ALERTS]
    # Before the first start: A and B fire, D fires and resolves. A new group starts live at the
    # end, after rebuilding: A and B are (re-)sent, D never is.
    _publish(
        kafka_bootstrap,
        topic,
        [
            _alert("job_stall/a", "firing"),
            _alert("straggler/b", "firing"),
            _alert("xid_error/d", "firing", 5),
            _alert("xid_error/d", "resolved", 9),
        ],
    )
    first = Forwarder(kafka_bootstrap, topic, group_id, alertmanager.url, ui_url="http://ui:8080")
    alertmanager.wait_for(
        "A and B", lambda posts: {"job_stall/a", "straggler/b"} <= {p.fingerprint for p in posts}
    )
    # Mid-incident: E fires while the first forwarder runs.
    _publish(kafka_bootstrap, topic, [_alert("host_memory_pressure/e", "firing", 20)])
    alertmanager.wait_for("E", lambda posts: any(p.fingerprint == "host_memory_pressure/e" for p in posts))
    first.stop()
    assert not first.errors
    committed_before_restart = _committed(kafka_bootstrap, topic, group_id)
    assert committed_before_restart == 5  # every record it handled is committed
    # The forwarder is down: B resolves, C fires.
    _publish(
        kafka_bootstrap, topic, [_alert("straggler/b", "resolved", 30), _alert("job_stall/c", "firing", 31)]
    )
    mark = len(alertmanager.since(0))
    second = Forwarder(kafka_bootstrap, topic, group_id, alertmanager.url)
    alertmanager.wait_for(
        "the restart's sends",
        lambda posts: (
            {"job_stall/a", "host_memory_pressure/e", "straggler/b", "job_stall/c"}
            <= {p.fingerprint for p in posts[mark:]}
        ),
    )
    stats = second.stop()
    assert stats.restored == 5 and stats.received == 2
    after = alertmanager.since(mark)
    by_fp: dict[str, list[Post]] = {}
    for post in after:
        by_fp.setdefault(post.fingerprint, []).append(post)
    # Still firing: re-sent at once with a fresh endsAt in the future, never resolved.
    for fp in ("job_stall/a", "host_memory_pressure/e", "job_stall/c"):
        assert by_fp[fp] and not any(p.is_resolution for p in by_fp[fp]), fp
    # B resolved while the forwarder was down: sent once, as a resolution.
    assert [p.is_resolution for p in by_fp["straggler/b"]] == [True]
    # D resolved before the first start: never paged by anyone.
    assert not any(p.fingerprint == "xid_error/d" for p in alertmanager.since(0))
    # Every post of a firing alert carries a keep-alive end no sooner than the next re-send.
    for post in alertmanager.since(0):
        if not post.is_resolution:
            assert post.ends_at is not None and post.ends_at - post.at > 60
    first_a = next(p for p in alertmanager.since(0) if p.fingerprint == "job_stall/a")
    assert first_a.alert["generatorURL"] == "http://ui:8080/alerts/job_stall/a@1767225600000"
    assert first_a.alert["labels"]["job"] == "job-1" and first_a.alert["annotations"]["observed"] == "1.23"
    assert _committed(kafka_bootstrap, topic, group_id) == 7
    # A third start re-sends only what still fires.
    mark = len(alertmanager.since(0))
    third = Forwarder(kafka_bootstrap, topic, group_id, alertmanager.url)
    alertmanager.wait_for("the re-sends", lambda posts: len(posts) - mark >= 3)
    third.stop()
    assert sorted(p.fingerprint for p in alertmanager.since(mark)) == [
        "host_memory_pressure/e",
        "job_stall/a",
        "job_stall/c",
    ]


def test_forwards_the_replay_topic_too(
    kafka_bootstrap: str, topics: dict[str, str], group_id: str, alertmanager: AlertmanagerStandIn
) -> None:
    """`--topic rs.alerts.replay`: alerts of a replay reach Alertmanager the same way."""
    forwarder = Forwarder(kafka_bootstrap, topics[ALERTS_REPLAY], group_id, alertmanager.url)
    _publish(kafka_bootstrap, topics[ALERTS_REPLAY], [_alert("nonfinite_loss/r", "firing")])
    alertmanager.wait_for(
        "the replayed alert", lambda posts: any(p.fingerprint == "nonfinite_loss/r" for p in posts)
    )
    forwarder.stop()


def test_the_cli_rebuilds_from_the_topic_and_resends_what_still_fires(
    kafka_bootstrap: str, topics: dict[str, str], topic_prefix: str, alertmanager: AlertmanagerStandIn
) -> None:
    """`ranksight alerts forward` as users run it: a fresh group re-sends the alert still firing."""
    import subprocess
    import sys
    from pathlib import Path

    _publish(
        kafka_bootstrap,
        topics[ALERTS],
        [
            _alert("job_stall/x", "firing"),
            _alert("xid_error/y", "firing"),
            _alert("xid_error/y", "resolved", 3),
        ],
    )
    env = {
        "KAFKA_BOOTSTRAP": kafka_bootstrap,
        "RANKSIGHT_TOPIC_PREFIX": topic_prefix,
        "RANKSIGHT_UI_URL": "http://ui.example",
        "PATH": str(Path(sys.executable).parent),
    }
    done = subprocess.run(
        [str(Path(sys.executable).parent / "ranksight"), "alerts", "forward", "--alertmanager", alertmanager.url,
         "--idle-exit", "2"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = " ".join(done.stdout.split())
    assert "rebuilt: 3 earlier alert records read, 1 firing" in out
    assert [p.fingerprint for p in alertmanager.since(0)] == ["job_stall/x"]
    assert (
        alertmanager.since(0)[0].alert["generatorURL"] == "http://ui.example/alerts/job_stall/x@1767225600000"
    )


def test_the_forwarder_serves_its_health_on_metrics(
    kafka_bootstrap: str, topics: dict[str, str], topic_prefix: str, alertmanager: AlertmanagerStandIn
) -> None:
    """`alerts forward --metrics-port`: firing alerts by rule after the rebuild, then a live alert counted."""
    import socket
    import subprocess
    import sys
    import urllib.request
    from pathlib import Path

    from prometheus_client.parser import text_string_to_metric_families

    _publish(kafka_bootstrap, topics[ALERTS], [_alert("job_stall/x", "firing"), _alert("xid_error/y", "firing"),
                                               _alert("xid_error/y", "resolved", 3)])  # fmt: skip
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    env = {
        "KAFKA_BOOTSTRAP": kafka_bootstrap,
        "RANKSIGHT_TOPIC_PREFIX": topic_prefix,
        "PATH": str(Path(sys.executable).parent),
    }
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "ranksight"), "alerts", "forward", "--alertmanager", alertmanager.url,
         "--metrics-port", str(port), "--idle-exit", "60"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip

    def scrape() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
                text = resp.read().decode()
        except OSError:
            return {}
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    def wait_for(done: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        deadline = time.monotonic() + 60
        seen: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        while time.monotonic() < deadline and proc.poll() is None:
            seen = scrape()
            if done(seen):
                break
            time.sleep(0.2)  # poll interval of the scrape
        return seen

    try:
        after_rebuild = wait_for(lambda m: ("ranksight_forward_alerts_firing", (("rule", "job_stall"),)) in m)
        assert after_rebuild.get(("ranksight_forward_alerts_firing", (("rule", "job_stall"),))) == 1, (
            after_rebuild
        )
        assert ("ranksight_forward_alerts_firing", (("rule", "xid_error"),)) not in after_rebuild
        _publish(kafka_bootstrap, topics[ALERTS], [_alert("xid_error/z", "firing", 5)])
        live = wait_for(lambda m: m.get(("ranksight_forward_alerts_in_total", ()), 0) >= 1)
        assert live[("ranksight_forward_alerts_in_total", ())] == 1, live
        assert live[("ranksight_forward_alerts_firing", (("rule", "xid_error"),))] == 1, live
    finally:
        proc.terminate()
        proc.wait(30)
