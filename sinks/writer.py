"""Batching ClickHouse writer: the `add` / `flush` / `write(batch)` sink contract, per topic-partition.

A batch holds the rows of one topic-partition, column-oriented per table. `flush` writes it with
one insert per table carrying `insert_deduplication_token = "{topic}:{partition}:{first}-{last}"`,
so a retried batch is stored once, and clears it in `finally` whatever happened. A crash between
insert and offset commit can make the next run cut the same offsets into different batches (a
different token); for that case every row stores its Kafka position and `add` skips offsets a
table already holds for that topic-partition.

Rows older than a table's TTL are dropped by ClickHouse on insert. The writer reads each table's
TTL from the store once, counts such rows as `expired` (not `rows_by_table`, which counts rows
that stay stored) and logs one warning per table, so nobody is told rows were stored that are not.
"""

from __future__ import annotations

import logging
import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import ClickHouseError as _DriverError
from clickhouse_connect.driver.exceptions import OperationalError

from schemas.records import Event
from sinks.ddl import table_specs
from sinks.errors import SinkBackpressureError, SinkWriteError
from sinks.rows import event_row

__all__ = ["ClickHouseSink", "SinkBatch", "SinkStats", "dedup_token"]

# ClickHouse error codes that mean "not now" rather than "never": too many parts, memory, timeouts,
# network, read-only replica, too many queries, keeper, unknown insert status.
_TRANSIENT_CODES = frozenset({3, 159, 164, 202, 209, 210, 236, 241, 242, 252, 319, 394, 425, 999})
_CODE_RE = re.compile(r"Code: (\d+)")
_TTL_DAYS_RE = re.compile(r"TTL .*toIntervalDay\((\d+)\)")
_DAY_MS = 86_400_000

log = logging.getLogger(__name__)


def dedup_token(topic: str, partition: int, first_offset: int, last_offset: int) -> str:
    """The insert deduplication token of a batch: topic, partition and its offset range."""
    return f"{topic}:{partition}:{first_offset}-{last_offset}"


@dataclass
class SinkBatch:
    """The pending rows of one topic-partition: per table, one list per column."""

    topic: str
    partition: int
    created_at: float
    first_offset: int = -1
    last_offset: int = -1
    messages: int = 0
    rows: int = 0
    tables: dict[str, list[list[Any]]] = field(default_factory=dict)
    # Per table, the highest offset of this partition it already stores (looked up once a batch).
    stored: dict[str, int] = field(default_factory=dict)

    @property
    def token(self) -> str:
        """The deduplication token of this batch."""
        return dedup_token(self.topic, self.partition, self.first_offset, self.last_offset)

    def note(self, offset: int) -> None:
        """Count a message of this partition into the batch's offset range."""
        if self.first_offset < 0:
            self.first_offset = offset
        self.last_offset = offset
        self.messages += 1


@dataclass
class SinkStats:
    """What the writer did so far."""

    rows_by_table: Counter[str] = field(default_factory=Counter)
    expired_by_table: Counter[str] = field(default_factory=Counter)
    batches: int = 0
    inserts: int = 0
    insert_s: float = 0.0
    skipped_stored: int = 0


class ClickHouseSink:
    """Batches events per topic-partition and writes them to their tables with column-oriented inserts."""

    def __init__(
        self,
        client: Client,
        *,
        batch_size: int = 5000,
        batch_interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        insert_settings: dict[str, Any] | None = None,
        backpressure_s: float = 1.0,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        self.client = client
        self.batch_size = batch_size
        self.batch_interval_s = batch_interval_s
        self.backpressure_s = backpressure_s
        self.stats = SinkStats()
        self._clock = clock
        self._wall_clock = wall_clock
        self._ttl_ms: dict[str, int | None] = {}  # table -> its TTL in ms, read from the store once
        self._insert_settings = dict(insert_settings or {})
        self._batches: dict[tuple[str, int], SinkBatch] = {}
        self._stored: dict[
            tuple[str, str, int], int
        ] = {}  # (table, topic, partition) -> highest stored offset

    # --- the sink contract -------------------------------------------------------------------------

    def add(self, topic: str, partition: int, offset: int, event: Event) -> bool:
        """Add one event; False when its table already stores this offset. Raises `InvalidRecordError`."""
        spec, row = event_row(event)
        # This runs for every record: one batch lookup, the offset noted inline (`SinkBatch.note`).
        batch = self._batches.get((topic, partition))
        if batch is None:
            batch = self._batch(topic, partition)
        table = spec.name
        stored = batch.stored.get(table)
        if stored is None:
            stored = batch.stored[table] = self._high_water(table, topic, partition)
        if batch.first_offset < 0:
            batch.first_offset = offset
        batch.last_offset = offset
        batch.messages += 1
        if offset <= stored:
            self.stats.skipped_stored += 1
            return False
        columns = batch.tables.get(table)
        if columns is None:
            columns = batch.tables[table] = [[] for _ in spec.column_names]
        for column, value in zip(columns, row, strict=False):
            column.append(value)
        columns[-3].append(topic)
        columns[-2].append(partition)
        columns[-1].append(offset)
        batch.rows += 1
        return True

    def skip(self, topic: str, partition: int, offset: int) -> None:
        """Count a message that is not stored (dead-lettered) into its partition's batch."""
        self._batch(topic, partition).note(offset)

    def flush(self, topic: str, partition: int) -> SinkBatch | None:
        """Write the batch of a topic-partition and drop it, written or not; None when there is none."""
        batch = self._batches.get((topic, partition))
        if batch is None:
            return None
        try:
            self.write(batch)
        finally:
            self._batches.pop((topic, partition), None)
        return batch

    def write(self, batch: SinkBatch) -> None:
        """Insert a batch, one deduplicated column-oriented insert per table."""
        specs = {spec.name: spec for spec in table_specs().values()}
        token = batch.token
        for table, columns in batch.tables.items():
            started = time.perf_counter()
            try:
                self.client.insert(
                    table,
                    data=columns,
                    column_names=list(specs[table].column_names),
                    column_oriented=True,
                    settings={**self._insert_settings, "insert_deduplication_token": token},
                )
            except _DriverError as exc:
                raise self._insert_error(exc, table, batch) from exc
            finally:
                self.stats.insert_s += time.perf_counter() - started
            self._stored[(table, batch.topic, batch.partition)] = columns[-1][-1]
            expired = self._expired(table, specs[table].column_names.index(specs[table].time_column), columns)
            self.stats.rows_by_table[table] += len(columns[-1]) - expired
            self.stats.inserts += 1
        self.stats.batches += 1

    # --- batching policy ---------------------------------------------------------------------------

    def batch(self, topic: str, partition: int) -> SinkBatch | None:
        """The pending batch of a topic-partition, if any."""
        return self._batches.get((topic, partition))

    def pending(self) -> list[tuple[str, int]]:
        """Topic-partitions with a pending batch."""
        return list(self._batches)

    def is_full(self, topic: str, partition: int) -> bool:
        """True when the partition's batch holds `batch_size` messages."""
        batch = self._batches.get((topic, partition))
        return batch is not None and batch.messages >= self.batch_size

    def ready(self) -> list[tuple[str, int]]:
        """Topic-partitions whose batch is full or older than `batch_interval_s`."""
        now = self._clock()
        return [
            tp
            for tp, batch in self._batches.items()
            if batch.messages >= self.batch_size or now - batch.created_at >= self.batch_interval_s
        ]

    def drop(self, topic: str, partition: int) -> SinkBatch | None:
        """Discard the pending batch of a topic-partition (its offsets will be read again)."""
        return self._batches.pop((topic, partition), None)

    def forget(self, topic: str, partition: int) -> None:
        """Drop a partition's batch and what is known of its stored offsets (after losing the partition)."""
        self._batches.pop((topic, partition), None)
        for key in [k for k in self._stored if k[1] == topic and k[2] == partition]:
            del self._stored[key]

    # --- internals ---------------------------------------------------------------------------------

    def _expired(self, table: str, time_index: int, columns: list[list[Any]]) -> int:
        """Rows of an inserted batch that the table's TTL drops on insert (counted, warned once per table)."""
        ttl_ms = self._table_ttl_ms(table)
        if ttl_ms is None:
            return 0
        cutoff = int(self._wall_clock() * 1000) - ttl_ms
        times = columns[time_index]
        expired = sum(1 for ts in times if ts < cutoff)
        if expired:
            if not self.stats.expired_by_table[table]:
                log.warning(
                    "%s: %d of %d rows are older than the table's %d-day TTL and were dropped by "
                    "ClickHouse on insert (oldest %s); further drops are counted, not logged",
                    table,
                    expired,
                    len(times),
                    ttl_ms // _DAY_MS,
                    time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(min(times) / 1000)),
                )
            self.stats.expired_by_table[table] += expired
        return expired

    def _table_ttl_ms(self, table: str) -> int | None:
        if table not in self._ttl_ms:
            try:
                rows = self.client.query(
                    "SELECT engine_full FROM system.tables WHERE database = currentDatabase() AND name = %(t)s",
                    parameters={"t": table},
                ).result_rows
            except _DriverError:
                rows = []
            match = _TTL_DAYS_RE.search(str(rows[0][0])) if rows else None
            self._ttl_ms[table] = int(match.group(1)) * _DAY_MS if match else None
        return self._ttl_ms[table]

    def _batch(self, topic: str, partition: int) -> SinkBatch:
        batch = self._batches.get((topic, partition))
        if batch is None:
            batch = self._batches[(topic, partition)] = SinkBatch(topic, partition, self._clock())
        return batch

    def _high_water(self, table: str, topic: str, partition: int) -> int:
        key = (table, topic, partition)
        stored = self._stored.get(key)
        if stored is None:
            try:
                count, highest = self.client.query(
                    f"SELECT count(), max(_offset) FROM {table} WHERE _topic = %(topic)s AND _partition = %(partition)s",
                    parameters={"topic": topic, "partition": partition},
                ).result_rows[0]
            except _DriverError as exc:
                raise self._insert_error(exc, table, None, topic, partition) from exc
            stored = self._stored[key] = int(highest) if count else -1
        return stored

    def _insert_error(
        self,
        exc: _DriverError,
        table: str,
        batch: SinkBatch | None,
        topic: str = "",
        partition: int = -1,
    ) -> SinkBackpressureError | SinkWriteError:
        topic = batch.topic if batch is not None else topic
        partition = batch.partition if batch is not None else partition
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        match = _CODE_RE.search(str(exc))
        code = int(match.group(1)) if match else None
        if isinstance(exc, OperationalError) or code in _TRANSIENT_CODES:
            # Too many parts means merges are behind: give them longer than a network blip.
            retry_after = self.backpressure_s * (5 if code == 252 else 1)
            return SinkBackpressureError(retry_after, topic, partition, reason)
        return SinkWriteError(table, topic, partition, reason)
