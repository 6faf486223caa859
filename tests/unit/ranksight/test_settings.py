"""Where ranksight keeps its state: one per-user data directory, whatever the current directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ranksight.settings import Settings


def test_home_defaults_to_the_xdg_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANKSIGHT_HOME", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert Settings().home == tmp_path / "data" / "ranksight"


def test_without_xdg_the_home_is_under_local_share(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANKSIGHT_HOME", raising=False)
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert Settings().home == tmp_path / ".local" / "share" / "ranksight"


def test_a_relative_xdg_data_home_is_ignored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The XDG spec says so; a relative one would again depend on the current directory."""
    monkeypatch.delenv("RANKSIGHT_HOME", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", "relative/data")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert Settings().home == tmp_path / ".local" / "share" / "ranksight"


def test_the_store_is_the_same_from_any_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANKSIGHT_HOME", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    dsns = set()
    for where in ("a", "b"):
        (tmp_path / where).mkdir()
        monkeypatch.chdir(tmp_path / where)
        dsns.add(Settings().clickhouse_dsn())
    assert dsns == {f"chdb://{tmp_path / 'data' / 'ranksight' / 'chdb'}"}


def test_ranksight_home_still_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANKSIGHT_HOME", str(tmp_path / "mine"))
    assert Settings().home == tmp_path / "mine"


def test_the_test_session_never_writes_into_the_real_home() -> None:
    """tests/conftest.py points RANKSIGHT_HOME and XDG_DATA_HOME at temporary directories."""
    real = Path.home() / ".local" / "share"
    for name in ("RANKSIGHT_HOME", "XDG_DATA_HOME"):
        value = Path(os.environ[name])
        assert not value.is_relative_to(real), name
        assert not value.is_relative_to(Path.cwd()), name
