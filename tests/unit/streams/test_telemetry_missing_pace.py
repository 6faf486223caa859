"""telemetry_missing learns each agent's interval from its sources' own samples, never fires while a
node's samples are present in the stream, and checks in time linear in the nodes heard."""

from __future__ import annotations

import random

import pytest

from schemas.records import Event
from streams.detectors.base import Topology
from streams.detectors.telemetry_missing import TelemetryMissingDetector
from tests.unit.streams.builders import T0, gpu_sample, host_sample, job_started, rank_bound
from tests.unit.streams.test_invariants_infrastructure import JOB, drive, job_on_two_nodes, rule


def _agent(node: str, every_s: float, start: int, end: int, rng: random.Random, jitter: float) -> list[Event]:
    """An agent sampling its 8 GPUs and its host every `every_s`, each round `jitter` x the interval late or early."""
    out: list[Event] = []
    t = float(start)
    while t < end:
        ts = int(t + rng.uniform(-jitter, jitter) * every_s * 1000)
        out += [gpu_sample(node, g, ts + 2 * g) for g in range(8)]
        out.append(host_sample(node, ts + 20))
        t += every_s * 1000
    return out


@pytest.mark.parametrize(("every_s", "jitter"), [(3.0, 0.0), (3.0, 0.45), (30.0, 0.0), (30.0, 0.3)])
def test_healthy_agents_of_3_s_and_30_s_with_jitter_raise_nothing(every_s: float, jitter: float) -> None:
    rng = random.Random(7)
    events = job_on_two_nodes()
    for node in ("node-01", "node-02"):
        events += _agent(node, every_s, T0 + 1000, T0 + 1_800_000, rng, jitter)
    events.sort(key=lambda e: e.record["ts"])
    assert rule(drive(TelemetryMissingDetector(Topology()), events), "telemetry_missing") == []


def test_a_30_s_agent_is_allowed_three_of_its_intervals_and_a_3_s_agent_the_floor() -> None:
    rng = random.Random(1)
    for every_s, allowed in ((30.0, 90.0), (3.0, 30.0)):
        events = job_on_two_nodes()
        events += _agent("node-01", every_s, T0 + 1000, T0 + 600_000, rng, 0.0)
        events += _agent("node-02", every_s, T0 + 1000, T0 + 300_000, rng, 0.0)
        events.sort(key=lambda e: e.record["ts"])
        found = rule(drive(TelemetryMissingDetector(Topology()), events), "telemetry_missing")
        assert found and found[0].node == "node-02" and found[0].expected == allowed


def test_an_agent_whose_samples_keep_arriving_late_is_never_missing() -> None:
    """node-02's clock lags 40 s (or its spool drains late): every sample is stamped 40 s before the
    watermark the other node moves, but its samples are in the stream, so it is alive."""
    events = job_on_two_nodes()
    rng = random.Random(3)
    ontime = _agent("node-01", 3.0, T0 + 1000, T0 + 900_000, rng, 0.1)
    late = _agent("node-02", 3.0, T0 + 1000, T0 + 900_000, rng, 0.1)
    # In arrival order: node-02's sample stamped t arrives with node-01's stamped t + 40 s.
    arrivals = sorted(
        [(e.record["ts"], 0, e) for e in ontime] + [(e.record["ts"] + 40_000, 1, e) for e in late],
        key=lambda x: (x[0], x[1]),
    )
    det = TelemetryMissingDetector(Topology())
    out = []
    for ev in events:
        det.topology.observe(ev)
        out += det.observe(ev)
    watermark = T0
    for arrival, _, ev in arrivals:
        out += det.observe(ev)
        watermark = max(watermark, arrival if ev.record["node"] == "node-01" else watermark)
        out += det.advance(watermark)
    assert rule(out, "telemetry_missing") == []


def test_a_node_heard_once_is_allowed_the_unlearned_silence_then_reported() -> None:
    events = [*job_on_two_nodes(), host_sample("node-02", T0 + 5000)]
    events += [host_sample("node-01", ts) for ts in range(T0 + 5000, T0 + 400_000, 5000)]
    found = rule(drive(TelemetryMissingDetector(Topology()), events), "telemetry_missing")
    assert found and found[0].node == "node-02" and found[0].expected == 120.0
    assert found[0].ts > T0 + 125_000


def test_a_job_listing_100k_nodes_costs_a_check_no_more_than_the_nodes_heard() -> None:
    """The nodes a JobStarted lists are gathered once per change of the running jobs, not per check:
    counted as iterations of the job's node list (no timing)."""
    topo = Topology()
    det = TelemetryMissingDetector(topo)
    nodes = [f"n{i:06d}" for i in range(100_000)]
    start = job_started(JOB, T0, world_size=8, nodes=1)
    start.record["nodes"] = nodes
    topo.observe(start)
    topo.observe(rank_bound(JOB, 0, T0))
    reads = 0

    class Counted(list[str]):
        def __iter__(self):  # type: ignore[no-untyped-def]
            nonlocal reads
            reads += 1
            return super().__iter__()

    topo.jobs[JOB].nodes = Counted(nodes)
    for ts in range(T0 + 1000, T0 + 600_000, 1000):
        det.observe(host_sample("n000001", ts))
        det.advance(ts)
    assert det.check.last > T0 + 500_000
    assert reads == 1
