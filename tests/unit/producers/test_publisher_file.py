"""Publisher destinations without a broker: the file destination, destination errors, and a Kafka
publisher whose broker is unreachable (it must not block, and must keep every event on disk)."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from producers.errors import DestinationError, PublisherClosedError
from producers.publisher import FilePublisher, KafkaPublisher, open_publisher
from producers.spool import Spool
from schemas.errors import EncodeError
from schemas.files import iter_container
from schemas.records import Event


def _host(n: int) -> Event:
    return Event(
        "HostSample",
        {
            "ts": 1_700_000_000_000 + n,
            "cluster": "c",
            "node": f"node-{n % 3}",
            "cpu_util_pct": float(n),
            "load1": None,
            "load5": None,
            "load15": None,
            "mem_used_bytes": None,
            "mem_available_bytes": None,
            "mem_total_bytes": None,
            "swap_used_bytes": None,
            "disk_read_bytes_s": None,
            "disk_write_bytes_s": None,
            "net_rx_bytes_s": None,
            "net_tx_bytes_s": None,
            "tcp_retrans_segs_s": None,
            "open_files": n,
            "oom_kills": None,
        },
    )


def test_file_destination_writes_every_event_in_order_on_close(tmp_path: Path) -> None:
    target = tmp_path / "out" / "events.avro"
    publisher = open_publisher(f"file://{target}")
    assert isinstance(publisher, FilePublisher)
    for n in range(1000):
        publisher.publish(_host(n))
    assert not target.exists(), "nothing appears at the path before close"
    assert publisher.flush() == 0
    publisher.close()
    assert [e.record["open_files"] for e in iter_container(target)] == list(range(1000))
    assert publisher.stats["published"] == 1000
    assert [p.name for p in target.parent.iterdir()] == ["events.avro"], "no temporary file left"


def test_file_destination_rejects_an_invalid_record_and_keeps_the_rest(tmp_path: Path) -> None:
    target = tmp_path / "events.avro"
    with open_publisher(f"file://{target}") as publisher:
        publisher.publish(_host(1))
        bad = _host(2)
        bad.record["node"] = None
        with pytest.raises(EncodeError):
            publisher.publish(bad)
        publisher.publish(_host(3))
    assert [e.record["open_files"] for e in iter_container(target)] == [1, 3]


def test_aborted_file_destination_leaves_nothing(tmp_path: Path) -> None:
    publisher = FilePublisher(tmp_path / "x.avro")
    publisher.publish(_host(1))
    publisher.abort()
    assert list(tmp_path.iterdir()) == []


def test_publish_after_close_is_a_clear_error(tmp_path: Path) -> None:
    publisher = open_publisher(f"file://{tmp_path}/x.avro")
    publisher.close()
    with pytest.raises(PublisherClosedError):
        publisher.publish(_host(1))


@pytest.mark.parametrize(
    ("destination", "conf", "message"),
    [
        ("kafka", None, "KAFKA_BOOTSTRAP"),
        ("s3://bucket", None, "unknown destination"),
        ("file://", None, "needs a path"),
        ("kafka", {"bootstrap.servers": "x:1", "linger.ms": "soon"}, "invalid Kafka producer settings"),
    ],
)
def test_bad_destinations_fail_with_one_actionable_sentence(
    destination: str, conf: dict | None, message: str, tmp_path: Path
) -> None:
    with pytest.raises(DestinationError, match=message):
        open_publisher(destination, kafka_conf=conf, spool_dir=tmp_path / "spool")


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_broker_never_blocks_publish_and_keeps_every_event_on_disk(tmp_path: Path) -> None:
    spool_dir = tmp_path / "spool"
    publisher = KafkaPublisher(
        {"bootstrap.servers": f"127.0.0.1:{_dead_port()}"},
        spool_dir=spool_dir,
        message_timeout_ms=2000,
        queue_max_messages=500,
    )
    latencies = []
    for n in range(3000):
        t0 = time.perf_counter()
        publisher.publish(_host(n))
        latencies.append(time.perf_counter() - t0)
        if n % 500 == 0:
            time.sleep(0.3)
    latencies.sort()
    # Blocking would mean seconds (message.timeout.ms); the slack is for a loaded shared CI machine.
    assert latencies[-1] < 0.5, f"publish blocked for {latencies[-1]:.3f}s"
    assert latencies[int(len(latencies) * 0.99)] < 0.01
    deadline = time.monotonic() + 20
    while publisher.stats["in_queue"] and time.monotonic() < deadline:
        time.sleep(0.1)  # queued messages time out (message.timeout.ms) and move to the spool
    stats = publisher.stats
    assert stats["outage"] is True
    assert stats["spooled"] > 0
    assert stats["delivered"] == 0
    assert publisher.flush(0.5) == 3000
    publisher.close(timeout=1)
    with Spool(spool_dir) as spool:
        kept = sorted(e.record["open_files"] for e in spool.pop_all())
    assert kept == list(range(3000)), "every event is on disk for the next run, once"
