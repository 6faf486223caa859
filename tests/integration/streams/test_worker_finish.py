"""A finite input finishes (issue 37.3): a recording published with `ranksight replay --to-kafka` and
read by 1 or 2 `ranksight worker` processes ends with the group's committed offsets at the end of
every source topic and the alerts of `replay --offline`, its last ones included.

The recording: one big job (1,024 ranks, 10 s; bench_engine_ranks's) next to the `xid_error` scenario
cut at 65 % of its run, right after the XID's GPU recovers: the resolution of `xid_error` is judged on
event time the input never goes past (the offline replay's end raises it), so a worker that holds its
last seconds of event time never sends it. Waits on progress (alerts read, committed offsets).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.errors import KafkaSetupError
from infra.kafka.topics import delete_topics
from producers.simulator import load_scenario, simulate
from schemas.eventtime import event_ts
from schemas.files import write_container
from schemas.records import Event
from schemas.topics import ALERTS
from streams.offline.replay import replay_offline
from streams.runtime.options import DEFAULT_APP_ID, SOURCE_TOPICS
from tests.integration.streams.harness import RANKSIGHT, AlertReader, Worker, group_lag, pairs, recent

_BENCH = Path(__file__).resolve().parents[3] / "bench"


def _big_job(end_ms: int) -> list[Event]:
    """bench_engine_ranks's job of 1,024 ranks over 10 s of event time, ending at `end_ms`."""
    import random

    sys.path.insert(0, str(_BENCH))
    try:
        import bench_engine_ranks as giant
    finally:
        sys.path.remove(str(_BENCH))
    ranks, seconds = 1024, 10
    rng = random.Random(ranks)
    events = giant._start(ranks)
    for second in range(1, seconds + 1):
        for batch in giant._second(ranks, second, seconds, rng):
            events += batch
    shift = end_ms - seconds * 1000 - giant.T0
    return [Event(e.type, {**e.record, "ts": e.record["ts"] + shift}) for e in events]


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, set[tuple[str, str]]]:
    """The recording's file and the alerts `replay --offline` raises from it."""
    xid = sorted(simulate(recent(load_scenario("xid_error")), seed=0).events(), key=event_ts)
    cut = event_ts(xid[0]) + int(0.65 * (event_ts(xid[-1]) - event_ts(xid[0])))
    xid = [e for e in xid if event_ts(e) <= cut]
    events = sorted([*xid, *_big_job(cut - 60_000)], key=event_ts)
    path = tmp_path_factory.mktemp("finish") / "recording.avro"
    write_container(path, events)
    offline = [e.record for e in replay_offline([path]) if e.type == "Alert"]
    expected = pairs(offline)
    # The recording is what it claims: its last alert needs the end of the input.
    assert ("firing" in {s for _, s in expected}) and any(
        fp.startswith("xid_error/") and status == "resolved" for fp, status in expected
    ), expected
    return path, expected


@pytest.fixture
def workers(
    kafka_bootstrap: str, topic_prefix: str, topics: dict[str, str], tmp_path: Path
) -> Iterator[list[Worker]]:
    homes = [tmp_path / d for d in ("a", "b")]
    for home in homes:
        home.mkdir()
    pair = [Worker(kafka_bootstrap, topic_prefix, home) for home in homes]
    try:
        yield pair
    finally:
        for w in pair:
            w.stop()
        group = f"{topic_prefix}{DEFAULT_APP_ID}"
        with contextlib.suppress(KafkaSetupError):
            delete_topics(
                kafka_bootstrap,
                [
                    f"{topic_prefix}{t}"
                    for t in (
                        "rs.internal.bindings",
                        "rs.internal.telemetry-by-job",
                        "rs.internal.jobs",
                        "rs.internal.summaries",
                    )
                ]
                + [f"{group}-engine-snapshot-changelog", f"{group}-node-routes-changelog"],
            )


def _replay_to_kafka(path: Path, bootstrap: str, prefix: str) -> None:
    env = {**os.environ, "KAFKA_BOOTSTRAP": bootstrap, "RANKSIGHT_TOPIC_PREFIX": prefix}
    done = subprocess.run(
        [RANKSIGHT, "replay", str(path), "--to-kafka", "--speed", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("count", [1, 2])
def test_a_replayed_recording_ends_at_lag_0_with_the_offline_alerts_including_the_last(
    kafka_bootstrap: str,
    topics: dict[str, str],
    topic_prefix: str,
    workers: list[Worker],
    recording: tuple[Path, set[tuple[str, str]]],
    count: int,
) -> None:
    path, expected = recording
    _replay_to_kafka(path, kafka_bootstrap, topic_prefix)
    for w in workers[:count]:
        w.start("--finish-idle", "2")
    reader = AlertReader(kafka_bootstrap, topics[ALERTS])
    group = topic_prefix + DEFAULT_APP_ID
    sources = [topics[t] for t in SOURCE_TOPICS]
    logs = lambda: "\n".join(w.log() for w in workers[:count])  # noqa: E731 - for assertion messages
    try:
        assert reader.poll_until(lambda rs: pairs(rs) >= expected, 240), (
            expected - pairs(reader.records),
            logs(),
        )
        # Committed offsets at the end of every source topic (progress, not time).
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and group_lag(kafka_bootstrap, group, sources) != 0:
            time.sleep(0.5)  # poll interval of the progress check
        assert group_lag(kafka_bootstrap, group, sources) == 0, logs()
        reader.poll_until(lambda rs: False, 3)  # anything else in flight
    finally:
        reader.close()
    assert pairs(reader.records) == expected, logs()
    text = logs()
    assert "Traceback" not in text, text
