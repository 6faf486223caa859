"""Prometheus `/metrics` for the pipeline's own health: a snapshot a component publishes, served as is.

A component builds a list of `Metric` values from its own counters (each component defines its
families next to its code: the worker in `streams.runtime.health`, the sink in `sinks.metrics`, the
agent in `producers.agent.metrics`, the alert forwarder in `streams.alerting.delivery`) and hands it
to `MetricsServer.publish`; the HTTP thread of prometheus_client serves the latest list. Swapping one
reference is atomic, so a scrape never reads counters half-updated by the loop. prometheus_client is
imported only when a server is started (a server extra: `pip install ranksight[server]`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from infra.errors import MetricsError

__all__ = ["Metric", "MetricsServer"]


@dataclass(frozen=True)
class Metric:
    """One metric family: name, type, help and a value per label set."""

    name: str
    kind: Literal["counter", "gauge"]
    help: str
    labels: tuple[str, ...] = ()
    values: dict[tuple[str, ...], float] = field(default_factory=dict)


class MetricsServer:
    """Serves the latest published metrics on http://<addr>:<port>/metrics (prometheus_client)."""

    def __init__(self, port: int, addr: str = "0.0.0.0") -> None:
        try:
            import prometheus_client
        except ImportError as exc:
            raise MetricsError(
                "--metrics-port needs prometheus_client: pip install 'ranksight[server]'"
            ) from exc
        self._latest: list[Metric] = []
        self.registry = prometheus_client.CollectorRegistry(auto_describe=False)
        self.registry.register(self)
        try:
            prometheus_client.start_http_server(port, addr=addr, registry=self.registry)
        except OSError as exc:
            raise MetricsError(f"cannot serve metrics on {addr}:{port}: {exc.strerror or exc}") from exc
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
