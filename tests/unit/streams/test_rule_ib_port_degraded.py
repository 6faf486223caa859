"""`ib_port_degraded`: a node's InfiniBand/RoCE port that is down or keeps counting link errors pages
on its own, job or no job; a lone burst and congestion alone do not."""

from __future__ import annotations

from schemas.records import Event
from streams.detectors.base import Topology
from streams.detectors.ib_port_degraded import IbPortDegradedDetector
from streams.offline.detection import DetectionEngine
from tests.unit.streams.builders import T0, host_sample
from tests.unit.streams.test_invariants_infrastructure import JOB, drive, job_on_two_nodes, rule


def ib(node: str, ts: int, *, errors: int = 0, down: int = 0, wait: float = 0.0, cluster: str = "c") -> Event:
    ev = host_sample(node, ts)
    ev.record.update(cluster=cluster, ib_errors=errors, ib_ports_down=down, ib_xmit_wait_s=wait)
    return ev


def test_repeated_link_errors_page_the_nodes_job_and_clear_after_the_quiet_period() -> None:
    errors = {3: 6, 4: 7}  # 13 errors over two samples, within 120 s
    events = job_on_two_nodes() + [
        ib("node-02", T0 + 10_000 * i, errors=errors.get(i, 0)) for i in range(1, 45)
    ]
    found = rule(drive(IbPortDegradedDetector(Topology()), events), "ib_port_degraded")
    assert found[0].active and found[0].ts == T0 + 40_000 and found[0].severity == "warning"
    assert found[0].job_id == JOB and found[0].key == ("node-02", JOB) and found[0].category == "infra"
    assert "13 link errors" in found[0].summary
    assert not found[-1].active and found[-1].ts >= T0 + 40_000 + 300_000


def test_a_port_down_is_critical_at_once_and_a_lone_burst_or_congestion_is_not_a_page() -> None:
    down = [ib("node-02", T0 + 10_000), ib("node-02", T0 + 20_000, down=1, errors=1)]
    found = rule(drive(IbPortDegradedDetector(Topology()), job_on_two_nodes() + down), "ib_port_degraded")
    assert (
        found and found[0].active and found[0].severity == "critical" and "1 port(s) down" in found[0].summary
    )
    burst = [ib("node-02", T0 + 10_000 * i, errors=50 if i == 2 else 0, wait=1e6) for i in range(1, 30)]
    assert (
        rule(drive(IbPortDegradedDetector(Topology()), job_on_two_nodes() + burst), "ib_port_degraded") == []
    )
    no_ib = [host_sample("node-02", T0 + 10_000 * i) for i in range(1, 5)]  # ib fields null: nothing
    assert rule(drive(IbPortDegradedDetector(Topology()), no_ib), "ib_port_degraded") == []


def test_a_degraded_port_on_an_idle_provider_node_pages_the_provider_with_its_cluster() -> None:
    engine = DetectionEngine()
    events = [
        ib("node-07", T0 + 10_000 * i, errors=8 if i in (2, 3) else 0, cluster="provider-east")
        for i in range(1, 6)
    ]
    alerts = [a.record for ev in events for a in engine.process(ev)] + [a.record for a in engine.finish()]
    fired = [a for a in alerts if a["rule"] == "ib_port_degraded" and a["status"] == "firing"]
    assert fired and not fired[0]["job_id"] and {a["cluster"] for a in fired} == {"provider-east"}
    assert {(a["team"], a["receiver"]) for a in fired} == {("provider-noc", "provider-noc")}


def test_the_condition_survives_a_snapshot() -> None:
    det = IbPortDegradedDetector(Topology())
    drive(det, [*job_on_two_nodes(), ib("node-02", T0 + 10_000, errors=5)])
    restored = IbPortDegradedDetector(det.topology)
    restored.load_state(det.state())
    found = rule(drive(restored, [ib("node-02", T0 + 20_000, errors=5)]), "ib_port_degraded")
    assert found and found[0].active and found[0].job_id == JOB and "10 link errors" in found[0].summary
