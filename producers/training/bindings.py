"""Node-local bindings: the SDK leaves `<dir>/<pid>.json` (job, run, rank, GPU) for the node agent.

The SDK knows its pid, its GPU's UUID and its job identity; the agent on the same node reads
these files to stamp `job_id` / `run_id` on the GPU's telemetry without asking Kafka. A file
whose process is gone is stale and ignored: the pid must exist *and* have the start time the
SDK recorded, so a reused pid does not inherit an old job. The SDK removes its file at close;
the agent never deletes (in another pid namespace every process would look gone).

Directory: RANKSIGHT_RUNTIME_DIR, else `$XDG_RUNTIME_DIR/ranksight/bindings`, else
`/tmp/ranksight-<uid>/bindings`. The agent reads RANKSIGHT_RUNTIME_DIR and every default
location (`/run/ranksight/bindings`, `/run/user/*/ranksight/bindings`, `/tmp/ranksight-*/bindings`).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["Binding", "bindings_dir", "process_start_time", "read_bindings", "reader_dirs", "write_binding"]


@dataclass(frozen=True)
class Binding:
    """One training process on this node: which job, run and rank it is, and which GPU it uses."""

    pid: int
    job_id: str
    run_id: str
    rank: int | None = None
    local_rank: int | None = None
    gpu_uuid: str | None = None
    gpu_index: int | None = None
    node: str | None = None
    start_time: int | None = None  # the process's start (clock ticks since boot, /proc/<pid>/stat field 22)


def process_start_time(pid: int, proc: Path = Path("/proc")) -> int | None:
    """Start time of a process in clock ticks since boot, or None when it does not exist (or no /proc)."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after its last ")".
    fields = stat[stat.rfind(")") + 2 :].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def bindings_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where this process writes its binding."""
    env = os.environ if env is None else env
    if env.get("RANKSIGHT_RUNTIME_DIR"):
        return Path(env["RANKSIGHT_RUNTIME_DIR"]) / "bindings"
    if env.get("XDG_RUNTIME_DIR"):
        return Path(env["XDG_RUNTIME_DIR"]) / "ranksight" / "bindings"
    return Path(tempfile.gettempdir()) / f"ranksight-{os.getuid()}" / "bindings"


def reader_dirs(env: Mapping[str, str] | None = None, root: Path = Path("/")) -> list[Path]:
    """Every directory the agent looks in (the configured one first)."""
    env = os.environ if env is None else env
    dirs: list[Path] = []
    if env.get("RANKSIGHT_RUNTIME_DIR"):
        dirs.append(Path(env["RANKSIGHT_RUNTIME_DIR"]) / "bindings")
    dirs.append(root / "run" / "ranksight" / "bindings")
    dirs.extend(sorted((root / "run" / "user").glob("*/ranksight/bindings")))
    dirs.extend(sorted((root / "tmp").glob("ranksight-*/bindings")))
    return list(dict.fromkeys(dirs))


def write_binding(directory: Path, binding: Binding) -> Path | None:
    """Write `<directory>/<pid>.json` atomically; None (nothing written) when the directory is not writable."""
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o755)
        path = directory / f"{binding.pid}.json"
        tmp = directory / f".{binding.pid}.json.tmp"
        tmp.write_text(json.dumps(asdict(binding), sort_keys=True))
        tmp.chmod(0o644)  # the agent may run as another user
        os.replace(tmp, path)
        return path
    except OSError:
        return None


def read_bindings(
    directories: list[Path], *, alive: frozenset[int] | None = None, proc: Path = Path("/proc")
) -> Iterator[Binding]:
    """Bindings of live processes (`alive`: the pids to trust; default: pid in `proc` with the recorded start)."""
    for directory in directories:
        try:
            files = sorted(directory.glob("*.json"))
        except OSError:
            continue
        for path in files:
            try:
                data = json.loads(path.read_text())
                binding = Binding(**{k: data.get(k) for k in Binding.__dataclass_fields__})
                pid = int(binding.pid)
            except (OSError, ValueError, TypeError):
                continue
            if alive is not None:
                live = pid in alive
            else:
                started = process_start_time(pid, proc)
                live = started is not None and (binding.start_time is None or binding.start_time == started)
            if live:
                yield binding
