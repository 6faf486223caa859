"""Data-path measurement without the user's help: `reporter.wrap_loader(loader)` around any iterable.

The wrapper times every `next()` on the training thread (the time the loop was blocked on data:
the next step's data wait), fingerprints each batch (a short hash of the shapes, dtypes, the
first and last elements of its first rows and a strided sample of each array, so a loader that
repeats batches shows up), and every `interval_s` publishes one
DataLoaderSample: batches, wait, workers, batch preparation time and, when the dataset keeps
them, read throughput and latency, cache hits, file opens and errors.

What the loader can know, and where it comes from:

- `wait_s`, `batches`: always (the wrapper's own clock).
- `batch_prep_s`: the mean time of `next()` when batches are prepared in this process (a plain
  iterable, or a PyTorch `DataLoader` with `num_workers=0`); with worker processes the wait is
  only the part the workers did not hide, so it is left null unless the dataset reports it.
- `workers`: the worker processes alive at the end of the interval (a PyTorch `DataLoader`'s
  worker processes that are still running and not retired; 0 with `num_workers=0`), and
  `workers_expected`: the loader's `num_workers`. A worker that died or finished its shard early
  shows as live < expected.
- `queue_depth`: a PyTorch multi-process loader's batches ready at the end of the interval (in
  its result queue, plus those that arrived out of order and wait for their turn); null without
  worker processes.
- `read_bytes_s` and `file_opens_s` without the dataset's help (`procio.py`): the bytes the
  worker processes read (`/proc/<pid>/io` rchar; the training thread's own for a loader without
  workers) and the files they open (a Python audit hook installed in each worker through the
  loader's `worker_init_fn`, which the wrapper wraps; `count_opens=False` leaves it alone).
- the epoch of the batches (`sampler.epoch`, as `DistributedSampler.set_epoch` sets it, else the
  number of times this wrapper was iterated), attached to the steps that consume them.
- a data-loader exception (the iteration ends with it) is reported as a RankFault: a timeout as
  `storage_timeout`, anything else as `exception`, then re-raised untouched.
- everything else (and read bytes / file opens, where it reports them): from `loader.dataset.ranksight_stats()` (or `loader.ranksight_stats()`), a
  method returning *cumulative* counters (`read_bytes`, `reads`, `read_time_s`, `cache_hits`,
  `cache_misses`, `file_opens`, `file_open_errors`, `errors`, `batch_prep_s`, `batches_prepared`);
  the wrapper publishes their change per interval. Counters kept in worker processes must be
  shared (e.g. `multiprocessing.Value`) to be seen here.

Nothing here imports torch: tensors are recognised by their methods. Nothing here imports the
reporter either: it talks to a `LoaderSink` (the reporter is one), so the two modules do not
import each other.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

from producers.training.faults import fault_detail, fault_kind
from producers.training.procio import OpenCounter, ReadCounter

__all__ = ["STAT_KEYS", "LoaderSink", "MonitoredLoader", "batch_fingerprint", "live_workers", "prefetched"]

STAT_KEYS: tuple[str, ...] = (
    "read_bytes",
    "reads",
    "read_time_s",
    "cache_hits",
    "cache_misses",
    "file_opens",
    "file_open_errors",
    "errors",
    "batch_prep_s",
    "batches_prepared",
)
_ROWS = 32  # samples (first-dimension rows) of a batch whose edges are hashed
_EDGE = 16  # elements hashed at each end of a row: content survives left or right padding
_STRIDED = 512  # plus this many elements strided over the whole array


def _parts(array: Any) -> list[Any]:
    """Pieces of an array (torch or numpy, same slicing) to hash: row edges and a strided sample."""
    shape = tuple(array.shape)
    try:
        rows = array.reshape(shape[0] if shape else 1, -1)
    except (RuntimeError, ValueError):  # an empty array: its shape says it all
        return []
    n = int(rows.shape[0]) * int(rows.shape[1])
    head = rows[:_ROWS]
    flat = rows.reshape(-1)
    return [head[:, :_EDGE], head[:, -_EDGE:], flat[:: max(1, n // _STRIDED)][:_STRIDED]]


def _array_bytes(value: Any) -> bytes | None:
    """Bytes identifying an array's content (torch tensor or numpy array): shape, dtype and a sample."""
    if hasattr(value, "detach"):  # torch: sample on the device, copy only the sample to the host
        tensor = value.detach()
        if str(tensor.dtype) == "torch.bfloat16":  # numpy has no bfloat16
            tensor = tensor.float()
        parts = [p.contiguous().cpu().numpy() for p in _parts(tensor)]
    elif hasattr(value, "reshape") and hasattr(value, "tobytes"):
        parts = _parts(value)
    else:
        return None
    head = f"{tuple(value.shape)}{value.dtype}".encode()
    return head + b"".join(p.tobytes() for p in parts)


def _feed(h: Any, value: Any, depth: int = 0) -> None:
    if depth > 8:
        return
    raw = _array_bytes(value)
    if raw is not None:
        h.update(raw)
    elif isinstance(value, (bytes, bytearray)):
        h.update(bytes(value[:4096]))
    elif isinstance(value, str):
        h.update(value[:4096].encode("utf-8", "replace"))
    elif isinstance(value, Mapping):
        for key in sorted(value, key=str):
            h.update(str(key).encode())
            _feed(h, value[key], depth + 1)
    elif isinstance(value, (list, tuple)):
        for item in value[:256]:
            _feed(h, item, depth + 1)
    else:
        h.update(repr(value)[:256].encode())


def batch_fingerprint(batch: Any) -> str:
    """16 hex digits identifying a batch's content (dicts, lists, tuples, tensors, arrays, str, numbers)."""
    h = hashlib.sha1(usedforsecurity=False)  # not a security hash: sha1 is the fastest one here (SHA-NI)
    _feed(h, batch)
    return h.hexdigest()[:16]


class LoaderSink(Protocol):
    """What a monitored loader reports to (the `Reporter`)."""

    def _mono_ns(self) -> int: ...

    def _internal(self, kind: str, exc: BaseException, message: str | None = None) -> None: ...

    def _loader_delivered(self, wait_s: float, fingerprint: str | None, epoch: int | None = None) -> None: ...

    def dataloader(
        self,
        *,
        interval_s: float,
        batches: int | None = None,
        wait_s: float | None = None,
        queue_depth: int | None = None,
        workers: int | None = None,
        workers_expected: int | None = None,
        batch_prep_s: float | None = None,
        read_bytes_s: float | None = None,
        read_latency_s: float | None = None,
        cache_hit_ratio: float | None = None,
        file_opens_s: float | None = None,
        errors: int | None = None,
        file_open_errors: int | None = None,
    ) -> None: ...

    def fault(self, kind: str, detail: str | None = None, *, exit_code: int | None = None) -> None: ...


def live_workers(iterator: Any) -> int | None:
    """Worker processes of a PyTorch multi-process loader iterator that are alive and not retired; None if unknown."""
    workers = getattr(iterator, "_workers", None)
    if not isinstance(workers, list):
        return None
    status = getattr(iterator, "_workers_status", None)
    active = status if isinstance(status, list) and len(status) == len(workers) else [True] * len(workers)
    count = 0
    for worker, running in zip(workers, active, strict=True):
        try:
            if running and worker.is_alive():
                count += 1
        except (AssertionError, ValueError, OSError):  # a process object of another parent, or closed
            continue
    return count


def prefetched(iterator: Any) -> int | None:
    """Batches a PyTorch multi-process loader iterator holds ready for the loop; None if unknown."""
    queue = getattr(iterator, "_data_queue", None)
    info = getattr(iterator, "_task_info", None)
    if queue is None or not isinstance(info, dict):
        return None
    try:
        ready = int(queue.qsize())
    except (NotImplementedError, OSError, AttributeError, ValueError):  # macOS has no sem_getvalue
        return None
    # Results that came out of order wait in _task_info as (worker_id, data).
    early = sum(1 for v in list(info.values()) if isinstance(v, tuple) and len(v) == 2)
    return ready + early


def _worker_pids(iterator: Any) -> list[int]:
    workers = getattr(iterator, "_workers", None)
    if not isinstance(workers, list):
        return []
    return [int(w.pid) for w in workers if getattr(w, "pid", None)]


class MonitoredLoader:
    """Iterates the wrapped loader and reports what it can measure; `len()` and attributes pass through."""

    def __init__(
        self,
        reporter: LoaderSink,
        loader: Iterable[Any],
        *,
        interval_s: float = 10.0,
        fingerprint: bool | Callable[[Any], str | None] = True,
        clock_ns: Callable[[], int] | None = None,
        count_opens: bool = True,
        proc_root: Path = Path("/proc"),
    ) -> None:
        self.loader = loader
        self._reporter = reporter
        self._interval_ns = int(interval_s * 1e9)
        self._fingerprint: Callable[[Any], str | None] | None = (
            batch_fingerprint if fingerprint is True else fingerprint or None
        )
        self._clock = clock_ns or reporter._mono_ns
        self._workers = getattr(loader, "num_workers", None)
        self._in_process = not self._workers  # batches prepared by next() itself
        self._iterator: Any = None
        self._live: int | None = None  # live workers at the last report while iterating
        self._reported_live: int | None = None  # ... as the last published sample said
        self._iterations = 0
        self._source = self._stats_source(loader)
        self._queue: int | None = None
        # What the loader's processes read and open, measured from /proc and an audit hook.
        self._reads = ReadCounter(proc_root)
        self._io_pids: list[int | str] = []
        self._opens = OpenCounter() if count_opens else None
        self._opens_attached = self._opens.attach(loader) if self._opens is not None else False
        self._read_last = 0
        self._open_last = 0
        self._reset(self._clock())
        self._last_stats = self._read_stats()

    @staticmethod
    def _stats_source(loader: Any) -> Callable[[], Mapping[str, Any]] | None:
        for owner in (getattr(loader, "dataset", None), loader):
            stats = getattr(owner, "ranksight_stats", None)
            if callable(stats):
                return stats
        return None

    def _read_stats(self) -> dict[str, float]:
        if self._source is None:
            return {}
        try:
            raw = self._source()
            return {k: float(raw[k]) for k in STAT_KEYS if raw.get(k) is not None}
        except Exception as exc:
            self._reporter._internal("loader_stats", exc)
            self._source = None
            return {}

    def _reset(self, now: int) -> None:
        self._since = now
        self._batches = 0
        self._wait_ns = 0

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)

    def _measure_workers(self) -> None:
        live = live_workers(self._iterator)
        self._live = live if live is not None else (0 if self._workers == 0 else None)
        self._queue = prefetched(self._iterator)
        pids = _worker_pids(self._iterator)
        if pids:
            self._io_pids = list(pids)
        try:
            self._reads.sample(self._io_pids, born_for_loader=bool(pids))
        except Exception as exc:
            self._reporter._internal("loader_io", exc)

    def _epoch(self) -> int:
        """The epoch of the batches being delivered: the sampler's (DistributedSampler), else this wrapper's count."""
        sampler = getattr(self.loader, "sampler", None)
        epoch = getattr(sampler, "epoch", None)
        if isinstance(epoch, int) and not isinstance(epoch, bool):
            return epoch
        return self._iterations - 1

    def __iter__(self) -> Iterator[Any]:
        if self._opens is not None and not self._opens_attached and not self._workers:
            self._opens.count_here()  # batches are prepared on this thread: count its opens
            self._opens_attached = True
        if not self._workers:
            self._io_pids = [f"self/task/{threading.get_native_id()}"]
        it = self._iterator = iter(self.loader)
        self._iterations += 1
        epoch = self._epoch()
        clock = self._clock
        reporter = self._reporter
        first = True
        try:
            while True:
                t0 = clock()
                try:
                    batch = next(it)
                except StopIteration:
                    return
                except Exception as exc:
                    # The loader failed (a storage timeout, a worker that died): the rank's fault,
                    # reported before the exception ends the loop; the interval's last sample
                    # counts the workers still alive now (a dead one is missing).
                    try:
                        self._measure_workers()
                    except Exception as internal:
                        reporter._internal("loader_workers", internal)
                    if not getattr(exc, "_ranksight_reported", False):
                        try:
                            reporter.fault(fault_kind(exc), fault_detail(exc, "data loader"))
                            exc._ranksight_reported = True  # type: ignore[attr-defined]  # a step around it stays quiet
                        except Exception as internal:
                            reporter._internal("loader_fault", internal)
                    raise
                t1 = clock()
                if first:
                    first = False
                    self._measure_workers()
                self._batches += 1
                self._wait_ns += t1 - t0
                fp = None
                if self._fingerprint is not None:
                    try:
                        fp = self._fingerprint(batch)
                    except Exception as exc:
                        reporter._internal("fingerprint", exc)
                reporter._loader_delivered((t1 - t0) / 1e9, fp, epoch)
                if t1 - self._since >= self._interval_ns:
                    self.report(t1)
                yield batch
        finally:
            # The end of an epoch (or an abandoned iteration) closes the interval; its workers are
            # shutting down by now, so it keeps the live count measured while they worked.
            self._iterator = None
            self.report(clock())

    def report(self, now: int | None = None) -> None:
        """Publish the DataLoaderSample of the interval so far (nothing when it saw no batch and no counter moved)."""
        now = self._clock() if now is None else now
        if now <= self._since:
            return
        stats = self._read_stats()
        delta = {k: v - self._last_stats.get(k, 0.0) for k, v in stats.items()}
        if self._batches == 0 and not any(delta.values()) and self._live == self._reported_live:
            return  # nothing happened (a worker lost since the last sample is news: it is reported)
        interval_s = (now - self._since) / 1e9
        self._last_stats = stats or self._last_stats
        wait_s = self._wait_ns / 1e9
        prep: float | None = None
        if delta.get("batches_prepared") and "batch_prep_s" in delta:
            prep = delta["batch_prep_s"] / delta["batches_prepared"]
        elif self._in_process and self._batches:
            prep = wait_s / self._batches
        if self._iterator is not None:
            self._measure_workers()
        else:
            self._queue = None
        read_total = self._reads.total
        if "read_bytes" not in delta and self._io_pids:
            delta["read_bytes"] = float(read_total - self._read_last)
        self._read_last = read_total
        if self._opens is not None and self._opens_attached:
            open_total = self._opens.total()
            delta.setdefault("file_opens", float(open_total - self._open_last))
            self._open_last = open_total
        reads, read_time = delta.get("reads"), delta.get("read_time_s")
        hits, misses = delta.get("cache_hits"), delta.get("cache_misses")
        opens, errors = delta.get("file_opens"), delta.get("errors")
        open_errors = delta.get("file_open_errors")
        self._reporter.dataloader(
            interval_s=interval_s,
            batches=self._batches,
            wait_s=wait_s,
            queue_depth=self._queue,
            workers=self._live,
            workers_expected=self._workers,
            batch_prep_s=prep,
            read_bytes_s=delta["read_bytes"] / interval_s if "read_bytes" in delta else None,
            read_latency_s=read_time / reads if reads and read_time is not None else None,
            cache_hit_ratio=hits / (hits + (misses or 0.0))
            if hits is not None and hits + (misses or 0.0)
            else None,
            file_opens_s=opens / interval_s if opens is not None else None,
            errors=int(errors) if errors is not None else None,
            file_open_errors=int(open_errors) if open_errors is not None else None,
        )
        self._reported_live = self._live
        self._reset(now)
