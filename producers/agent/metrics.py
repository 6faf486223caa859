"""The node agent's health as Prometheus metric families (served by `infra.metrics.MetricsServer`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from infra.metrics import Metric

__all__ = ["agent_metrics"]


def agent_metrics(stats: Any, publisher: Mapping[str, Any]) -> list[Metric]:
    """The node agent's health: samples taken, what the publisher delivered, spooled and holds on disk."""

    def counter(name: str, help_: str, value: float) -> Metric:
        return Metric(name, "counter", help_, (), {(): float(value)})

    def gauge(name: str, help_: str, value: float) -> Metric:
        return Metric(name, "gauge", help_, (), {(): float(value)})

    return [
        Metric(
            "ranksight_agent_samples",
            "counter",
            "Samples taken, per kind.",
            ("kind",),
            {("gpu",): float(stats.gpu_samples), ("host",): float(stats.host_samples)},
        ),
        counter("ranksight_agent_xid_events", "XID / ECC events seen.", stats.xid_events),
        counter(
            "ranksight_agent_skipped_ticks",
            "Intervals skipped because the host stalled.",
            stats.skipped_ticks,
        ),
        counter(
            "ranksight_agent_events_delivered", "Events Kafka acknowledged.", publisher.get("delivered", 0)
        ),
        counter(
            "ranksight_agent_events_spooled", "Events written to the disk spool.", publisher.get("spooled", 0)
        ),
        counter(
            "ranksight_agent_spool_dropped",
            "Events the full spool dropped.",
            publisher.get("spool_dropped", 0),
        ),
        gauge("ranksight_agent_spool_bytes", "Bytes in the disk spool now.", publisher.get("spool_bytes", 0)),
        gauge(
            "ranksight_agent_spool_events", "Events in the disk spool now.", publisher.get("spool_events", 0)
        ),
        gauge(
            "ranksight_agent_kafka_outage",
            "1 while the broker is unreachable.",
            1 if publisher.get("outage") else 0,
        ),
    ]
