"""The sink's health as Prometheus metric families (served by `infra.metrics.MetricsServer`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from infra.metrics import Metric

__all__ = ["sink_metrics"]


def sink_metrics(health: Mapping[str, Any], strip_prefix: str = "") -> list[Metric]:
    """The sink's health (`SinkConsumer.health()`) as metric families."""

    def topic(name: str) -> str:
        return name[len(strip_prefix) :] if strip_prefix and name.startswith(strip_prefix) else name

    return [
        Metric(
            "ranksight_sink_events_in",
            "counter",
            "Records the sink read, per topic.",
            ("topic",),
            {(topic(t),): float(n) for t, n in sorted(health.get("consumed_by_topic", {}).items())},
        ),
        Metric(
            "ranksight_sink_rows_inserted",
            "counter",
            "Rows inserted into ClickHouse, per table.",
            ("table",),
            {(t,): float(n) for t, n in sorted(health.get("inserted_by_table", {}).items())},
        ),
        Metric(
            "ranksight_sink_dead_letters",
            "counter",
            "Records the sink sent to rs.deadletter (undecodable, wrong topic, not storable).",
            (),
            {(): float(health.get("deadlettered", 0))},
        ),
        Metric(
            "ranksight_sink_time_rejected",
            "counter",
            "Records of the raw topics dead-lettered for their event time (out_of_range, clock_ahead, clock_behind).",
            ("reason",),
            {(r,): float(n) for r, n in sorted(health.get("time_rejected", {}).items())},
        ),
        Metric(
            "ranksight_sink_inserts",
            "counter",
            "ClickHouse inserts (one per table per batch).",
            (),
            {(): float(health.get("inserts", 0))},
        ),
        Metric(
            "ranksight_sink_insert_seconds",
            "counter",
            "Seconds spent in ClickHouse inserts (rate over ranksight_sink_inserts_total: mean latency).",
            (),
            {(): float(health.get("insert_s", 0.0))},
        ),
        Metric(
            "ranksight_sink_retries",
            "counter",
            "Batches retried after a ClickHouse error.",
            (),
            {(): float(health.get("retries", 0))},
        ),
        Metric(
            "ranksight_sink_consumer_lag",
            "gauge",
            "Records of the assigned partitions not read yet, per topic.",
            ("topic",),
            {(topic(t),): float(n) for t, n in sorted(health.get("lag_by_topic", {}).items())},
        ),
    ]
