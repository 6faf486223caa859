"""Checkpoint verification off the training thread: read back, size and checksum manifest, format check.

A checkpoint that completed is only a recovery point once it has been read back. `verify_path`
reads every file of a checkpoint (one file, or a directory such as Hugging Face's
`checkpoint-<step>` or a `torch.distributed.checkpoint` folder) once, hashing it with SHA-256
as it goes, and checks each file's format by its name and first bytes:

- a torch zip (`torch.save`'s default format, also Lightning's `.ckpt`): a readable zip archive
  whose entries all pass their CRC and whose `data.pkl` is present;
- safetensors: the 8-byte little-endian header length, a JSON header of that length, and a file
  exactly as long as the header's largest tensor offset says;
- a `torch.distributed.checkpoint` folder: its `.metadata` file is present and not empty, and
  every `*.distcp` shard is not empty;
- anything else: read back in full (the checksum), no format check.

The manifest is one SHA-256 over (relative path, size, file digest) of every file, sorted: the
checkpoint's checksum. A missing path, an empty file, a truncated zip or safetensors file, or a
DCP folder without metadata is a failure with one sentence saying why. `CheckpointVerifier`
runs these checks on one daemon thread, one checkpoint at a time, and reports through callbacks,
so the training loop pays one queue append per checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import struct
import threading
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["CheckpointVerifier", "Verification", "verify_path"]

_CHUNK = 4 << 20  # read in 4 MiB pieces: memory stays flat whatever the checkpoint's size
_MAX_FILES = 100_000  # a checkpoint folder with more files than this is not walked further
_SAFETENSORS_MAX_HEADER = 100 << 20  # the format's own limit on the JSON header


@dataclass(frozen=True)
class Verification:
    """The outcome for one checkpoint: `ok`, its manifest checksum, bytes read, and why it failed."""

    ok: bool
    checksum: str | None
    bytes: int
    files: int
    error: str | None = None
    formats: dict[str, int] = field(default_factory=dict)


class _Invalid(Exception):
    """A checkpoint file failed its check; the message is the one sentence a user reads."""


def _digest(path: Path) -> tuple[str, int]:
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            size += len(chunk)
    return h.hexdigest(), size


def _check_zip(path: Path) -> None:
    try:
        with zipfile.ZipFile(path) as zf:
            names = zf.namelist()
            if not any(n == "data.pkl" or n.endswith("/data.pkl") for n in names):
                raise _Invalid(f"{path.name} is a zip archive without data.pkl, not a torch checkpoint")
            bad = zf.testzip()  # reads every entry and checks its CRC
            if bad is not None:
                raise _Invalid(f"{path.name}: entry {bad} fails its CRC check (corrupt)")
    except zipfile.BadZipFile as exc:
        raise _Invalid(
            f"{path.name} is not a readable torch zip archive ({exc}): truncated or corrupt"
        ) from exc


def _check_safetensors(path: Path, size: int) -> None:
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise _Invalid(f"{path.name} is shorter than a safetensors header (truncated)")
        (n,) = struct.unpack("<Q", head)
        if n > _SAFETENSORS_MAX_HEADER or 8 + n > size:
            raise _Invalid(
                f"{path.name}: safetensors header length {n} exceeds the file (truncated or corrupt)"
            )
        try:
            header = json.loads(f.read(n))
        except ValueError as exc:
            raise _Invalid(f"{path.name}: safetensors header is not valid JSON (corrupt)") from exc
    if not isinstance(header, dict):
        raise _Invalid(f"{path.name}: safetensors header is not a JSON object (corrupt)")
    end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
            raise _Invalid(f"{path.name}: tensor {name[:80]!r} has no valid data_offsets (corrupt)")
        end = max(end, offsets[1])
    if 8 + n + end != size:
        raise _Invalid(
            f"{path.name} is {size} bytes but its safetensors header describes {8 + n + end} (truncated or corrupt)"
        )


def _is_torch_zip(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"PK\x03\x04"


def _files(root: Path) -> list[Path]:
    if root.is_file():
        return [root]
    out: list[Path] = []
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            out.append(Path(dirpath) / name)
            if len(out) >= _MAX_FILES:
                return sorted(out)
    return sorted(out)


def verify_path(path: str | os.PathLike[str]) -> Verification:
    """Read a checkpoint (file or folder) back, check each file's format, and build its manifest checksum."""
    root = Path(path)
    try:
        if not root.exists():
            raise _Invalid(f"checkpoint {root} does not exist (deleted, or never written)")
        files = _files(root)
        if not files:
            raise _Invalid(f"checkpoint folder {root} holds no files")
        manifest = hashlib.sha256()
        total = 0
        formats: dict[str, int] = {}
        dcp_shards = [f for f in files if f.suffix == ".distcp"]
        if dcp_shards and not (root / ".metadata").is_file():
            raise _Invalid(f"distributed checkpoint {root} has shards but no .metadata file (incomplete)")
        for f in files:
            digest, size = _digest(f)
            rel = f.name if f == root else str(f.relative_to(root))
            if size == 0:
                raise _Invalid(f"checkpoint file {rel} is empty")
            kind = "other"
            if f.suffix == ".safetensors":
                _check_safetensors(f, size)
                kind = "safetensors"
            elif f.suffix == ".distcp" or f.name == ".metadata":
                kind = "dcp"
            elif f.suffix in (".pt", ".pth", ".ckpt", ".bin") or _is_torch_zip(f):
                if _is_torch_zip(f):
                    _check_zip(f)
                    kind = "torch_zip"
                elif f.suffix in (".pt", ".pth", ".ckpt"):
                    raise _Invalid(f"{rel} is not a torch zip archive (truncated, corrupt or legacy format)")
            formats[kind] = formats.get(kind, 0) + 1
            manifest.update(f"{rel}\0{size}\0{digest}\n".encode())
            total += size
        return Verification(True, "sha256:" + manifest.hexdigest(), total, len(files), formats=formats)
    except _Invalid as exc:
        return Verification(False, None, 0, 0, str(exc))
    except OSError as exc:
        return Verification(
            False, None, 0, 0, f"checkpoint {root} could not be read back: {exc.strerror or exc}"
        )


Done = Callable[[Verification], None]


class CheckpointVerifier:
    """Verifies checkpoints one at a time on a daemon thread; `submit(path, done)` returns at once."""

    def __init__(self, verify: Callable[[str], Verification] = verify_path) -> None:
        self._verify = verify
        self._queue: queue.SimpleQueue[tuple[str, Done] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._pending = 0
        self._idle = threading.Condition(self._lock)

    def submit(self, path: str | os.PathLike[str], done: Done) -> None:
        """Queue `path`; `done(result)` is called on the verifier's thread when it has been read back."""
        with self._lock:
            self._pending += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="ranksight-verify", daemon=True)
                self._thread.start()
        self._queue.put((str(path), done))

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            path, done = item
            try:
                try:
                    result = self._verify(path)
                except Exception as exc:  # a bug in a check must not end the thread
                    result = Verification(
                        False, None, 0, 0, f"checkpoint {path} could not be verified: {exc!r}"
                    )
                done(result)
            except Exception:
                pass  # the callback reports its own errors; the next checkpoint still gets verified
            finally:
                with self._lock:
                    self._pending -= 1
                    self._idle.notify_all()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until every submitted checkpoint is verified; False when `timeout` passed first."""
        with self._lock:
            return self._idle.wait_for(lambda: self._pending == 0, timeout)

    def close(self, timeout: float | None = None) -> None:
        """Finish what is queued (up to `timeout` s) and stop the thread."""
        self.wait(timeout)
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout)
            self._thread = None
