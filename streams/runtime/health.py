"""The worker's health as Prometheus metric families (served by `infra.metrics.MetricsServer`)."""

from __future__ import annotations

from collections.abc import Mapping

from infra.metrics import Metric

__all__ = ["worker_metrics"]


def worker_metrics(
    *,
    consumed: Mapping[str, int],
    produced: Mapping[str, int],
    totals: Mapping[str, int],
    dead_letters: Mapping[str, int],
    lag: Mapping[str, int],
    watermark_delay_s: float | None,
    firing_by_rule: Mapping[str, int],
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
            "Records the worker sent to rs.deadletter, per reason (decode, clock_ahead, ...).",
            ("reason",),
            {(r,): float(n) for r, n in sorted(dead_letters.items())},
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
