"""Opening ClickHouse through clickhouse-connect: chDB in process (`chdb:///dir`) or a server (`http://...`).

chDB hosts one engine per process and one process per directory. Inside a process every
client on the same directory shares the engine, and clickhouse-connect serialises calls on
one client with a lock, so `connect()` hands out one cached client per DSN and that client
may be shared by threads (a sink thread inserting, the main thread querying). A second
process opening the same directory fails; that failure becomes `ClickHouseLockedError`.

A server older than `MIN_SERVER_VERSION` fails with one sentence saying so; without the check
clickhouse-connect's first query fails on an old server with "Unknown identifier: readonly".
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import threading
import urllib.request
from collections.abc import Iterator
from typing import Any
from urllib.parse import unquote, urlencode, urlparse

import clickhouse_connect
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import ClickHouseError as _DriverError
from clickhouse_connect.driver.exceptions import OperationalError

from sinks.errors import ClickHouseError, ClickHouseLockedError, ClickHouseUnavailableError

__all__ = [
    "MIN_SERVER_VERSION",
    "Client",
    "chdb_path",
    "close",
    "close_all",
    "connect",
    "describe_dsn",
    "held_by_another_process",
    "is_chdb",
]

# insert_deduplication_token (22.2) and clickhouse-connect's start-up queries; 22.8 is the oldest LTS since.
MIN_SERVER_VERSION = (22, 8)
_VERSION_RE = re.compile(r"^(\d+)\.(\d+)")

_clients: dict[str, Client] = {}
_lock = threading.Lock()

# Some chDB builds put ClickHouse error 76 (on the `status` file) into the message; others only print it.
_LOCKED_MARKERS = ("Another server instance in same directory is already running", "Cannot lock file")
_OTHER_PATH_MARKER = "EmbeddedServer already initialized with path"


def is_chdb(dsn: str) -> bool:
    """True for an in-process chDB DSN (`chdb:///dir` or `chdb://memory`)."""
    return dsn.startswith("chdb:")


def chdb_path(dsn: str) -> str | None:
    """The absolute directory of a `chdb:///dir` DSN; None for memory or server DSNs."""
    if not is_chdb(dsn):
        return None
    parsed = urlparse(dsn)
    if parsed.netloc in ("memory", ":memory:") or not parsed.path:
        return None
    return os.path.realpath(parsed.path)


def describe_dsn(dsn: str) -> str:
    """A DSN for messages and logs, password hidden."""
    if is_chdb(dsn):
        return f"chdb:{chdb_path(dsn) or 'memory'}"
    parsed = urlparse(dsn)
    host = parsed.hostname or "localhost"
    port = f":{parsed.port}" if parsed.port else ""
    return f"{parsed.scheme}://{host}{port}{parsed.path}"


def _key(dsn: str) -> str:
    path = chdb_path(dsn)
    return f"chdb:{path}" if path is not None else dsn


def connect(dsn: str, **settings: Any) -> Client:
    """The process-wide client for a DSN, opened on first use (thread-safe to share)."""
    key = _key(dsn)
    with _lock:
        client = _clients.get(key)
        if client is None:
            client = _open(dsn, settings)
            _clients[key] = client
        return client


def held_by_another_process(path: str) -> bool:
    """True when another process holds the chDB directory (its `status` file is flock-ed while open)."""
    try:
        fd = os.open(os.path.join(path, "status"), os.O_RDONLY)
    except OSError:
        return False  # no status file: nobody has the directory open
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


@contextlib.contextmanager
def _quiet_stderr(enabled: bool) -> Iterator[None]:
    # chDB prints the lock failure on the process's stderr itself; the caller reports it in one sentence.
    if not enabled:
        yield
        return
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def _open(dsn: str, settings: dict[str, Any]) -> Client:
    if is_chdb(dsn):
        path = chdb_path(dsn)
        locked = False
        if path is not None:
            os.makedirs(path, exist_ok=True)
            locked = held_by_another_process(path)
        try:
            # Opened even when the lock is taken: the holder may be this very process (a client made
            # without `connect()`), and then chDB shares the engine.
            with _quiet_stderr(locked):
                return clickhouse_connect.get_client(dsn=dsn, settings=settings or None)
        except _DriverError as exc:
            text = str(exc)
            if path is not None and (locked or held_by_another_process(path)):
                raise ClickHouseLockedError(path) from exc
            if any(marker in text for marker in _LOCKED_MARKERS):
                raise ClickHouseLockedError(path or "memory") from exc
            if _OTHER_PATH_MARKER in text:
                raise ClickHouseError(
                    f"this process already has another chDB directory open, so it cannot open {path}: "
                    "chDB hosts one directory per process (close the other client first)"
                ) from exc
            raise ClickHouseError(f"cannot open chDB at {path or 'memory'}: {text}") from exc
    try:
        # A session id would make concurrent queries on the shared client fail ("session is locked").
        client = clickhouse_connect.get_client(
            dsn=dsn, settings=settings or None, autogenerate_session_id=False
        )
    except OperationalError as exc:
        raise ClickHouseUnavailableError(describe_dsn(dsn), str(exc).splitlines()[0]) from exc
    except _DriverError as exc:
        # An old server fails clickhouse-connect's start-up queries: ask it its version plainly.
        _require_version(dsn, _http_version(dsn))
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ClickHouseError(f"cannot open ClickHouse at {describe_dsn(dsn)}: {first}") from exc
    _require_version(dsn, client.server_version)
    return client


def _require_version(dsn: str, version: str | None) -> None:
    match = _VERSION_RE.match(version or "")
    if match and (int(match.group(1)), int(match.group(2))) < MIN_SERVER_VERSION:
        needed = ".".join(map(str, MIN_SERVER_VERSION))
        raise ClickHouseError(
            f"the ClickHouse server at {describe_dsn(dsn)} is version {version}, too old: "
            f"ranksight needs ClickHouse {needed} or newer"
        )


def _http_version(dsn: str, timeout: float = 5.0) -> str | None:
    """`SELECT version()` over plain HTTP, without clickhouse-connect; None when that fails too."""
    parsed = urlparse(dsn)
    if parsed.scheme not in ("http", "https", "clickhouse", "clickhousedb"):
        return None
    scheme = "https" if parsed.scheme == "https" else "http"
    port = parsed.port or (8443 if scheme == "https" else 8123)
    url = f"{scheme}://{parsed.hostname or 'localhost'}:{port}/?{urlencode({'query': 'SELECT version()'})}"
    request = urllib.request.Request(url)
    if parsed.username:
        request.add_header("X-ClickHouse-User", unquote(parsed.username))
    if parsed.password:
        request.add_header("X-ClickHouse-Key", unquote(parsed.password))
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return str(response.read(64).decode(errors="replace").strip()) or None
    except (OSError, ValueError):
        return None


def close(dsn: str) -> None:
    """Close the cached client of a DSN (releases the chDB directory once no client holds it)."""
    with _lock:
        client = _clients.pop(_key(dsn), None)
    if client is not None:
        client.close()


def close_all() -> None:
    """Close every cached client."""
    with _lock:
        clients = list(_clients.values())
        _clients.clear()
    for client in clients:
        client.close()
