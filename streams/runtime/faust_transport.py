"""Faust's aiokafka transport with a short fetch wait (the one Faust setting it hard-codes).

aiokafka keeps one fetch request in flight per broker. A partition whose fetched records are still
being processed is left out of the next request, so once the worker has drained it, it waits for
the request in flight to return; a request whose partitions are all empty or caught up returns
after `fetch_max_wait_ms`, which Faust fixes at 1,500 ms. A catch-up therefore stalled up to 1.5 s
at a time on one input partition while the aligner held every other one (bench/bench_worker.py:
a third of the worker's time was the event loop waiting). `FETCH_MAX_WAIT_MS` bounds that wait.
"""

from __future__ import annotations

from typing import Any

import aiokafka
import faust
from faust.transport.drivers import aiokafka as faust_aiokafka

__all__ = ["FETCH_MAX_WAIT_MS", "App"]

FETCH_MAX_WAIT_MS = 100


class _ConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    def _create_worker_consumer(self, transport: Any) -> aiokafka.AIOKafkaConsumer:
        consumer = super()._create_worker_consumer(transport)
        # Read by AIOKafkaConsumer.start() when it creates its fetcher (not started yet here).
        consumer._fetch_max_wait_ms = FETCH_MAX_WAIT_MS
        return consumer


class _Consumer(faust_aiokafka.Consumer):
    def _new_consumer_thread(self) -> faust_aiokafka.AIOKafkaConsumerThread:
        return _ConsumerThread(self, loop=self.loop, beacon=self.beacon)


class _Transport(faust_aiokafka.Transport):
    Consumer = _Consumer


class App(faust.App):
    """`faust.App` whose consumer waits at most `FETCH_MAX_WAIT_MS` for an empty fetch."""

    def _new_transport(self) -> Any:
        return _Transport(self.conf.broker_consumer, self)
