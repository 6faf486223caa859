"""Fixtures of the worker tests: `ranksight worker` on the default runtime, and on both where the Faust
adapter keeps its focused set (start, kill -9 and restore, bad input, a group move)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from streams.runtime.options import DEFAULT_RUNTIME, RUNTIMES
from tests.integration.streams.harness import Worker


@pytest.fixture
def worker(
    kafka_bootstrap: str, topic_prefix: str, topics: dict[str, str], tmp_path: Path
) -> Iterator[Worker]:
    """A worker on the default runtime, stopped after the test."""
    w = Worker(kafka_bootstrap, topic_prefix, tmp_path, DEFAULT_RUNTIME)
    try:
        yield w
    finally:
        w.stop()


@pytest.fixture(params=RUNTIMES)
def any_worker(
    kafka_bootstrap: str,
    topic_prefix: str,
    topics: dict[str, str],
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> Iterator[Worker]:
    """A worker on each runtime (the Faust adapter's focused set), stopped after the test."""
    w = Worker(kafka_bootstrap, topic_prefix, tmp_path, request.param)
    try:
        yield w
    finally:
        w.stop()
