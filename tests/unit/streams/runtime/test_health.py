"""The worker's own health: `/metrics` serves what was published."""

from __future__ import annotations

import pytest

from infra.errors import MetricsError


def test_worker_metrics_are_served_as_published_and_a_busy_port_is_one_sentence() -> None:
    """A scrape sees the last published snapshot; a port in use fails with a MetricsError."""
    import socket
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    from infra.metrics import MetricsServer
    from streams.runtime.health import worker_metrics

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    server = MetricsServer(port, addr="127.0.0.1")
    server.publish(
        worker_metrics(
            consumed={"rs.training.steps": 7},
            produced={"rs.alerts": 2},
            totals={"bad_input": 1},
            dead_letters={"decode": 1},
            lag={"rs.training.steps": 3},
            time_rejected={"clock_ahead": 2},
            watermark_delay_s=4.5,
            firing_by_rule={"xid_error": 2},
        )
    )
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert samples[("ranksight_worker_events_in_total", (("topic", "rs.training.steps"),))] == 7
    assert samples[("ranksight_worker_dead_letters_total", (("reason", "decode"),))] == 1
    assert samples[("ranksight_worker_time_rejected_total", (("reason", "clock_ahead"),))] == 2
    assert samples[("ranksight_worker_consumer_lag", (("topic", "rs.training.steps"),))] == 3
    assert samples[("ranksight_worker_alerts_firing", (("rule", "xid_error"),))] == 2
    assert samples[("ranksight_worker_watermark_delay_seconds", ())] == 4.5
    with pytest.raises(MetricsError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
        MetricsServer(port, addr="127.0.0.1")
