"""Filling a ClickHouse store without Kafka: events (a recording, a simulation) through the sink's writer.

The UI tests use it: the events, with the alerts and derived windows the detectors raise on them
(replayed by the CLI layer, `ranksight.commands.report.detected`; `ui/` runs no detector), are
written by the same `ClickHouseSink` the Kafka sink uses, so the tables and roll-ups are exactly
those of a live deployment.
"""

from __future__ import annotations

from collections.abc import Iterable

from clickhouse_connect.driver.client import Client

from schemas.records import Event
from sinks.writer import ClickHouseSink

__all__ = ["load_events"]

# Rows written here record this pseudo-topic as their Kafka position (they never were on Kafka).
FILE_TOPIC = "file"


def load_events(client: Client, events: Iterable[Event], *, batch_size: int = 20_000) -> int:
    """Write events to their tables in batches; returns how many were written."""
    sink = ClickHouseSink(client, batch_size=batch_size)
    # Offsets continue after what an earlier load stored, so a second load is not skipped as "already stored".
    offset = _highest_offset(client)
    written = 0
    for event in events:
        offset += 1
        if sink.add(FILE_TOPIC, 0, offset, event):
            written += 1
        if sink.is_full(FILE_TOPIC, 0):
            sink.flush(FILE_TOPIC, 0)
    sink.flush(FILE_TOPIC, 0)
    return written


def _highest_offset(client: Client) -> int:
    rows = client.query(
        "SELECT max(max_offset) FROM (SELECT max(_offset) AS max_offset FROM merge(currentDatabase(), "
        "'^(steps|gpu_samples|host_samples|alerts|derived_rank_windows|derived_job_windows|job_started)$') "
        "WHERE _topic = {t:String})",
        parameters={"t": FILE_TOPIC},
    ).result_rows
    return int(rows[0][0] or 0) if rows else 0
