"""deploy/systemd: units systemd accepts, running ranksight commands the CLI accepts (issue 36.3).

`systemd-analyze verify` checks each unit (a worker template as one instance) with ExecStart
pointed at this environment's `ranksight` (the units name /opt/ranksight, which CI does not have);
any warning fails, not only errors. The command lines and the example environment file are
checked against the CLI and the settings like the Kubernetes manifests.
"""

from __future__ import annotations

import configparser
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ranksight.signals import HARD_EXIT_S
from tests.unit.deploy.invocations import parse_invocation, unknown_envvars

ROOT = Path(__file__).resolve().parents[3]
UNITS = sorted((ROOT / "deploy" / "systemd").glob("*.service"))
INSTALLED = "/opt/ranksight/bin/ranksight"


def _service(unit: Path) -> dict[str, list[str]]:
    parser = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(unit.read_text(encoding="utf-8"))
    return {key: [value] for key, value in parser["Service"].items()}


def _instance(unit: Path) -> str:
    return unit.name.replace("@.service", "@9465.service")


def test_units_verify(tmp_path: Path) -> None:
    """systemd-analyze verify accepts every unit without a warning."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        if os.environ.get("RANKSIGHT_REQUIRE_DEPLOY_TOOLS") == "1":
            pytest.fail("systemd-analyze is required here: apt-get install systemd", pytrace=False)
        pytest.skip("systemd-analyze is not installed (apt-get install systemd)")
    ranksight = Path(sys.executable).with_name("ranksight")
    assert ranksight.is_file(), f"no ranksight console script next to {sys.executable}"
    paths = []
    for unit in UNITS:
        text = unit.read_text(encoding="utf-8")
        assert f"ExecStart={INSTALLED} " in text, unit.name
        path = tmp_path / _instance(unit)
        path.write_text(text.replace(INSTALLED, str(ranksight)), encoding="utf-8")
        paths.append(str(path))
    done = subprocess.run(
        [analyze, "verify", "--man=no", *paths], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr


@pytest.mark.parametrize("unit", UNITS, ids=lambda p: p.name)
def test_unit_runs_a_valid_command_and_stops_in_time(unit: Path) -> None:
    """ExecStart parses with the CLI; systemd waits longer than the command's own stop deadline."""
    service = _service(unit)
    argv = shlex.split(service["ExecStart"][0].replace("%i", "9465"))
    assert argv[0] == INSTALLED
    parse_invocation(argv[1:])
    assert float(service["TimeoutStopSec"][0]) > HARD_EXIT_S
    assert service["KillSignal"] == ["SIGTERM"]


def test_example_environment_names_only_settings() -> None:
    """The example /etc/ranksight/ranksight.env sets only variables ranksight reads."""
    lines = (ROOT / "deploy" / "systemd" / "ranksight.env.example").read_text(encoding="utf-8").splitlines()
    names = {ln.split("=", 1)[0] for ln in lines if ln and not ln.startswith("#")}
    assert not unknown_envvars(names, ["worker"]), names
