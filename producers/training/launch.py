"""Rank death without a Python exception: run the training script as a child and report how it ended.

    torchrun --nproc-per-node 4 -m producers.training.launch train.py --steps 100
    python -m producers.training.launch [--memory-limit BYTES] -- train.py ARGS

A rank killed by SIGKILL, a segfault, the kernel's OOM killer or `os._exit` runs no Python
`except` block, so the SDK inside it cannot say why it ended. This wrapper is the rank's parent:
it runs `python SCRIPT ARGS` (same interpreter, same environment, so the SDK's identity is the
same), waits for it and, when it ends other than cleanly, publishes one RankFault for that rank
at once (the time to detect is the time to publish): kind `oom` when the memory cgroup counted
an OOM kill during the run (cgroup v2 `memory.events` or v1 `memory.oom_control`, the group
this process runs in) or the child died of SIGKILL while a `--memory-limit` was set and it
used most of it (its peak RSS); else kind `exit` with the exit code (128 + the signal number, as shells and
torchrun report it) and a detail naming the signal. The exit status is passed on unchanged, so
torchrun's elastic agent sees the same failure. A stop asked from outside (SIGTERM/SIGINT to
this wrapper, as torchrun does to the other workers when one fails) is forwarded to the child
and is not a fault of this rank.

torchrun's elastic agent: a failed worker is the RankFault above (its own launcher's); when the
agent then restarts the worker group (`--max-restarts`), every worker's launcher starts again
with `TORCHELASTIC_RESTART_COUNT` = n, and global rank 0's publishes a JobStateChanged
`restarting` with `restart_count` n at once, while the new training process starts (the new
attempt's steps carry a new run id). Exhausting the restarts leaves torchrun's exit status to the
scheduler.

`--memory-limit BYTES` puts the child in a memory cgroup of its own under this process's (v2
`memory.max`, v1 `memory.limit_in_bytes`) where the kernel OOM-kills it past the limit, and
counts that cgroup's OOM kills; where no cgroup can be made it sets RLIMIT_AS instead (an
allocation past it then fails inside the process: an exception the SDK reports).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from types import FrameType
from typing import Any

__all__ = [
    "ExitReport",
    "RankCgroup",
    "classify_exit",
    "elastic_restart",
    "main",
    "memory_cgroup",
    "oom_kills",
    "run",
]

_CGROUP_ROOT = Path("/sys/fs/cgroup")


def _own_cgroups(proc_root: Path) -> list[tuple[str, str]]:
    """(controllers, path) of this process's cgroups: "" is the v2 unified hierarchy."""
    try:
        lines = (proc_root / "self" / "cgroup").read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) == 3:
            out.append((parts[1], parts[2].lstrip("/")))
    return out


def _oom_count(folder: Path) -> int | None:
    """The `oom_kill` count of one memory cgroup folder (v2 memory.events, v1 memory.oom_control)."""
    for name in ("memory.events", "memory.oom_control"):
        try:
            for row in (folder / name).read_text().splitlines():
                key, _, value = row.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            continue
    return None


def memory_cgroup(proc_root: Path = Path("/proc"), cgroup_root: Path = _CGROUP_ROOT) -> Path | None:
    """The folder of this process's memory cgroup (v2 or v1), or None when there is none to read."""
    for controllers, rel in _own_cgroups(proc_root):
        if controllers == "":
            candidates = [cgroup_root / rel, cgroup_root / "unified" / rel]
        elif "memory" in controllers.split(","):
            candidates = [cgroup_root / "memory" / rel]
        else:
            continue
        for folder in candidates:
            if _oom_count(folder) is not None:
                return folder
    return None


def oom_kills(proc_root: Path = Path("/proc"), cgroup_root: Path = _CGROUP_ROOT) -> int | None:
    """OOM kills counted so far by this process's memory cgroup (v2 or v1); None when it cannot be read."""
    folder = memory_cgroup(proc_root, cgroup_root)
    return None if folder is None else _oom_count(folder)


class RankCgroup:
    """A memory cgroup of its own for the training process, under this process's, with a hard limit."""

    def __init__(self, parent: Path, limit: int) -> None:
        self.path = parent / f"ranksight-rank-{os.getpid()}"
        self.path.mkdir()
        v2 = (parent / "memory.events").exists()
        (self.path / ("memory.max" if v2 else "memory.limit_in_bytes")).write_text(str(limit))

    def enter(self) -> None:
        """Move the calling process in (run in the child before it executes the script)."""
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def oom_kills(self) -> int | None:
        """OOM kills the kernel counted in this cgroup."""
        return _oom_count(self.path)

    def remove(self) -> None:
        """Remove the (by now empty) cgroup; best effort."""
        with contextlib.suppress(OSError):
            self.path.rmdir()


class ExitReport(dict[str, Any]):
    """The RankFault fields for a child's end: kind, detail, exit_code (empty for a clean exit)."""


def classify_exit(
    returncode: int,
    *,
    oom_before: int | None,
    oom_after: int | None,
    memory_limit: int | None = None,
    peak_rss: int | None = None,
) -> ExitReport:
    """What `Popen.returncode` (negative: the signal) and the cgroup's OOM count say about a rank's end."""
    if returncode == 0:
        return ExitReport()
    sig = -returncode if returncode < 0 else None
    code = 128 + sig if sig is not None else returncode
    oom_counted = oom_before is not None and oom_after is not None and oom_after > oom_before
    near_limit = (
        sig == signal.SIGKILL
        and memory_limit is not None
        and peak_rss is not None
        and peak_rss >= 0.8 * memory_limit
    )
    if sig is not None:
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        detail = f"killed by {name}"
        if sig == signal.SIGSEGV:
            detail += " (segmentation fault)"
        elif sig == signal.SIGABRT:
            detail += " (aborted)"
    else:
        detail = f"exited with code {returncode}"
    if oom_counted or near_limit:
        why = "the memory cgroup counted an OOM kill" if oom_counted else "it used most of its memory limit"
        return ExitReport(kind="oom", detail=f"{detail}; {why}", exit_code=code)
    return ExitReport(kind="exit", detail=detail, exit_code=code)


def _report(fields: ExitReport, env: Mapping[str, str]) -> None:
    """Publish one RankFault with the rank's identity from the launcher environment, and wait for delivery."""
    from producers.training.reporter import Reporter

    reporter = Reporter(bind=False, env=env, verify_checkpoints=False, heartbeat_s=0)
    try:
        reporter.fault(fields["kind"], fields["detail"], exit_code=fields["exit_code"])
    finally:
        reporter.close(10.0)


def elastic_restart(env: Mapping[str, str]) -> tuple[int, str] | None:
    """(restart count, reason) when torchrun's elastic agent restarted the worker group and this is global rank 0."""
    try:
        count = int(env.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    except ValueError:
        return None
    if count <= 0 or env.get("RANK", "0") != "0":
        return None
    limit = env.get("TORCHELASTIC_MAX_RESTARTS")
    of = f" of {limit}" if limit and limit.isdigit() else ""
    return (
        count,
        f"torchrun's elastic agent restarted the workers (restart {count}{of}) after a worker failed",
    )


def _report_restart(count: int, reason: str, env: Mapping[str, str]) -> None:
    """Publish JobStateChanged `restarting` for the job (identity from the launcher environment)."""
    from producers.training.reporter import Reporter

    reporter = Reporter(bind=False, env=env, verify_checkpoints=False, heartbeat_s=0)
    try:
        reporter.state("restarting", reason, restart_count=count)
    finally:
        reporter.close(10.0)


def _rank_cgroup(memory_limit: int) -> RankCgroup | None:
    parent = memory_cgroup()
    if parent is None:
        return None
    try:
        return RankCgroup(parent, memory_limit)
    except OSError:  # not writable here (no delegation, not root): RLIMIT_AS instead
        return None


def _limit(memory_limit: int | None, cgroup: RankCgroup | None) -> Callable[[], None] | None:
    if memory_limit is None:
        return None

    def apply() -> None:
        if cgroup is not None:
            cgroup.enter()
        else:
            resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))

    return apply


def run(
    command: list[str],
    *,
    memory_limit: int | None = None,
    env: Mapping[str, str] | None = None,
    report: Callable[[ExitReport, Mapping[str, str]], None] = _report,
    report_restart: Callable[[int, str, Mapping[str, str]], None] = _report_restart,
) -> int:
    """Run `command`, forward SIGTERM/SIGINT to it, report an unclean end; returns the exit status to pass on."""
    env = dict(os.environ if env is None else env)
    restart = elastic_restart(env)
    announcing: threading.Thread | None = None
    if restart is not None:
        # Said while the training process starts (publishing may take a second: not before it).
        def announce() -> None:
            try:
                report_restart(restart[0], restart[1], env)
            except Exception as exc:
                print(f"ranksight: could not report the restart ({exc})", file=sys.stderr)

        announcing = threading.Thread(target=announce, name="ranksight-restart", daemon=True)
        announcing.start()
    cgroup = _rank_cgroup(memory_limit) if memory_limit is not None else None
    counted: Callable[[], int | None] = cgroup.oom_kills if cgroup is not None else oom_kills
    before = counted()
    stopped: list[int] = []
    children: list[subprocess.Popen[bytes]] = []

    def forward(signum: int, _frame: FrameType | None) -> None:
        stopped.append(signum)
        for c in children:
            c.send_signal(signum)

    # Set before the child starts, so a stop that comes at once still reaches it.
    old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        child = subprocess.Popen(command, env=env, preexec_fn=_limit(memory_limit, cgroup))
        children.append(child)
        if stopped:
            child.send_signal(stopped[0])
        returncode = child.wait()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    if announcing is not None:
        announcing.join(15.0)
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    after = counted()
    if cgroup is not None:
        cgroup.remove()
    fields = classify_exit(
        returncode, oom_before=before, oom_after=after, memory_limit=memory_limit, peak_rss=peak
    )
    if fields and not stopped:
        try:
            report(fields, env)
        except Exception as exc:  # the exit status still goes to the launcher
            print(f"ranksight: could not report the rank's end ({exc})", file=sys.stderr)
    return 128 + -returncode if returncode < 0 else returncode


def main(argv: list[str] | None = None) -> int:
    """`python -m producers.training.launch [--memory-limit N] [--] SCRIPT ARGS...`."""
    p = argparse.ArgumentParser(
        prog="python -m producers.training.launch", description=__doc__.split("\n")[0]
    )
    p.add_argument("--memory-limit", type=int, default=None, help="RLIMIT_AS of the training process, bytes")
    p.add_argument("script", help="the training script (run with this Python)")
    p.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    ns = p.parse_args(argv)
    script = ns.script
    args = ns.args
    if script == "--" and args:
        script, args = args[0], args[1:]
    return run([sys.executable, script, *args], memory_limit=ns.memory_limit)


if __name__ == "__main__":
    sys.exit(main())
