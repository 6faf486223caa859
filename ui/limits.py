"""How the UI stays responsive under load: a gate on concurrent store queries and a cache of finished jobs.

A page's queries run on worker threads against one ClickHouse client (chDB runs them in this
process, one at a time per client). Without a bound, 200 concurrent page requests queued for up to
27 s each. `QueryGate` lets `running` requests query at once, lets `waiting` more wait up to
`wait_s` for a turn, and refuses the rest at once with `Overloaded` (the server answers 503 with
`Retry-After`): a browser or proxy retries later instead of holding a connection open.

`PageCache` keeps the answers of pages that cannot change: a finished job's panels (its last state
is terminal and its rows stopped moving). Each entry carries the job's fingerprint (last state,
state changes, step rows, alert rows); an answer is reused only while the fingerprint read from
the store is the same, so a restarted job or a late row is never served stale. Entries are
evicted least recently used beyond a byte budget.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Hashable

from ui.errors import UiError

__all__ = [
    "DEFAULT_CACHE_BYTES",
    "DEFAULT_MAX_QUERIES",
    "DEFAULT_QUEUE_WAIT_S",
    "Overloaded",
    "PageCache",
    "QueryGate",
]

# Requests that query the store at once (`ranksight ui --max-queries`). chDB answers one query at
# a time per client anyway; a ClickHouse server gains from a few more.
DEFAULT_MAX_QUERIES = 4
# How long a request may wait for its turn before it is answered 503 (a page load, not a timeout).
DEFAULT_QUEUE_WAIT_S = 5.0
# Answers of finished jobs kept (a 512-rank, 2-hour job page is about 5 MB of JSON).
DEFAULT_CACHE_BYTES = 128 * 1024 * 1024


class Overloaded(UiError):
    """Too many requests are waiting for the store: try again after `retry_after_s` seconds."""

    def __init__(self, retry_after_s: int) -> None:
        self.retry_after_s = retry_after_s
        super().__init__(f"the UI is busy answering other requests: retry in {retry_after_s} s")


class QueryGate:
    """At most `running` holders at once, at most `waiting` more waiting up to `wait_s`; the rest refused.

    Turns pass first come, first served: a finished holder hands its turn straight to the oldest
    waiter. Used from one event loop (the server's); not thread-safe.
    """

    def __init__(
        self,
        running: int = DEFAULT_MAX_QUERIES,
        waiting: int | None = None,
        wait_s: float = DEFAULT_QUEUE_WAIT_S,
    ) -> None:
        if running < 1:
            raise UiError("the UI needs at least one concurrent query (--max-queries >= 1)")
        self.running = running
        self.waiting = 2 * running if waiting is None else waiting
        self.wait_s = wait_s
        self._free = running
        self._queue: deque[asyncio.Future[None]] = deque()
        self.refused = 0  # how many requests were answered 503 (for logs and tests)

    @property
    def retry_after_s(self) -> int:
        """What a refused request is told: about one full wait."""
        return max(1, round(self.wait_s))

    @property
    def busy(self) -> int:
        """Holders now."""
        return self.running - self._free

    @property
    def queued(self) -> int:
        """Requests waiting for a turn now."""
        return len(self._queue)

    def _refuse(self) -> Overloaded:
        self.refused += 1
        return Overloaded(self.retry_after_s)

    def _release(self) -> None:
        while self._queue:
            waiter = self._queue.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the turn passes on, `_free` unchanged
                return
        self._free += 1

    @contextlib.asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        """Hold one of the `running` turns for the block; `Overloaded` when none comes in time."""
        if self._free > 0 and not self._queue:
            self._free -= 1
        elif len(self._queue) >= self.waiting:
            raise self._refuse()
        else:
            granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._queue.append(granted)
            try:
                await asyncio.wait_for(asyncio.shield(granted), self.wait_s)
            except (TimeoutError, asyncio.CancelledError) as exc:
                if granted.done() and not granted.cancelled():
                    # The turn came as the wait ended: keep it if still wanted, else pass it on.
                    if isinstance(exc, asyncio.CancelledError):
                        self._release()
                        raise
                else:
                    self._queue.remove(granted)
                    granted.cancel()
                    if isinstance(exc, asyncio.CancelledError):
                        raise
                    raise self._refuse() from None
        try:
            yield
        finally:
            self._release()


class PageCache:
    """Answers (JSON text) by key, valid while their fingerprint holds; LRU beyond `max_bytes`."""

    def __init__(self, max_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[Hashable, tuple[Hashable, str]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()  # filled from worker threads
        self.hits = 0
        self.misses = 0

    def get(self, key: Hashable, fingerprint: Hashable) -> str | None:
        """The answer stored under `key` with this very fingerprint, else None (a stale one is dropped)."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry[0] != fingerprint:
                if entry is not None:
                    self._drop(key)
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return entry[1]

    def put(self, key: Hashable, fingerprint: Hashable, text: str) -> None:
        """Keep an answer (one larger than the whole budget is not kept)."""
        size = len(text)
        if size > self.max_bytes:
            return
        with self._lock:
            if key in self._entries:
                self._drop(key)
            self._entries[key] = (fingerprint, text)
            self._bytes += size
            while self._bytes > self.max_bytes:
                self._drop(next(iter(self._entries)))

    def _drop(self, key: Hashable) -> None:
        _, text = self._entries.pop(key)
        self._bytes -= len(text)

    def __len__(self) -> int:
        return len(self._entries)
