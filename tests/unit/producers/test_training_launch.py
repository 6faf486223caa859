"""The rank launcher reports how a training process ended: exit code, signal (SIGKILL, segfault), the
kernel's OOM kill in the rank's memory cgroup; a clean exit and a stop asked from outside are no fault."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path

import psutil
import pytest

from producers.training.launch import ExitReport, classify_exit, memory_cgroup, oom_kills, run


def _run(code: str, **kw: object) -> tuple[int, list[ExitReport]]:
    seen: list[ExitReport] = []

    def report(fields: ExitReport, env: Mapping[str, str]) -> None:
        seen.append(fields)

    rc = run([sys.executable, "-c", code], report=report, **kw)  # type: ignore[arg-type]
    return rc, seen


def test_a_clean_exit_is_not_reported() -> None:
    assert _run("pass") == (0, [])


def test_an_exit_code_is_reported_and_passed_on() -> None:
    rc, [fault] = _run("raise SystemExit(3)")
    assert rc == 3 and fault == {"kind": "exit", "detail": "exited with code 3", "exit_code": 3}


def test_kill_9_is_reported_with_the_signal() -> None:
    rc, [fault] = _run("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert rc == 137 and fault["kind"] == "exit" and fault["exit_code"] == 137
    assert fault["detail"] == "killed by SIGKILL"


def test_a_segfault_is_reported() -> None:
    rc, [fault] = _run("import ctypes; ctypes.string_at(0)")
    assert rc == 139 and fault["detail"] == "killed by SIGSEGV (segmentation fault)"


def test_a_stop_asked_from_outside_is_forwarded_and_not_a_fault() -> None:
    me = psutil.Process()
    before = {c.pid for c in me.children()}

    def stop_soon() -> None:
        deadline = time.monotonic() + 30
        while not {c.pid for c in me.children()} - before and time.monotonic() < deadline:
            time.sleep(0.01)  # until the launcher's child exists (its handler is set by then)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=stop_soon, daemon=True).start()
    rc, seen = _run("import time; time.sleep(30)")
    assert rc == 128 + signal.SIGTERM and seen == []


def test_the_kernel_oom_kill_in_the_ranks_own_cgroup_is_kind_oom() -> None:
    parent = memory_cgroup()
    if parent is None or not os.access(parent, os.W_OK):
        pytest.skip("no writable memory cgroup here")
    rc, [fault] = _run("x = bytearray(400 << 20); print(len(x))", memory_limit=64 << 20)
    assert rc == 137 and fault["kind"] == "oom"
    assert "memory cgroup counted an OOM kill" in fault["detail"]
    assert not list(parent.glob("ranksight-rank-*")), "the rank's cgroup is removed"


def test_classify_exit_reads_the_oom_count_and_a_sigkill_near_the_limit() -> None:
    assert classify_exit(-9, oom_before=2, oom_after=3)["kind"] == "oom"
    assert classify_exit(-9, oom_before=2, oom_after=2)["kind"] == "exit"
    near = classify_exit(-9, oom_before=None, oom_after=None, memory_limit=100, peak_rss=95)
    assert near["kind"] == "oom" and "most of its memory limit" in near["detail"]
    assert classify_exit(0, oom_before=0, oom_after=5) == {}


def test_oom_kills_reads_v1_and_v2_trees(tmp_path: Path) -> None:
    proc = tmp_path / "proc" / "self"
    proc.mkdir(parents=True)
    (proc / "cgroup").write_text("4:memory:/jobs/a\n0::/\n")
    v1 = tmp_path / "cg" / "memory" / "jobs" / "a"
    v1.mkdir(parents=True)
    (v1 / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 7\n")
    assert oom_kills(tmp_path / "proc", tmp_path / "cg") == 7
    (proc / "cgroup").write_text("0::/slice/b\n")
    v2 = tmp_path / "cg" / "slice" / "b"
    v2.mkdir(parents=True)
    (v2 / "memory.events").write_text("low 0\nhigh 0\nmax 4\noom 2\noom_kill 2\n")
    assert oom_kills(tmp_path / "proc", tmp_path / "cg") == 2
    (proc / "cgroup").write_text("1:cpu:/x\n")
    assert oom_kills(tmp_path / "proc", tmp_path / "cg") is None


def test_an_elastic_restart_is_announced_by_rank_zeros_launcher_only() -> None:
    restarts: list[tuple[int, str]] = []

    def announce(count: int, reason: str, env: Mapping[str, str]) -> None:
        restarts.append((count, reason))

    env = {**os.environ, "TORCHELASTIC_RESTART_COUNT": "2", "TORCHELASTIC_MAX_RESTARTS": "3", "RANK": "0"}
    assert run([sys.executable, "-c", "pass"], env=env, report_restart=announce) == 0
    assert restarts == [
        (2, "torchrun's elastic agent restarted the workers (restart 2 of 3) after a worker failed")
    ]
    run([sys.executable, "-c", "pass"], env={**env, "RANK": "1"}, report_restart=announce)
    run(
        [sys.executable, "-c", "pass"],
        env={**env, "TORCHELASTIC_RESTART_COUNT": "0"},
        report_restart=announce,
    )
    assert len(restarts) == 1, "other ranks and a first attempt announce nothing"
