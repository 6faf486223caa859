"""Fixtures for the command-line tests: a private home and a process that looks like a running broker."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh RANKSIGHT_HOME with no KAFKA_BOOTSTRAP in the environment."""
    path = tmp_path / "home"
    monkeypatch.setenv("RANKSIGHT_HOME", str(path))
    monkeypatch.delenv("KAFKA_BOOTSTRAP", raising=False)
    monkeypatch.delenv("RANKSIGHT_KAFKA_BOOTSTRAP", raising=False)
    monkeypatch.delenv("RANKSIGHT_TOPIC_PREFIX", raising=False)
    return path


@pytest.fixture
def closed_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def local_broker_state(home: Path, closed_port: int) -> Iterator[str]:
    """The state `ranksight kafka up` leaves behind, for a live process; its address answers nothing.

    The process is a sleeping Python whose command line names the broker config, which is how
    `infra.kafka.local` recognises its broker: resolution is tested without starting a JVM.
    """
    state_dir = home / "kafka"
    state_dir.mkdir(parents=True)
    config = state_dir / "kafka" / "server.properties"
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", str(config)])
    bootstrap = f"127.0.0.1:{closed_port}"
    state = {"pid": process.pid, "bootstrap": bootstrap, "config": str(config), "started_at": time.time()}
    (state_dir / "kafka.json").write_text(json.dumps(state))
    try:
        yield bootstrap
    finally:
        process.kill()
        process.wait(10)
