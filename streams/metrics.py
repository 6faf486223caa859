"""Prometheus `/metrics` for the pipeline's own health: a snapshot a component publishes, served as is.

A component (the worker) builds a list of `Metric` values from its own counters on its event loop
(`worker_metrics` is pure: no prometheus_client, no I/O) and hands it to `MetricsServer.publish`;
the HTTP thread of prometheus_client serves the latest list. Swapping one reference is atomic, so
a scrape never reads counters half-updated by the loop. prometheus_client is imported only when a
server is started (a server extra: `pip install ranksight[server]`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from streams.errors import StreamsError

__all__ = ["Metric", "MetricsServer", "agent_metrics", "forwarder_metrics", "sink_metrics", "worker_metrics"]


@dataclass(frozen=True)
class Metric:
    """One metric family: name, type, help and a value per label set."""

    name: str
    kind: Literal["counter", "gauge"]
    help: str
    labels: tuple[str, ...] = ()
    values: dict[tuple[str, ...], float] = field(default_factory=dict)


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


def forwarder_metrics(*, received: int, sent: int, firing_by_rule: Mapping[str, int]) -> list[Metric]:
    """`ranksight alerts forward`'s health as metric families."""
    return [
        Metric(
            "ranksight_forward_alerts_in",
            "counter",
            "Alert records read from the alert topic (after the rebuild).",
            (),
            {(): float(received)},
        ),
        Metric(
            "ranksight_forward_alerts_sent",
            "counter",
            "Alert states Alertmanager accepted (new, resolved and keep-alive re-sends).",
            (),
            {(): float(sent)},
        ),
        Metric(
            "ranksight_forward_alerts_firing",
            "gauge",
            "Alerts the forwarder keeps alive in Alertmanager, per rule.",
            ("rule",),
            {(r,): float(n) for r, n in sorted(firing_by_rule.items())},
        ),
    ]


class MetricsServer:
    """Serves the latest published metrics on http://<addr>:<port>/metrics (prometheus_client)."""

    def __init__(self, port: int, addr: str = "0.0.0.0") -> None:
        try:
            import prometheus_client
        except ImportError as exc:
            raise StreamsError(
                "--metrics-port needs prometheus_client: pip install 'ranksight[server]'"
            ) from exc
        self._latest: list[Metric] = []
        self.registry = prometheus_client.CollectorRegistry(auto_describe=False)
        self.registry.register(self)
        try:
            prometheus_client.start_http_server(port, addr=addr, registry=self.registry)
        except OSError as exc:
            raise StreamsError(f"cannot serve metrics on {addr}:{port}: {exc.strerror or exc}") from exc
        self.port = port

    def publish(self, metrics: list[Metric]) -> None:
        """Make `metrics` what the next scrape sees."""
        self._latest = metrics

    def collect(self) -> Iterator[Any]:
        """prometheus_client's collector protocol: one family per published metric."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        for m in self._latest:
            family: Any
            if m.kind == "counter":
                family = CounterMetricFamily(m.name, m.help, labels=list(m.labels))
            else:
                family = GaugeMetricFamily(m.name, m.help, labels=list(m.labels))
            for labels, value in m.values.items():
                family.add_metric(list(labels), value)
            yield family
