"""A record from a node whose clock jumped to 2199, through Kafka and the real `ranksight worker`.

The worker checks event time against the record's Kafka timestamp capped at its own clock (a
producer's CreateTime comes from the same bad clock): the record is rejected and counted with the
reason (the sink, which stores the raw record, dead-letters it: tests/integration/sinks), nothing
reaches the dead-letter topic from the worker, `clock_skew` fires, and every other alert is the
offline replay's.
"""

from __future__ import annotations

import socket
import time
import urllib.request
from pathlib import Path
from typing import Any

from producers.simulator import load_scenario, simulate
from schemas.codec import Codec
from schemas.files import write_container
from schemas.records import Event
from schemas.topics import ALERTS, DEADLETTER, TRAINING_STEPS
from streams.offline.replay import replay_offline
from streams.runtime.options import DEFAULT_APP_ID, DEFAULT_RUNTIME, SOURCE_TOPICS
from tests.integration.streams.harness import Worker, group_lag, publish, recent
from tests.integration.streams.test_worker_bad_input import (
    RUN_LIMIT_S,
    SCENARIO,
    _headers,
    _read_all,
    _supervise,
)

YEAR_2199_MS = 7_226_582_400_000  # 2199-01-01T00:00:00Z, inside the sink's 2000..2200 range


def test_a_record_from_2199_is_rejected_by_the_worker_and_raises_clock_skew(
    kafka_bootstrap: str, topics: dict[str, str], topic_prefix: str, tmp_path: Path
) -> None:
    (tmp_path / "scenario.yaml").write_text(SCENARIO)
    events = list(simulate(recent(load_scenario(tmp_path / "scenario.yaml")), seed=0).events())
    write_container(tmp_path / "events.avro", events)
    expected = {
        (e.record["fingerprint"], e.record["status"])
        for e in replay_offline([tmp_path / "events.avro"])
        if e.type == "Alert"
    }
    assert any(fp.startswith("xid_error/node-02/") for fp, _ in expected), expected
    # A sample of the GPU that raises the XID later: had the worker taken its 2199 time as the GPU's
    # newest, every later sample of that GPU (the XID among them) would look re-forwarded.
    at = next(
        i
        for i, e in enumerate(events)
        if e.type == "GpuSample"
        and e.record["node"] == "node-02"
        and e.record["gpu_index"] == 2
        and e.record["ts"] > events[0].record["ts"] + 120_000
    )
    future = Event("GpuSample", {**events[at].record, "ts": YEAR_2199_MS})
    publish(kafka_bootstrap, topic_prefix, [*events[: at + 1], future, *events[at + 1 :]])

    worker = Worker(kafka_bootstrap, topic_prefix, tmp_path, DEFAULT_RUNTIME)
    port = _free_port()
    worker.start("--metrics-port", str(port))
    try:
        group = topic_prefix + DEFAULT_APP_ID
        deadline = time.monotonic() + RUN_LIMIT_S
        lag = -1
        while time.monotonic() < deadline and _supervise(worker):
            lag = group_lag(kafka_bootstrap, group, [topics[t] for t in SOURCE_TOPICS])
            if lag == 0:
                break
            time.sleep(1)  # poll interval of the progress check, not a wait for the worker
        assert lag == 0, worker.log()
        # The job stage raises its alerts from what the rank stage sent on: read until they are in.
        alerts: list[dict[str, Any]] = []
        while time.monotonic() < deadline and _supervise(worker):
            alerts = [Codec().decode(m.value()).record for m in _read_all(kafka_bootstrap, topics[ALERTS])]
            if expected <= {(a["fingerprint"], a["status"]) for a in alerts}:
                break
            time.sleep(1)  # poll interval of the alerts check
        letters = _read_all(kafka_bootstrap, topics[DEADLETTER])
        steps = sum(e.type == "StepCompleted" for e in events)
        # /metrics is refreshed every 2 s: read it until it shows every step (progress, not time).
        metrics: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        while time.monotonic() < deadline:
            metrics = _scrape(port)
            if metrics.get(
                ("ranksight_worker_events_in_total", (("topic", TRAINING_STEPS),)), 0
            ) >= steps and metrics.get(("ranksight_worker_events_out_total", (("topic", ALERTS),)), 0) >= len(
                alerts
            ):
                break
            time.sleep(0.5)  # poll interval of the scrape
    finally:
        worker.stop()
    log = worker.log()
    assert "Traceback" not in log, log
    pairs = {(a["fingerprint"], a["status"]) for a in alerts}
    assert {p for p in pairs if not p[0].startswith("clock_skew")} == expected, log
    skew = [a for a in alerts if a["rule"] == "clock_skew" and a["status"] == "firing"]
    assert skew, pairs
    assert {a["node"] for a in skew} == {"node-02"}
    # The raw record is the sink's to dead-letter (no sink runs here): nothing from the worker.
    assert [_headers(m)["x-component"] for m in letters] == []
    # The pipeline's own health on /metrics: the rejection by reason, what was read, what fires.
    assert metrics[("ranksight_worker_time_rejected_total", (("reason", "clock_ahead"),))] >= 1, metrics
    assert metrics[("ranksight_worker_events_in_total", (("topic", TRAINING_STEPS),))] >= steps
    assert metrics[("ranksight_worker_events_out_total", (("topic", ALERTS),))] >= len(alerts)
    assert metrics[("ranksight_worker_alerts_firing", (("rule", "xid_error"),))] == 1  # never resolves
    assert metrics[("ranksight_worker_consumer_lag", (("topic", TRAINING_STEPS),))] == 0
    assert ("ranksight_worker_watermark_delay_seconds", ()) in metrics


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the worker's /metrics, by name and labels (empty while it is not up yet)."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
    except OSError:
        return {}
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
