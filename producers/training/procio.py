"""What a data loader's processes read and open, measured from outside the dataset's code.

- Read bytes: `/proc/<pid>/io`'s `rchar` (bytes passed to read()/pread(), page-cache hits and
  network file systems included, where `read_bytes` only counts the block layer and reads 0 on
  NFS or Lustre) of the processes that prepare batches: the loader's worker processes, or the
  training process itself when batches are prepared in it. Summed as per-process increments, so
  a worker that exits (its counter gone) or starts (a new epoch's workers) never counts backwards.
  For a loader without workers, the training thread's own counter (`/proc/self/task/<tid>/io`),
  so the checkpoint verifier's and the publisher's threads are not counted.
- File opens: a Python audit hook (`sys.addaudithook`, PEP 578) on the `open` event, which
  `open()`, `io.open` and `os.open` raise for every file the dataset opens (numpy, PIL, torch.load
  and most readers go through them). In worker processes the hook is installed by wrapping the
  loader's `worker_init_fn`; each worker counts in its own slot of a shared array (no lock).
  Opens by C code that calls the C library directly (some decoders) are not seen; Python's own
  module imports (.py, .pyc, .so), directories and /proc, /sys, /dev are not data and not counted. For a loader
  without workers, the opens of the training thread (its checkpoint saves included).

Nothing here imports torch.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

__all__ = ["OpenCounter", "ReadCounter", "read_rchar"]

_MAX_WORKERS = 1024  # slots of the shared open counter (a loader with more workers shares the last slot)


def read_rchar(pid: int | str, proc_root: Path = Path("/proc")) -> int | None:
    """`rchar` of `<proc_root>/<pid>/io`, or None (process gone, not ours, no such file)."""
    try:
        for line in (proc_root / str(pid) / "io").read_text().splitlines():
            if line.startswith("rchar:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


class ReadCounter:
    """Bytes read by a changing set of processes, as the sum of each one's increments."""

    def __init__(self, proc_root: Path = Path("/proc")) -> None:
        self._proc = proc_root
        self._last: dict[str, int] = {}
        self.total = 0

    def sample(self, pids: Iterable[int | str], *, born_for_loader: bool = True) -> int:
        """Read the processes' counters now; returns the running total of bytes read.

        `born_for_loader`: a process seen for the first time read only for the loader (its
        workers), so all its reads count; otherwise (the training thread) the first reading is
        the baseline.
        """
        seen: dict[str, int] = {}
        for pid in pids:
            key = str(pid)
            value = read_rchar(key, self._proc)
            if value is None:
                continue
            seen[key] = value
            before = self._last.get(key)
            if before is None or value < before:
                # A smaller value is a new process under a reused pid.
                self.total += value if born_for_loader else 0
            else:
                self.total += value - before
        self._last = seen
        return self.total


_counting: list[Any] = []  # this process's open counter slot (array, index), set once by the hook


_CODE_SUFFIXES = (".py", ".pyc", ".so", ".pth")  # Python importing a module is no data read
_SYSTEM_PREFIXES = ("/proc/", "/sys/", "/dev/")
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)


def _is_data_open(args: tuple[Any, ...]) -> bool:
    """An `open` audit event (path, mode, flags) for a data file: not a descriptor, module, directory or /proc."""
    if not args or isinstance(args[0], int):
        return False
    try:
        path = os.fsdecode(args[0])
    except TypeError:
        return False
    if path.endswith(_CODE_SUFFIXES) or path.startswith(_SYSTEM_PREFIXES):
        return False
    flags = args[2] if len(args) > 2 else None
    if isinstance(flags, int) and _O_DIRECTORY and flags & _O_DIRECTORY:
        return False
    # os.open (mode None) of a directory: multiprocessing removing its temporary folder, a scandir.
    return not (len(args) > 1 and args[1] is None and os.path.isdir(path))


def _on_audit(event: str, args: tuple[Any, ...]) -> None:
    if event == "open" and _counting and _is_data_open(args):
        array, index, thread = _counting[0]
        if thread is None or threading.get_ident() == thread:
            array[index] += 1


def _install(array: Any, index: int, thread: int | None = None) -> None:
    """Count this process's opens (those of `thread` only, when given) into `array[index]`; the hook is added once."""
    first = not _counting
    _counting[:] = [(array, index, thread)]
    if first:
        sys.addaudithook(_on_audit)


class _CountingInit:
    """A loader's `worker_init_fn` that installs the open counter in the worker, then calls the user's."""

    def __init__(self, array: Any, inner: Callable[[int], Any] | None) -> None:
        self.array = array
        self.inner = inner

    def __call__(self, worker_id: int) -> None:
        _install(self.array, min(int(worker_id), _MAX_WORKERS - 1) + 1)
        if self.inner is not None:
            self.inner(worker_id)


class OpenCounter:
    """Files opened by a data loader's processes: its workers (through `worker_init_fn`) and this one."""

    def __init__(self) -> None:
        # Slot 0: the training process (batches prepared in it); slot 1 + i: worker i.
        self.array = multiprocessing.RawArray("Q", _MAX_WORKERS + 1)
        self._in_process = False

    def attach(self, loader: Any) -> bool:
        """Count the opens of `loader`'s workers (before it starts them); False when it cannot be wrapped."""
        if not getattr(loader, "num_workers", 0):
            return False
        current = getattr(loader, "worker_init_fn", None)
        if isinstance(current, _CountingInit):
            self.array = current.array  # wrapped before (a second wrapper): share its counts
            return True
        try:
            loader.worker_init_fn = _CountingInit(self.array, current)
        except (AttributeError, ValueError, TypeError):
            return False
        return True

    def count_here(self) -> None:
        """Count the opens of the calling thread (a loader preparing batches in the training thread)."""
        if not self._in_process:
            self._in_process = True
            _install(self.array, 0, threading.get_ident())

    def total(self) -> int:
        """Opens counted so far, over every process."""
        return int(sum(self.array))
