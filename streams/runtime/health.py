"""The worker's own health: its counters, the progress line, and the `/metrics` families.

Reads the core's counters (no Kafka here); the runtime calls `log_progress` every
`stats_interval_s` and `publish_metrics` every `METRICS_S`, and counts what it produced.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Mapping

from infra.metrics import Metric, MetricsServer
from schemas.topics import (
    SCHEDULER_STATES,
    TELEMETRY_JOB,
    TELEMETRY_UNATTRIBUTED,
    TRAINING_EVENTS,
    TRAINING_STEPS,
)
from streams.runtime.aligner import tp_key
from streams.runtime.core import WorkerCore
from streams.runtime.options import SOURCE_TOPICS
from streams.runtime.task import PartitionTask

__all__ = ["WorkerHealth", "worker_metrics"]

log = logging.getLogger("ranksight.worker")


class WorkerHealth:
    """Counters of one worker process, its progress line and its `/metrics` snapshot."""

    def __init__(self, core: WorkerCore, metrics_port: int) -> None:
        self.core = core
        self.produced: collections.Counter[str] = collections.Counter()  # per topic, unprefixed
        self.metrics_server = MetricsServer(metrics_port) if metrics_port else None
        self._last_line = (time.monotonic(), 0)  # when the last progress line went out, events then

    def counters(self) -> dict[str, int]:
        """The worker's totals plus every task's counters, summed."""
        # Every counter present even before any task exists (the first progress line).
        out = {**dict.fromkeys(PartitionTask.COUNTS, 0), **self.core.totals}
        for task in [*self.core.tasks.values(), *self.core.job_tasks.values()]:
            for k, v in task.counts.items():
                out[k] = out.get(k, 0) + v if k != "snapshot_bytes" else max(out.get(k, 0), v)
        # Source records (telemetry + training) this worker has fully handled: the bench's progress.
        out["source_events"] = out["telemetry_in"] + out["training_in"]
        return out

    def source_lag(self) -> dict[str, int | None]:
        """Per source topic: records of the assigned partitions not read yet (None while unknown)."""
        core = self.core
        left: dict[str, int | None] = dict.fromkeys(SOURCE_TOPICS, 0)
        for p in sorted(core.assigned):
            task = core.tasks.get(p)
            read = [(TELEMETRY_UNATTRIBUTED, core.side.aligner)]
            read += (
                [
                    (t, task.aligner)
                    for t in (TRAINING_STEPS, TRAINING_EVENTS, SCHEDULER_STATES, TELEMETRY_JOB)
                ]
                if task
                else []
            )
            for topic, aligner in read:
                tp = tp_key(topic, p)
                lag, so_far = core.lag(tp, aligner.last_offset(tp)), left[topic]
                left[topic] = None if lag is None or so_far is None else so_far + lag
        return left

    def watermark_delay_s(self) -> float | None:
        """Wall clock minus the oldest engine watermark."""
        marks = [t.engine.watermark for t in self.core.tasks.values() if t.engine.watermark]
        marks += [t.engine.watermark for t in self.core.job_tasks.values() if t.engine.watermark]
        return (time.time() * 1000 - min(marks)) / 1000 if marks else None

    def held(self) -> int:
        """Records held for alignment by every task of both stages."""
        return sum(len(t.aligner) for t in [*self.core.tasks.values(), *self.core.job_tasks.values()])

    def publish_metrics(self) -> None:
        """Refresh what `/metrics` serves (no-op without a metrics port)."""
        if self.metrics_server is None:
            return
        firing: collections.Counter[str] = collections.Counter()
        for task in [*self.core.tasks.values(), *self.core.job_tasks.values()]:
            firing.update(fp.split("/", 1)[0] for fp in task.engine.tracker.firing())
        self.metrics_server.publish(
            worker_metrics(
                consumed=self.core.consumed,
                produced=self.produced,
                totals=self.counters(),
                dead_letters=self.core.dead_letters,
                time_rejected=self.core.intake.time_rejected,
                lag={t: n for t, n in self.source_lag().items() if n is not None},
                watermark_delay_s=self.watermark_delay_s(),
                firing_by_rule=firing,
                held=self.held() + len(self.core.side.aligner),
            )
        )

    def log_progress(self) -> None:
        """One readable line: events, rate, alerts, dead letters, lag, watermark delay, held, partitions."""
        t = self.counters()
        now = time.monotonic()
        rate = (t["source_events"] - self._last_line[1]) / max(now - self._last_line[0], 1e-9)
        self._last_line = (now, t["source_events"])
        lags = list(self.source_lag().values())
        lag = None if None in lags else sum(n or 0 for n in lags)
        delay_s = self.watermark_delay_s()
        delay = "none yet" if delay_s is None else f"{delay_s:,.1f} s"
        log.info(
            "worker: %s source events handled (%s/s), %s alerts, %s dead letters, %s clock-rejected,"
            " %s bad input; lag %s records; watermark delay %s (oldest partition); held %s + %s;"
            " partitions %s",
            f"{t['source_events']:,}",
            f"{rate:,.0f}",
            f"{t['alerts']:,}",
            f"{t['deadletter']:,}",
            f"{t['clock_rejected']:,}",
            f"{t['bad_input']:,}",
            "unknown" if lag is None else f"{lag:,}",
            delay,
            f"{self.held():,}",
            f"{len(self.core.side.aligner):,}",
            sorted(self.core.tasks),
        )
        log.debug("worker counters: %s", t)
        for p, task in sorted(self.core.tasks.items()):
            log.debug("partition %d: %s", p, task.aligner.describe(now, self.core.lag))


def worker_metrics(
    *,
    consumed: Mapping[str, int],
    produced: Mapping[str, int],
    totals: Mapping[str, int],
    dead_letters: Mapping[str, int],
    lag: Mapping[str, int],
    time_rejected: Mapping[str, int] | None = None,
    watermark_delay_s: float | None,
    firing_by_rule: Mapping[str, int],
    held: int = 0,
) -> list[Metric]:
    """The worker's health as metric families (topics without the test prefix)."""
    out = [
        Metric(
            "ranksight_worker_events_in",
            "counter",
            "Records the worker read, per topic (source and internal).",
            ("topic",),
            {(t,): float(n) for t, n in sorted(consumed.items())},
        ),
        Metric(
            "ranksight_worker_events_out",
            "counter",
            "Records the worker produced, per topic (alerts, derived, internal, dead letters).",
            ("topic",),
            {(t,): float(n) for t, n in sorted(produced.items())},
        ),
        Metric(
            "ranksight_worker_decode_errors",
            "counter",
            "Records the worker could not decode (the sink dead-letters those of raw topics).",
            (),
            {(): float(totals.get("bad_input", 0))},
        ),
        Metric(
            "ranksight_worker_dead_letters",
            "counter",
            "Records the worker sent to rs.deadletter, per reason (decode: of the topics only it reads).",
            ("reason",),
            {(r,): float(n) for r, n in sorted(dead_letters.items())},
        ),
        Metric(
            "ranksight_worker_time_rejected",
            "counter",
            "Records the worker refused for their event time, per reason (clock_ahead, clock_behind,"
            " out_of_range); the sink dead-letters the raw record.",
            ("reason",),
            {(r,): float(n) for r, n in sorted((time_rejected or {}).items())},
        ),
        Metric(
            "ranksight_worker_engine_errors",
            "counter",
            "Records a detector raised on (skipped, logged with the traceback).",
            (),
            {(): float(totals.get("engine_errors", 0))},
        ),
        Metric(
            "ranksight_worker_consumer_lag",
            "gauge",
            "Records of the assigned source partitions not read yet, per topic.",
            ("topic",),
            {(t,): float(n) for t, n in sorted(lag.items())},
        ),
        Metric(
            "ranksight_worker_alerts_firing",
            "gauge",
            "Alerts firing in this worker's engines, per rule.",
            ("rule",),
            {(r,): float(n) for r, n in sorted(firing_by_rule.items())},
        ),
        Metric(
            "ranksight_worker_held",
            "gauge",
            "Records held for event-time alignment (waiting for a slower input partition).",
            (),
            {(): float(held)},
        ),
        Metric(
            "ranksight_worker_stuck_reports",
            "counter",
            "Times an aligner held records without releasing any for --stuck-log seconds (logged).",
            (),
            {(): float(totals.get("stuck_reports", 0))},
        ),
        Metric(
            "ranksight_worker_checkpoints",
            "counter",
            "Engine snapshots written.",
            (),
            {(): float(totals.get("checkpoints", 0))},
        ),
    ]
    if watermark_delay_s is not None:
        out.append(
            Metric(
                "ranksight_worker_watermark_delay_seconds",
                "gauge",
                "Wall clock minus the oldest engine watermark of this worker.",
                (),
                {(): watermark_delay_s},
            )
        )
    return out
