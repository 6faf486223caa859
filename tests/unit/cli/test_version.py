"""The version is written once: `ranksight --version`, the package metadata and CHANGELOG.md agree."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from typer.testing import CliRunner

from ranksight import __version__
from ranksight.cli import app

ROOT = Path(__file__).resolve().parents[3]


def test_version_flag_prints_the_package_version() -> None:
    """`ranksight --version` prints `ranksight <version>` and exits 0 without running a command."""
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"ranksight {__version__}"


def test_pyproject_reads_the_version_from_the_package() -> None:
    """pyproject.toml holds no second copy of the version: setuptools reads `ranksight.__version__`."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert "version" not in project["project"]
    assert "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "ranksight.__version__"}


def test_changelog_newest_entry_is_this_version() -> None:
    """The first `## <version>` heading of CHANGELOG.md is the version being built."""
    headings = re.findall(r"^## (\d+\.\d+\.\d+)", (ROOT / "CHANGELOG.md").read_text(encoding="utf-8"), re.M)
    assert headings and headings[0] == __version__, headings
