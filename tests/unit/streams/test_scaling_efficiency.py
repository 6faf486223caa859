"""scaling_efficiency_low: a job's tokens/s per GPU against the same configuration (family + layout) on
fewer nodes, below the floor its team set in the overrides file."""

from __future__ import annotations

import pytest

from schemas.records import Event
from streams.config import load_config
from streams.detectors.base import Finding, Topology
from streams.detectors.baseline import BaselineDetector, scaling_config
from streams.overrides import build_detector
from tests.unit.streams.builders import T0, job_started, job_state

LAYOUT = "llama-pretrain|v1|H100-80GB|{n}n|bs512|seq4096|dp{dp}.tp8.pp1.z1.deepspeed"


def _window(job: str, i: int, key: str, tokens: float, start: int) -> Event:
    end = start + (i + 2) * 30_000
    return Event(
        "JobWindowStats",
        {
            "window_start": end - 60_000,
            "window_end": end,
            "job_id": job,
            "run_id": f"{job}-run-1",
            "workload_family": "llama-pretrain",
            "baseline_key": key,
            "healthy": True,
            "ranks": 8,
            "last_step": (i + 2) * 30,
            "step_time_s": 1.0,
            "tokens_per_s_per_gpu": tokens * (1 + 0.01 * ((i % 3) - 1)),
            "samples_per_s": 128.0,
            "data_wait_frac": 0.03,
            "gpu_util_pct": 95.0,
            "power_w": 600.0,
            "loss": 2.5,
            "min_straggler_score": 1.0,
            "gpu_idle_frac": 0.1,
            "idle_data_wait_frac": 0.02,
            "idle_comm_frac": 0.05 if tokens > 50_000 else 0.4,
            "idle_other_frac": 0.03,
        },
    )


def _run(
    det: BaselineDetector, job: str, nodes: int, tokens: float, start: int, *, complete: bool
) -> list[Finding]:
    key = LAYOUT.format(n=nodes, dp=nodes)  # data parallel grows with the nodes (TP=8 inside a node)
    det.topology.observe(job_started(job, start))
    out: list[Finding] = []
    for i in range(10):
        out += det.observe(_window(job, i, key, tokens, start))
    if complete:
        end = job_state(job, start + 13 * 30_000, "completed")
        det.topology.observe(end)
        out += det.observe(end)
        det.forget_job(job)
    return out


def _fewer_node_runs(det: BaselineDetector) -> None:
    _run(det, "one-a", 1, 60_000.0, T0, complete=True)
    _run(det, "one-b", 1, 60_000.0, T0 + 10**6, complete=True)


def test_the_configuration_drops_node_count_and_data_parallel_size_only() -> None:
    assert scaling_config(LAYOUT.format(n=16, dp=16)) == (
        "llama-pretrain|v1|H100-80GB|bs512|seq4096|tp8.pp1.z1.deepspeed",
        16,
    )
    assert (
        scaling_config(LAYOUT.format(n=16, dp=16))[0]
        != scaling_config(  # type: ignore[index]
            LAYOUT.format(n=1, dp=1).replace("z1", "z3")
        )[0]
    )  # type: ignore[index]


def test_below_the_floor_for_three_windows_fires_naming_the_fewer_node_runs_and_the_layer() -> None:
    det = BaselineDetector(Topology(), {"scaling_efficiency_floor": 0.8})
    _fewer_node_runs(det)
    out = [
        f
        for f in _run(det, "wide", 16, 36_000.0, T0 + 2 * 10**6, complete=False)
        if f.rule == "scaling_efficiency_low"
    ]
    assert out and all(f.active for f in out)
    first = out[0]
    assert first.observed == pytest.approx(0.6, abs=0.02) and first.expected == 0.8
    assert first.baseline_runs == 2 and first.baseline.endswith("on 1n")
    assert first.suspected_layer == "network", "communication per step grew the most against the 1-node runs"
    assert (
        "16 nodes makes 60%" in first.summary
        and "2 runs of the same configuration made on 1 node" in first.summary
    )
    # The first two windows give no step rate yet (a possible pause: not judged); then three below.
    assert first.ts == T0 + 2 * 10**6 + 6 * 30_000, "the third judged window below the floor"


def test_a_job_that_scales_or_has_no_floor_or_another_layout_is_quiet() -> None:
    det = BaselineDetector(Topology(), {"scaling_efficiency_floor": 0.8})
    _fewer_node_runs(det)
    assert not [
        f
        for f in _run(det, "good", 16, 55_000.0, T0 + 2 * 10**6, complete=False)
        if f.rule == "scaling_efficiency_low"
    ]
    off = BaselineDetector(Topology())
    _fewer_node_runs(off)
    assert not [
        f
        for f in _run(off, "wide", 16, 36_000.0, T0 + 2 * 10**6, complete=False)
        if f.rule == "scaling_efficiency_low"
    ]
    other = BaselineDetector(Topology(), {"scaling_efficiency_floor": 0.8})
    _run(other, "one-a", 1, 60_000.0, T0, complete=True)  # one run is not a reference (min_runs 2)
    assert not [
        f
        for f in _run(other, "wide", 16, 36_000.0, T0 + 2 * 10**6, complete=False)
        if f.rule == "scaling_efficiency_low"
    ]


def test_the_floor_is_set_per_team_in_the_overrides_file(tmp_path) -> None:
    path = tmp_path / "ranksight.yaml"
    path.write_text(
        "overrides:\n"
        "  - name: llm-scaling\n"
        "    match: {team: llm}\n"
        "    detectors:\n"
        "      baseline: {scaling_efficiency_floor: 0.8}\n"
    )
    config = load_config(path)
    topology = Topology()
    det = build_detector(BaselineDetector, topology, config)
    found: list[Finding] = []

    def run(job: str, team: str, nodes: int, tokens: float, start: int, *, complete: bool) -> None:
        started = job_started(job, start, team=team)
        topology.observe(started)
        det.observe(started)
        key = LAYOUT.format(n=nodes, dp=nodes)
        for i in range(10):
            found.extend(det.observe(_window(job, i, key, tokens, start)))
        if complete:
            end = job_state(job, start + 13 * 30_000, "completed")
            topology.observe(end)
            det.observe(end)

    # Each team has two healthy one-node runs of the configuration, then one 16-node run at 60 %.
    for n, team in enumerate(("llm", "vision")):
        run(f"one-a-{team}", team, 1, 60_000.0, T0 + n * 10**5, complete=True)
        run(f"one-b-{team}", team, 1, 60_000.0, T0 + 10**6 + n * 10**5, complete=True)
        run(f"wide-{team}", team, 16, 36_000.0, T0 + 2 * 10**6 + n * 10**5, complete=False)
    fired = {f.job_id for f in found if f.rule == "scaling_efficiency_low" and f.active}
    assert fired == {"wide-llm"}, "only the team that set a floor is paged"


def test_a_floor_outside_zero_to_one_is_refused() -> None:
    with pytest.raises(ValueError, match="scaling_efficiency_floor"):
        BaselineDetector(Topology(), {"scaling_efficiency_floor": 80})
