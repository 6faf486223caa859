"""A bounded, ordered disk spool of events: Avro container segments, oldest dropped only past the bound.

Events are appended to the open segment (`seg-<seq>.open.avro`, an Avro Object Container File of
`ranksight.v1.Event`, readable by `ranksight events dump`); a segment is sealed
(`seg-<seq>.n<count>.avro`) when it reaches `segment_bytes` or when a drainer asks for it.
Segments are drained oldest first, events in file order. When the total size passes
`max_bytes` the oldest sealed segments are deleted and their events counted in `dropped`.
A spool survives a restart: sealed and open segments left on disk are drained by the next
process that opens the directory (an open segment cut short by a crash yields the events of
its complete blocks). One process at a time: the directory is locked with `flock`.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import fastavro
from fastavro.write import Writer

from producers.errors import SpoolError, SpoolLockedError
from schemas.records import NAMESPACE, Event, SchemaSet, default_schemas

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_SEGMENT_BYTES",
    "Segment",
    "Spool",
    "SpoolInfo",
    "list_spools",
    "spool_info",
]

log = logging.getLogger(__name__)

DEFAULT_MAX_BYTES = 256 * 1024 * 1024
DEFAULT_SEGMENT_BYTES = 8 * 1024 * 1024
# Blocks are written to the file at this size; it is also how far the size accounting may lag.
_SYNC_INTERVAL = 16 * 1024
_MIN_SEGMENT_BYTES = 64 * 1024
_NAME = re.compile(r"^seg-(\d{12})\.(open|n(\d+))\.avro$")


@dataclass
class Segment:
    """A sealed segment file: its sequence number, path and number of events."""

    seq: int
    path: Path
    count: int
    size: int

    def events(self) -> list[Event]:
        """Every readable event of the segment, in order (a torn last block is skipped)."""
        return list(_read_events(self.path))


def _read_events(path: Path) -> Iterator[Event]:
    try:
        with open(path, "rb") as fh:
            for row in fastavro.reader(fh, return_record_name=True):
                name, record = row["event"]  # type: ignore[index,call-overload,str-unpack]
                yield Event(name.rsplit(".", 1)[-1], record)  # type: ignore[arg-type]
    except (ValueError, EOFError, StopIteration, OSError) as exc:
        # A crash can cut the last block of an open segment short; what came before is good.
        log.warning("spool segment %s ends early (%s); keeping the events before that point", path, exc)


class Spool:
    """Ordered, size-bounded disk buffer of events, shared by a publisher and its drain thread."""

    def __init__(
        self,
        directory: str | Path,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        schemas: SchemaSet | None = None,
    ) -> None:
        if max_bytes <= 0:
            raise SpoolError(f"spool max_bytes must be positive, got {max_bytes}")
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        # At least four segments fit under the bound, so dropping one never drops most of the spool;
        # and a segment is well above its ~28 KiB header (the Event schema is written into each file).
        self.segment_bytes = max(_MIN_SEGMENT_BYTES, min(segment_bytes, max_bytes // 4))
        if self.max_bytes < 4 * _MIN_SEGMENT_BYTES:
            raise SpoolError(
                f"spool max_bytes must be at least {4 * _MIN_SEGMENT_BYTES} bytes, got {max_bytes}"
            )
        self._schema = (schemas or default_schemas()).event_parsed
        self._lock = threading.RLock()
        self.dropped = 0
        self.appended = 0
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._lock_fh: IO[bytes] | None = open(self.directory / ".lock", "ab")  # noqa: SIM115
        except OSError as exc:
            raise SpoolError(f"cannot use spool directory {self.directory}: {exc.strerror}") from exc
        try:
            fcntl.flock(self._lock_fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock_fh.close()
            raise SpoolLockedError(str(self.directory)) from None
        self._sealed: list[Segment] = self._recover()
        self._next_seq = (self._sealed[-1].seq + 1) if self._sealed else 1
        self._open_fh: IO[bytes] | None = None
        self._writer: Writer | None = None
        self._open_seq = 0
        self._open_path: Path | None = None
        self._open_count = 0
        self._open_size = 0
        if self._sealed:
            log.info("spool %s holds %d events from an earlier run", self.directory, len(self))

    def _recover(self) -> list[Segment]:
        found: list[Segment] = []
        for path in sorted(self.directory.iterdir()):
            match = _NAME.match(path.name)
            if match is None:
                continue
            seq = int(match.group(1))
            if match.group(2) == "open":
                # Left open by a process that died: re-seal it under its real event count.
                count = sum(1 for _ in _read_events(path))
                sealed = path.with_name(f"seg-{seq:012d}.n{count}.avro")
                os.replace(path, sealed)
                path = sealed
            else:
                count = int(match.group(3))
            found.append(Segment(seq, path, count, path.stat().st_size))
        return found

    def __len__(self) -> int:
        """Events waiting in the spool (sealed and open segments)."""
        with self._lock:
            return sum(s.count for s in self._sealed) + self._open_count

    @property
    def size_bytes(self) -> int:
        """Bytes on disk, including the buffered part of the open segment."""
        with self._lock:
            return sum(s.size for s in self._sealed) + self._open_size

    def append(self, event: Event) -> None:
        """Add one event at the end; drops the oldest sealed segments if the bound is passed."""
        with self._lock:
            if self._writer is None:
                self._open_segment()
            assert self._writer is not None and self._open_fh is not None
            try:
                self._writer.write({"event": (f"{NAMESPACE}.{event.type}", event.record)})
            except OSError as exc:
                raise SpoolError(f"cannot write to the spool {self.directory}: {exc.strerror}") from exc
            self._open_count += 1
            self.appended += 1
            # The file so far plus the block still buffered in the writer.
            self._open_size = self._open_fh.tell() + self._writer.io.tell()  # type: ignore[attr-defined]
            if self._open_size >= self.segment_bytes:
                self._seal()
            self._enforce_bound()

    def _open_segment(self) -> None:
        self._open_seq = self._next_seq
        self._next_seq += 1
        self._open_path = self.directory / f"seg-{self._open_seq:012d}.open.avro"
        try:
            self._open_fh = open(self._open_path, "wb")  # noqa: SIM115
        except OSError as exc:
            raise SpoolError(f"cannot create a spool segment in {self.directory}: {exc.strerror}") from exc
        self._writer = Writer(self._open_fh, self._schema, codec="deflate", sync_interval=_SYNC_INTERVAL)
        self._open_count = 0
        self._open_size = 0

    def _seal(self, durable: bool = False) -> None:
        if self._writer is None or self._open_fh is None or self._open_path is None:
            return
        self._writer.flush()
        self._open_fh.flush()
        if durable:
            # Only on close: an fsync on the publish path could stall the caller on a busy disk.
            os.fsync(self._open_fh.fileno())
        self._open_fh.close()
        sealed = self._open_path.with_name(f"seg-{self._open_seq:012d}.n{self._open_count}.avro")
        if self._open_count:
            os.replace(self._open_path, sealed)
            self._sealed.append(Segment(self._open_seq, sealed, self._open_count, sealed.stat().st_size))
        else:
            self._open_path.unlink(missing_ok=True)
        self._writer = None
        self._open_fh = None
        self._open_path = None
        self._open_count = 0
        self._open_size = 0

    def _enforce_bound(self) -> None:
        while self._sealed and self.size_bytes > self.max_bytes:
            oldest = self._sealed.pop(0)
            oldest.path.unlink(missing_ok=True)
            self.dropped += oldest.count
            log.warning(
                "spool %s is over its bound of %d bytes: dropped its oldest %d events (%d dropped so far)",
                self.directory,
                self.max_bytes,
                oldest.count,
                self.dropped,
            )

    def sync(self) -> None:
        """Write buffered events of the open segment to the file (called periodically)."""
        with self._lock:
            if self._writer is not None and self._open_fh is not None:
                self._writer.flush()
                self._open_fh.flush()
                self._open_size = self._open_fh.tell()

    def oldest(self) -> Segment | None:
        """The oldest segment to drain, sealing the open one if nothing else is left; None when empty."""
        with self._lock:
            if not self._sealed and self._open_count:
                self._seal()
            return self._sealed[0] if self._sealed else None

    def remove(self, segment: Segment) -> None:
        """Forget a drained segment and delete its file."""
        with self._lock:
            if segment in self._sealed:
                self._sealed.remove(segment)
            segment.path.unlink(missing_ok=True)

    def pop_all(self) -> list[Event]:
        """Every event in order, emptying the spool (for tests and tools)."""
        out: list[Event] = []
        while (segment := self.oldest()) is not None:
            out.extend(segment.events())
            self.remove(segment)
        return out

    def close(self) -> None:
        """Seal the open segment and release the directory; events stay on disk for the next run."""
        with self._lock:
            self._seal(durable=True)
            if self._lock_fh is not None:
                fcntl.flock(self._lock_fh.fileno(), fcntl.LOCK_UN)
                self._lock_fh.close()
                self._lock_fh = None

    def __enter__(self) -> Spool:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


@dataclass(frozen=True)
class SpoolInfo:
    """What a spool directory holds, read without taking its lock."""

    directory: Path
    events: int
    size: int
    in_use: bool

    @property
    def name(self) -> str:
        """The producer the spool belongs to (its folder name)."""
        return self.directory.name


def _in_use(directory: Path) -> bool:
    try:
        fd = os.open(directory / ".lock", os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def spool_info(directory: str | Path) -> SpoolInfo:
    """Events and bytes waiting in one spool directory, and whether a running producer holds it."""
    directory = Path(directory)
    events = size = 0
    for path in sorted(directory.glob("seg-*.avro")):
        match = _NAME.match(path.name)
        if match is None:
            continue
        # An open segment of a live producer is still being written: count its complete blocks.
        events += int(match.group(3)) if match.group(3) else sum(1 for _ in _read_events(path))
        size += path.stat().st_size
    return SpoolInfo(directory, events, size, _in_use(directory))


def list_spools(root: str | Path) -> list[SpoolInfo]:
    """Every spool under `root` (one folder per producer), empty ones included, by name."""
    root = Path(root)
    if not root.is_dir():
        return []
    return [spool_info(path) for path in sorted(root.iterdir()) if path.is_dir()]
