"""Fixtures of the sink tests: a private chDB directory per test, closed afterwards."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from clickhouse_connect.driver.client import Client

from sinks.clickhouse import close, connect
from sinks.ddl import migrate


@pytest.fixture
def chdb_dsn(tmp_path: Path) -> Iterator[str]:
    """A `chdb:///...` DSN of an empty directory; the client is closed after the test (one engine per process)."""
    dsn = f"chdb://{tmp_path / 'chdb'}"
    yield dsn
    close(dsn)


@pytest.fixture
def chdb(chdb_dsn: str) -> Client:
    """A migrated chDB client."""
    client = connect(chdb_dsn)
    migrate(client)
    return client
