"""The node agent loop: every interval, one GpuSample per GPU and one HostSample, on a drift-free schedule.

Ticks are at `start + k * interval` (monotonic clock), not `last + interval`, so sampling cost
does not accumulate into drift; when a tick is missed (the host stalled) the agent skips to the
next future tick rather than bursting. XID / ECC events are published from the watcher thread
as soon as NVML reports them. With an `Attributor`, each GPU sample carries the job (and run)
holding the GPU, and the host sample every job on the node; GPUs no job claims are still published.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from producers.agent.attribution import Attributor
from producers.agent.gpu import GpuSampler, XidWatcher
from producers.agent.host import HostSampler
from producers.publisher import Publisher
from schemas.records import Event

__all__ = ["Agent", "AgentStats", "next_tick"]

log = logging.getLogger(__name__)


def next_tick(start: float, interval: float, now: float) -> tuple[int, float]:
    """The index and time of the first tick at `start + k * interval` strictly after `now`."""
    k = int((now - start) // interval) + 1
    return k, start + k * interval


@dataclass
class AgentStats:
    """What the agent did: ticks, samples, ticks skipped because the host stalled, XID events."""

    ticks: int = 0
    gpu_samples: int = 0
    host_samples: int = 0
    skipped_ticks: int = 0
    xid_events: int = 0
    sample_errors: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


class Agent:
    """Samples GPUs (optional) and the host each `interval` seconds and publishes the records."""

    def __init__(
        self,
        publisher: Publisher,
        *,
        host: HostSampler | None,
        gpus: GpuSampler | None,
        interval: float = 1.0,
        watch_xid: bool = True,
        attributor: Attributor | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        wall_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    ) -> None:
        if interval <= 0:
            raise ValueError("interval must be positive")
        self.publisher = publisher
        self.host = host
        self.gpus = gpus
        self.interval = interval
        self.attributor = attributor
        self.monotonic = monotonic
        self.wall_ms = wall_ms
        self.stats = AgentStats()
        self._stop = threading.Event()
        self.watcher: XidWatcher | None = None
        if gpus is not None and watch_xid:
            try:
                self.watcher = XidWatcher(gpus, self._on_gpu_event)
            except gpus.nvml.NVMLError as exc:
                log.warning("cannot watch XID/ECC events (%s); sampling continues without them", exc)

    def _on_gpu_event(self, index: int, xid: int | None) -> None:
        """An XID or ECC event: publish a fresh sample of that GPU immediately, with `xid` set."""
        assert self.gpus is not None
        record = self.gpus.sample_one(index, self.wall_ms(), self.monotonic(), xid=xid)
        self._stamp(record)
        self.stats.xid_events += 1
        self.publisher.publish(Event("GpuSample", record))
        log.warning("GPU %d: %s", index, f"XID {xid}" if xid is not None else "ECC error event")

    def tick(self) -> None:
        """Take one round of samples and publish them."""
        ts, now = self.wall_ms(), self.monotonic()
        if self.gpus is not None:
            records = self.gpus.sample(ts, now)
            self._attribute(now)
            for record in records:
                self._stamp(record)
                self.publisher.publish(Event("GpuSample", record))
                self.stats.gpu_samples += 1
        elif self.attributor is not None and self.attributor.due(now):
            self.attributor.refresh([], now)
        if self.host is not None:
            try:
                record = self.host.sample(ts, now)
            except (OSError, RuntimeError) as exc:
                self.stats.sample_errors += 1
                log.warning("host sampling failed: %s", exc)
            else:
                if self.attributor is not None:
                    record["job_ids"] = self.attributor.job_ids()
                self.publisher.publish(Event("HostSample", record))
                self.stats.host_samples += 1
        self.stats.ticks += 1

    def _attribute(self, now: float) -> None:
        attributor, gpus = self.attributor, self.gpus
        if attributor is None or gpus is None or not attributor.due(now):
            return
        try:
            attributor.refresh([(gpus.uuids[i], gpus.pids(i)) for i in range(gpus.count)], now)
        except Exception as exc:  # attribution is best effort: telemetry goes out regardless
            self.stats.sample_errors += 1
            log.warning("job attribution failed: %s", exc)

    def _stamp(self, record: dict[str, Any]) -> None:
        ref = self.attributor.job_for(record["gpu_uuid"]) if self.attributor is not None else None
        if ref is not None:
            record["job_id"] = ref.job_id
            record["run_id"] = ref.run_id

    def run(
        self, count: int | None = None, on_tick: Callable[[AgentStats], None] | None = None
    ) -> AgentStats:
        """Tick every interval until `stop()` or `count` ticks; returns the stats."""
        if self.watcher is not None:
            self.watcher.start()
        start = self.monotonic()
        k = 0
        try:
            while not self._stop.is_set():
                self.tick()
                if on_tick is not None:
                    on_tick(self.stats)
                if count is not None and self.stats.ticks >= count:
                    break
                now = self.monotonic()
                next_k, due = next_tick(start, self.interval, now)
                self.stats.skipped_ticks += max(0, next_k - k - 1)
                k = next_k
                self._stop.wait(max(0.0, due - now))
        finally:
            if self.watcher is not None:
                self.watcher.stop()
        return self.stats

    def stop(self) -> None:
        """Ask `run` to return after the current tick."""
        self._stop.set()
