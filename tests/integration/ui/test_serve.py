"""`ranksight serve`: the sink and the UI in one process on one chDB store, fed through a real broker."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from producers.publisher import open_publisher
from producers.simulator import load_scenario, simulate

JOB = "pretrain-7b-0002"


def _lines(stream: object, into: queue.Queue[str]) -> None:
    for line in iter(stream.readline, ""):  # type: ignore[attr-defined]
        into.put(line)


def test_serve_stores_what_arrives_and_its_ui_shows_it(
    kafka_bootstrap: str, topics: dict[str, str], topic_prefix: str, tmp_path: Path
) -> None:
    """Events published to Kafka reach the UI of the same process; SIGTERM stops sink and UI cleanly."""
    scenario = load_scenario("straggler_gpu")
    scenario = scenario.with_overrides(duration=150, start_ms=(int(time.time()) // 60 - 5) * 60_000)
    events = list(simulate(scenario, 0).events())
    last_step = max(e.record["step"] for e in events if e.type == "StepCompleted")
    publisher = open_publisher(
        "kafka",
        kafka_conf={"bootstrap.servers": kafka_bootstrap},
        topic_prefix=topic_prefix,
        spool_dir=tmp_path / "spool",
    )
    for event in events:
        publisher.publish(event)
    assert publisher.flush(60) == 0
    publisher.close()

    env = {k: v for k, v in os.environ.items() if k != "CLICKHOUSE_URL"}
    env.update(
        KAFKA_BOOTSTRAP=kafka_bootstrap,
        RANKSIGHT_TOPIC_PREFIX=topic_prefix,
        RANKSIGHT_HOME=str(tmp_path / "home"),
    )
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ranksight.cli",
            "serve",
            "--port",
            "0",
            "--group",
            "serve-test",
            "--batch-interval",
            "0.2",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    errors: queue.Queue[str] = queue.Queue()
    threading.Thread(target=_lines, args=(process.stderr, errors), daemon=True).start()
    try:
        url = None
        deadline = time.monotonic() + 120
        while url is None and time.monotonic() < deadline:
            match = re.search(r"UI on (http://\S+/)", errors.get(timeout=120))
            url = match.group(1) if match else None
        assert url, "serve never said where its UI is"
        job = None
        with httpx.Client(timeout=30) as http:
            while time.monotonic() < deadline:  # progress: the job's last step as the UI reports it
                jobs = {j["job_id"]: j for j in http.get(f"{url}api/fleet").raise_for_status().json()["jobs"]}
                job = jobs.get(JOB)
                if job is not None and job["last_step"] == last_step:
                    break
                time.sleep(0.5)
            assert job is not None and job["last_step"] == last_step, job
            # The bindings come on another topic than the steps, in another sink batch: wait for them.
            page: dict[str, Any] = {}
            while time.monotonic() < deadline:
                page = http.get(f"{url}api/jobs/{JOB}").raise_for_status().json()
                if len(page["ranks"]) == 16:
                    break
                time.sleep(0.5)
            assert len(page["ranks"]) == 16 and page["heatmap"]["cells"][0], page.get("ranks")
        process.send_signal(signal.SIGTERM)
        out, _ = process.communicate(timeout=60)
        assert process.returncode == 0
        assert "serve stopped" in out
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
