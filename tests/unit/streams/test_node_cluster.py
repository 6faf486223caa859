"""Every alert names its cluster, job or no job (issue 38.6): an XID on an idle GPU of a
provider-owned cluster carries the cluster its agent named and pages the provider, not in-house
operations."""

from __future__ import annotations

from schemas.records import Event
from streams.detectors.base import Topology
from streams.offline.detection import DetectionEngine
from tests.unit.streams.builders import T0, gpu_sample


def xid_on_idle_gpu(cluster: str) -> list[Event]:
    out = []
    for k in range(3):
        ev = gpu_sample("node-07", 3, T0 + 1000 * k, util=0.0)
        ev.record["cluster"] = cluster
        if k == 1:
            ev.record["xid"] = 79
        out.append(ev)
    return out


def test_a_job_less_xid_names_the_agents_cluster_and_pages_its_owner() -> None:
    engine = DetectionEngine()
    alerts = [a.record for ev in xid_on_idle_gpu("provider-east") for a in engine.process(ev)]
    alerts += [a.record for a in engine.finish()]
    fired = [a for a in alerts if a["rule"] == "xid_error" and a["status"] == "firing"]
    assert fired and {a["cluster"] for a in fired} == {"provider-east"} and not fired[0]["job_id"]
    assert {(a["team"], a["receiver"]) for a in fired} == {("provider-noc", "provider-noc")}


def test_the_same_xid_in_house_pages_infrastructure_operations() -> None:
    engine = DetectionEngine()
    alerts = [a.record for ev in xid_on_idle_gpu("east") for a in engine.process(ev)]
    fired = [a for a in alerts + [a.record for a in engine.finish()] if a["rule"] == "xid_error"]
    assert fired and {a["team"] for a in fired if a["status"] == "firing"} == {"infrastructure-operations"}


def test_the_node_cluster_survives_a_snapshot() -> None:
    topo = Topology()
    for ev in xid_on_idle_gpu("provider-east"):
        topo.observe(ev)
    assert Topology.from_state(topo.state()).node_cluster == {"node-07": "provider-east"}
