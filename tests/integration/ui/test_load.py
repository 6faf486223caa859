"""The UI under load: a bounded number of store queries, 503 + Retry-After beyond, nothing hangs."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections import Counter
from collections.abc import Iterator

import httpx
import pytest

from tests.integration.ui.conftest import STRAGGLER_JOB, UiStore
from ui.server import GATE, UiServer


@pytest.fixture
def one_query_ui(ui_store: UiStore) -> Iterator[UiServer]:
    """The UI with one concurrent query and two waiting requests at most (waiting up to 60 s)."""
    server = UiServer(ui_store.client, "127.0.0.1", 0, max_queries=1, queue_wait_s=60)
    server.start()
    yield server
    server.stop()


def _get_all(url: str, n: int) -> list[httpx.Response]:
    with concurrent.futures.ThreadPoolExecutor(n) as pool, httpx.Client(timeout=120) as http:
        return list(pool.map(lambda _: http.get(url), range(n)))


def test_beyond_the_running_and_waiting_requests_the_ui_answers_503_with_retry_after(
    one_query_ui: UiServer,
) -> None:
    """With the one query turn held, 2 of 20 concurrent page requests wait and 18 get 503 at once; then all 200."""
    gate = one_query_ui.app[GATE]
    loop = one_query_ui.loop
    assert loop is not None
    release = asyncio.Event()
    held = concurrent.futures.Future[None]()

    async def hold() -> None:
        async with gate.turn():
            held.set_result(None)
            await release.wait()

    holder = asyncio.run_coroutine_threadsafe(hold(), loop)
    held.result(30)
    url = f"{one_query_ui.url}api/jobs/{STRAGGLER_JOB}"
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        burst = pool.submit(_get_all, url, 20)
        # Progress, not time: the 18 refusals come back while the turn is still held.
        while gate.refused < 18 or gate.queued < 2:
            assert not burst.done(), "the burst ended while the turn was held"
            concurrent.futures.wait([burst], timeout=0.05)
        loop.call_soon_threadsafe(release.set)
        responses = burst.result(240)
    holder.result(30)
    statuses = Counter(r.status_code for r in responses)
    assert statuses == {503: 18, 200: 2}, statuses
    for r in responses:
        if r.status_code == 503:
            assert int(r.headers["Retry-After"]) >= 1 and "busy" in r.json()["error"]
        else:
            assert r.json()["job"]["job_id"] == STRAGGLER_JOB


def test_a_burst_of_requests_never_hangs(ui_store: UiStore) -> None:
    """60 concurrent page and fleet requests: every one answers (200, or 503 with Retry-After), none waits out the client."""
    server = UiServer(ui_store.client, "127.0.0.1", 0, max_queries=2, queue_wait_s=2)
    url = server.start()
    try:
        urls = [f"{url}api/jobs/{STRAGGLER_JOB}", f"{url}api/fleet", f"{url}api/version"] * 20
        with concurrent.futures.ThreadPoolExecutor(60) as pool, httpx.Client(timeout=120) as http:
            responses = list(pool.map(http.get, urls))
        statuses = Counter(r.status_code for r in responses)
        assert set(statuses) <= {200, 503} and statuses[200] >= 2, statuses
        assert all("Retry-After" in r.headers for r in responses if r.status_code == 503)
    finally:
        server.stop()
