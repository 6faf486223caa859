"""The UI's admission gate and finished-job cache, driven without a server."""

from __future__ import annotations

import asyncio

import pytest

from ui.limits import Overloaded, PageCache, QueryGate


def test_the_gate_admits_the_running_lets_the_waiting_wait_and_refuses_the_rest_at_once() -> None:
    """One turn, one waiter: the third request is refused without waiting; the waiter gets the turn after."""

    async def scenario() -> list[str]:
        gate = QueryGate(running=1, waiting=1, wait_s=30)
        release = asyncio.Event()
        order: list[str] = []

        async def holder() -> None:
            async with gate.turn():
                order.append("first in")
                await release.wait()

        async def waiter() -> None:
            async with gate.turn():
                order.append("waiter in")

        first = asyncio.create_task(holder())
        await asyncio.sleep(0)
        second = asyncio.create_task(waiter())
        while gate.queued < 1:
            await asyncio.sleep(0)
        with pytest.raises(Overloaded) as refused:
            async with gate.turn():
                order.append("third in")
        assert refused.value.retry_after_s == 30
        order.append("third refused")
        release.set()
        await asyncio.gather(first, second)
        assert (gate.busy, gate.queued, gate.refused) == (0, 0, 1)
        return order

    assert asyncio.run(scenario()) == ["first in", "third refused", "waiter in"]


def test_a_waiter_whose_turn_does_not_come_in_time_is_refused() -> None:
    """A request waits at most `wait_s` for a turn, then is answered Overloaded."""

    async def scenario() -> None:
        gate = QueryGate(running=1, waiting=4, wait_s=0.05)
        release = asyncio.Event()

        async def holder() -> None:
            async with gate.turn():
                await release.wait()

        task = asyncio.create_task(holder())
        await asyncio.sleep(0)
        with pytest.raises(Overloaded):
            async with gate.turn():
                pass
        assert gate.queued == 0 and gate.refused == 1
        release.set()
        await task
        async with gate.turn():  # the turn is free again
            assert gate.busy == 1

    asyncio.run(scenario())


def test_the_cache_answers_only_while_the_fingerprint_holds() -> None:
    """Same fingerprint: a hit; a moved fingerprint (a late row, a restart): a miss, and the old answer is gone."""
    cache = PageCache(max_bytes=1000)
    cache.put(("job", "j"), ("completed", 3, 100), "answer")
    assert cache.get(("job", "j"), ("completed", 3, 100)) == "answer"
    assert cache.get(("job", "j"), ("completed", 3, 101)) is None
    assert cache.get(("job", "j"), ("completed", 3, 100)) is None
    assert (cache.hits, cache.misses) == (1, 2)


def test_the_cache_evicts_the_least_recently_used_beyond_its_budget() -> None:
    """Within a byte budget, the entry read last stays; one bigger than the budget is never kept."""
    cache = PageCache(max_bytes=10)
    cache.put("a", 1, "aaaa")
    cache.put("b", 1, "bbbb")
    assert cache.get("a", 1) == "aaaa"  # a is now the most recent
    cache.put("c", 1, "cccc")  # 12 bytes: b goes
    assert cache.get("b", 1) is None and cache.get("a", 1) == "aaaa" and cache.get("c", 1) == "cccc"
    cache.put("huge", 1, "x" * 11)
    assert cache.get("huge", 1) is None and len(cache) == 2
