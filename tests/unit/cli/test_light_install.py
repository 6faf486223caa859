"""What `pip install ranksight` (the light install, no `server` extra) runs, checked by running it.

Each command runs in a child interpreter where every package of the `server` extra fails to
import, as it would when not installed: the agent, the Kafka, spool, events and status commands
work; a server-side command says in one sentence what to install (issue 24.8).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ranksight.cli import SERVER_MODULES

REPO = Path(__file__).resolve().parents[3]

_LIGHT = """
import importlib.abc, sys
HEAVY = set(sys.argv[1].split(","))
class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HEAVY:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, NotInstalled())
from ranksight.cli import main
sys.argv = ["ranksight", *sys.argv[2:]]
main()
"""


def _light(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "RANKSIGHT_HOME": str(tmp_path / "home"), "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-c", _LIGHT, ",".join(sorted(SERVER_MODULES)), *args],
        env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip


def test_the_agent_and_the_file_commands_run_without_the_server_side(tmp_path: Path) -> None:
    out = tmp_path / "node.avro"
    agent = _light(tmp_path, "agent", "--simulate", "--gpus", "2", "--count", "2", "--interval", "0.05",
                   "--to", f"file://{out}")  # fmt: skip
    assert agent.returncode == 0, agent.stderr
    assert "sampled 2 intervals: 4 GPU samples, 2 host samples" in agent.stdout
    dumped = _light(tmp_path, "events", "dump", str(out))
    assert dumped.returncode == 0 and len(dumped.stdout.splitlines()) == 6, dumped.stderr
    assert _light(tmp_path, "spool", "list").returncode == 0
    assert _light(tmp_path, "--help").returncode == 0


@pytest.mark.parametrize(
    "args",
    [["sink"], ["ui"], ["sql", "SELECT 1"], ["simulate", "-s", "healthy", "-o", "x.avro"], ["evaluate"]],
    ids=lambda a: a[0],
)
def test_a_server_command_names_the_extra_in_one_sentence(tmp_path: Path, args: list[str]) -> None:
    done = _light(tmp_path, *args)
    assert done.returncode == 1
    assert "needs ranksight's server side" in done.stderr and "pip install 'ranksight[server]'" in done.stderr
    assert "Traceback" not in done.stderr, done.stderr
