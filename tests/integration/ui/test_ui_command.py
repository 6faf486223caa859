"""`ranksight ui` as a user runs it: serves the store, and says in one sentence when chDB is held elsewhere."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx


def test_a_second_process_on_the_same_chdb_store_is_told_to_use_serve(tmp_path: Path) -> None:
    """The first `ranksight ui` serves; a second one on the store exits 2 with one sentence; Ctrl-C stops the first."""
    env = {**os.environ, "CLICKHOUSE_URL": f"chdb://{tmp_path / 'chdb'}"}
    cli = [sys.executable, "-m", "ranksight.cli", "ui", "--port", "0"]
    first = subprocess.Popen(cli, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert first.stdout is not None
        line = first.stdout.readline()  # blocks until the UI listens (or the process ends)
        assert "ranksight UI on http://127.0.0.1:" in line, line + (
            first.stderr.read() if first.stderr else ""
        )
        url = line.split(" on ", 1)[1].split()[0]
        assert httpx.get(f"{url}api/fleet", timeout=30).json()["jobs"] == []
        second = subprocess.run(cli, env=env, capture_output=True, text=True, timeout=120)
        assert second.returncode == 2
        assert "ranksight serve" in second.stderr and "Traceback" not in second.stderr
        assert len(second.stderr.strip().splitlines()) <= 2  # one sentence (the console may wrap it)
        first.send_signal(signal.SIGINT)
        try:
            out, err = first.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            first.send_signal(signal.SIGUSR1)  # faulthandler: every thread's stack on stderr
            time.sleep(2)  # for the dump to be written; the process does not stop by itself
            first.kill()
            _, err = first.communicate(timeout=10)
            raise AssertionError(
                f"the UI did not stop within 60 s of SIGINT; its threads:\n{err[-6000:]}"
            ) from None
        assert "UI stopped" in out
        assert first.returncode == 0 and "Traceback" not in err
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(10)


def _ignore_sigint() -> None:
    # What `cmd &` in a non-interactive shell (or nohup) hands a program: SIGINT ignored.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def test_the_ui_stops_on_sigint_it_inherited_ignored_and_on_sigterm(tmp_path: Path) -> None:
    """Started with SIGINT ignored, `ranksight ui` still stops on SIGINT; and on SIGTERM; both within 5 s + start-up slack."""
    env = {**os.environ, "CLICKHOUSE_URL": f"chdb://{tmp_path / 'chdb'}"}
    cli = [sys.executable, "-m", "ranksight.cli", "ui", "--port", "0"]
    for sig in (signal.SIGINT, signal.SIGTERM):
        process = subprocess.Popen(
            cli, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_ignore_sigint
        )
        try:
            assert process.stdout is not None
            assert "ranksight UI on http://" in process.stdout.readline()
            process.send_signal(sig)
            out, err = process.communicate(timeout=60)
            assert "UI stopped" in out and "Traceback" not in err, (sig, out, err)
            assert process.returncode == 0, (sig, process.returncode, err)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait(10)
