"""Shared pytest fixtures: the Kafka broker, per-test topics and consumer groups."""

from __future__ import annotations

import contextlib
import gc
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from infra.errors import KafkaSetupError
from infra.kafka.local import LocalKafka, ensure_jars
from infra.kafka.topics import create_topics, delete_topics, prefixed
from streams import gc_policy

_INTEGRATION_DIR = Path(__file__).parent / "integration"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test under tests/integration/ carries the `integration` marker."""
    for item in items:
        if _INTEGRATION_DIR in item.path.parents:
            item.add_marker(pytest.mark.integration)


@pytest.fixture(autouse=True)
def _python_collector() -> Iterator[None]:
    """A command run in-process (`ranksight replay`) sets the worker's collector policy for the
    whole process (streams/gc_policy.py): every test after it gets Python's own collector back."""
    yield
    gc_policy.python_default()
    if gc.get_freeze_count():
        gc.unfreeze()


@pytest.fixture(scope="session", autouse=True)
def _private_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """No test writes into the real per-user data dir: RANKSIGHT_HOME and XDG_DATA_HOME are temp dirs."""
    base = tmp_path_factory.mktemp("home")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RANKSIGHT_HOME", str(base / "ranksight"))
        patch.setenv("XDG_DATA_HOME", str(base / "xdg"))
        yield


# --- Kafka -------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def local_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka | None]:
    """The session's own broker, or None when KAFKA_BOOTSTRAP points at an existing one."""
    if os.environ.get("KAFKA_BOOTSTRAP"):
        yield None
        return
    broker = LocalKafka(tmp_path_factory.mktemp("kafka"), libs=ensure_jars())
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def kafka_bootstrap(local_kafka: LocalKafka | None) -> str:
    """Bootstrap servers of the session broker: KAFKA_BOOTSTRAP, or a local broker started for the session."""
    return local_kafka.bootstrap if local_kafka is not None else os.environ["KAFKA_BOOTSTRAP"]


@pytest.fixture
def restartable_kafka(tmp_path: Path) -> Iterator[LocalKafka]:
    """A private broker this test may stop and start again (data and port survive); stopped afterwards."""
    broker = LocalKafka(tmp_path / "kafka", libs=ensure_jars())
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture
def topic_prefix() -> str:
    """A prefix unique to this test, e.g. `t1a2b3c4d.`."""
    return f"t{uuid.uuid4().hex[:8]}."


@pytest.fixture
def topics(kafka_bootstrap: str, topic_prefix: str) -> Iterator[dict[str, str]]:
    """This test's own copy of every topic: canonical name -> prefixed name; deleted afterwards."""
    create_topics(kafka_bootstrap, prefix=topic_prefix)
    names = prefixed(topic_prefix)
    yield names
    # Best effort: a leftover topic on a shared cluster is untidy, not a test failure.
    with contextlib.suppress(KafkaSetupError):
        delete_topics(kafka_bootstrap, names.values())


@pytest.fixture
def group_id() -> str:
    """A consumer group id unique to this test."""
    return f"g-{uuid.uuid4().hex[:8]}"


# --- ClickHouse (chDB) -------------------------------------------------------------------------


@pytest.fixture
def chdb_dsn(tmp_path: Path) -> Iterator[str]:
    """A `chdb:///...` DSN of an empty directory; the client is closed after the test (one engine per process)."""
    from sinks.clickhouse import close

    dsn = f"chdb://{tmp_path / 'chdb'}"
    yield dsn
    close(dsn)


@pytest.fixture
def chdb(chdb_dsn: str) -> Any:
    """A migrated chDB client."""
    from sinks.clickhouse import connect
    from sinks.ddl import migrate

    client = connect(chdb_dsn)
    migrate(client)
    return client


# --- Fixtures of other packages go below, one section per package -------------------------------
