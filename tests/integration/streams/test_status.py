"""`ranksight status` against a real broker: lag per group and topic, dead letters, the alerts firing now."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition

from producers.simulator import load_scenario, simulate
from schemas.files import write_container
from schemas.topics import DEADLETTER, TRAINING_STEPS, key_for
from streams.offline.replay import replay_offline
from streams.status import firing_alerts
from tests.integration.streams.harness import RANKSIGHT, publish, recent
from tests.integration.streams.test_worker_bad_input import SCENARIO


def test_status_shows_group_lag_dead_letters_and_only_the_alerts_still_firing(
    kafka_bootstrap: str, topics: dict[str, str], topic_prefix: str, group_id: str, tmp_path: Path
) -> None:
    (tmp_path / "scenario.yaml").write_text(SCENARIO)
    events = list(simulate(recent(load_scenario(tmp_path / "scenario.yaml")), seed=0).events())
    write_container(tmp_path / "events.avro", events)
    alerts = [e for e in replay_offline([tmp_path / "events.avro"]) if e.type == "Alert"]
    firing = firing_alerts([a.record for a in alerts])
    resolved = {a.record["rule"] for a in alerts} - {r["rule"] for r in firing}
    assert firing and resolved, "the scenario should leave one alert firing and resolve another"
    steps = [e for e in events if e.type == "StepCompleted"][:40]
    publish(kafka_bootstrap, topic_prefix, steps + alerts)
    # A group that has read all but 7 records of one steps partition.
    key = key_for(TRAINING_STEPS, steps[0].record) or b""
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "partitioner": "murmur2_random"})
    producer.produce(topics[DEADLETTER], key=b"k", value=b"\x7fbad")
    producer.flush(30)
    reader = Consumer(
        {"bootstrap.servers": kafka_bootstrap, "group.id": group_id, "enable.auto.commit": False}
    )
    try:
        meta = reader.list_topics(topics[TRAINING_STEPS], timeout=10).topics[topics[TRAINING_STEPS]]
        ends = {
            p: reader.get_watermark_offsets(TopicPartition(topics[TRAINING_STEPS], p), timeout=10)[1]
            for p in meta.partitions
        }
        busy = max(ends, key=lambda p: ends[p])
        assert ends[busy] == len(steps), (ends, key)  # one job: every step on one partition
        reader.commit(
            offsets=[TopicPartition(topics[TRAINING_STEPS], busy, ends[busy] - 7)], asynchronous=False
        )
    finally:
        reader.close()

    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP": kafka_bootstrap,
        "RANKSIGHT_TOPIC_PREFIX": topic_prefix,
        "COLUMNS": "200",
    }
    run = subprocess.run(
        [RANKSIGHT, "status", "--interval", "0.2"], env=env, capture_output=True, text=True, timeout=120
    )
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    print(out)
    lines = out.splitlines()
    assert any(line.split() == [group_id, TRAINING_STEPS, "7"] for line in lines), out
    assert "dead letters: 1 kept in rs.deadletter" in out, out
    assert f"firing alerts: {len(firing)}" in out, out
    for r in firing:
        assert r["rule"] in out
    for rule in resolved:
        assert not any(rule in line for line in lines if line.startswith("  ")), out


def test_the_agent_serves_its_health_on_metrics(tmp_path: Path) -> None:
    """`ranksight agent --metrics-port`: samples per kind and the spool, while it runs (no broker needed)."""
    import socket
    import time
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    env = {**os.environ, "RANKSIGHT_HOME": str(tmp_path)}
    out = tmp_path / "agent.avro"
    proc = subprocess.Popen(
        [RANKSIGHT, "agent", "--simulate", "--gpus", "2", "--interval", "0.1", "--count", "600",
         "--to", f"file://{out}", "--metrics-port", str(port)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
                    text = resp.read().decode()
            except OSError:
                text = ""
            samples = {
                (s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(text)
                for s in family.samples
            }
            if samples.get(("ranksight_agent_samples_total", (("kind", "gpu"),)), 0) >= 4:
                break
            time.sleep(0.2)  # poll interval of the scrape
    finally:
        proc.terminate()
        proc.wait(30)
    gpu = samples.get(("ranksight_agent_samples_total", (("kind", "gpu"),)), 0)
    host = samples.get(("ranksight_agent_samples_total", (("kind", "host"),)), 0)
    assert gpu >= 4 and gpu == 2 * host, samples  # two GPUs and one host per interval
    assert samples[("ranksight_agent_kafka_outage", ())] == 0
