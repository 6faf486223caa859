"""A real Prometheus Alertmanager (Debian's prometheus-alertmanager, amtool included) per test.

Where it is not installed the tests fail with the reason when RANKSIGHT_REQUIRE_ALERTMANAGER=1
(CI sets it; `.ci/run` installs the package) and skip otherwise.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest


def _binary(*names: str) -> str | None:
    for name in names:
        found = shutil.which(name) or (f"/usr/bin/{name}" if Path("/usr/bin", name).exists() else None)
        if found:
            return found
    return None


def _unavailable(reason: str) -> None:
    if os.environ.get("RANKSIGHT_REQUIRE_ALERTMANAGER") == "1":
        pytest.fail(
            f"a real Alertmanager is required (RANKSIGHT_REQUIRE_ALERTMANAGER=1) but {reason}", pytrace=False
        )
    pytest.skip(f"no local Alertmanager: {reason} (apt-get install prometheus-alertmanager)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Alertmanager:
    """A running Alertmanager: its URL and log."""

    url: str
    log: Path

    def logs(self) -> str:
        """The tail of its log, for failure messages."""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-20:])


@pytest.fixture(scope="session")
def amtool() -> str:
    """Path of `amtool` (shipped with Debian's prometheus-alertmanager)."""
    path = _binary("amtool")
    if path is None:
        _unavailable("amtool is not installed")
    assert path is not None
    return path


@pytest.fixture
def start_alertmanager(tmp_path: Path) -> Iterator[Callable[[Path], Alertmanager]]:
    """Starts Alertmanager with a config file on a free loopback port; stopped after the test."""
    binary = _binary("prometheus-alertmanager", "alertmanager")
    if binary is None:
        _unavailable("prometheus-alertmanager is not installed")
    assert binary is not None
    procs: list[subprocess.Popen[bytes]] = []

    def start(config: Path) -> Alertmanager:
        port = _free_port()
        log = tmp_path / f"alertmanager-{port}.log"
        proc = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.path={tmp_path / f'am-data-{port}'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--cluster.listen-address=",  # no gossip: a single instance
            ],
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
        )
        procs.append(proc)
        am = Alertmanager(f"http://127.0.0.1:{port}", log)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise AssertionError(f"alertmanager exited {proc.returncode}:\n{am.logs()}")
            try:
                if httpx.get(f"{am.url}/-/ready", timeout=2).status_code == 200:
                    return am
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"alertmanager not ready within 60 s:\n{am.logs()}")

    yield start
    for proc in procs:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
