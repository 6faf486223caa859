"""Baseline deviation: earlier completed healthy runs build the baseline; a slower run deviates."""

from __future__ import annotations

from schemas.records import Event
from streams.detectors.base import Finding, Topology
from streams.detectors.baseline import BaselineDetector
from tests.unit.streams.builders import T0, job_started, job_state

KEY = "llama-pretrain|v1|H100-80GB|1n|bs512|seq4096"


def _window(job: str, i: int, *, step_time: float = 1.0, healthy: bool = True, start: int = T0) -> Event:
    end = start + (i + 2) * 30_000
    return Event(
        "JobWindowStats",
        {
            "window_start": end - 60_000,
            "window_end": end,
            "job_id": job,
            "run_id": f"{job}-run-1",
            "workload_family": "llama-pretrain",
            "baseline_key": KEY,
            "healthy": healthy,
            "ranks": 8,
            "last_step": int((i + 2) * 30 / step_time),
            "step_time_s": step_time,
            "tokens_per_s_per_gpu": 65536.0 / step_time,
            "samples_per_s": 128.0 / step_time,
            "data_wait_frac": 0.03,
            "gpu_util_pct": 95.0,
            "power_w": 600.0,
            "loss": 2.5,
            "min_straggler_score": 1.0,
        },
    )


def _run(
    det: BaselineDetector,
    job: str,
    windows: int,
    *,
    step_time: float = 1.0,
    complete: bool = True,
    start: int = T0,
    healthy: bool = True,
) -> list[Finding]:
    det.topology.observe(job_started(job, start))
    out: list[Finding] = []
    for i in range(windows):
        # run-to-run noise of about 1%
        out += det.observe(
            _window(job, i, step_time=step_time * (1 + 0.01 * ((i % 3) - 1)), start=start, healthy=healthy)
        )
    if complete:
        end = job_state(job, start + (windows + 3) * 30_000, "completed")
        det.topology.observe(end)
        out += det.observe(end)
        det.forget_job(job)
    return out


def test_a_baseline_needs_the_minimum_number_of_earlier_runs() -> None:
    det = BaselineDetector(Topology())
    _run(det, "run-a", 10)
    assert _run(det, "slow", 10, step_time=1.3, complete=False) == []
    usable = {b["metric"]: b["usable"] for b in det.baselines()}
    assert usable["step_time_s"] is False


def test_a_slower_run_deviates_and_the_finding_names_key_metric_and_runs() -> None:
    det = BaselineDetector(Topology())
    _run(det, "run-a", 10)
    _run(det, "run-b", 10, start=T0 + 10**6)
    out = _run(det, "slow", 10, step_time=1.3, complete=False, start=T0 + 2 * 10**6)
    active = [f for f in out if f.active]
    assert active, "a 30% slower run must deviate"
    first = active[0]
    assert first.baseline == KEY and first.baseline_runs == 2 and first.key == ("slow",)
    assert (
        first.history_metric == "step_time_s"
        and first.expected is not None
        and abs(first.expected - 1.0) < 0.02
    )
    # Sustained: not on the first deviating window.
    assert first.ts == _window("slow", 1, start=T0 + 2 * 10**6).record["window_end"]


def test_a_run_within_tolerance_does_not_deviate() -> None:
    det = BaselineDetector(Topology())
    _run(det, "run-a", 10)
    _run(det, "run-b", 10, start=T0 + 10**6)
    assert [
        f for f in _run(det, "ok", 10, step_time=1.05, complete=False, start=T0 + 2 * 10**6) if f.active
    ] == []


def test_unhealthy_windows_and_failed_runs_build_no_baseline() -> None:
    det = BaselineDetector(Topology())
    _run(det, "sick", 10, healthy=False)
    det.topology.observe(job_started("failed", T0))
    for i in range(10):
        det.observe(_window("failed", i))
    det.observe(job_state("failed", T0 + 10**6, "failed"))
    assert det.baselines() == []


def test_baselines_survive_a_state_round_trip() -> None:
    det = BaselineDetector(Topology())
    _run(det, "run-a", 10)
    _run(det, "run-b", 10, start=T0 + 10**6)
    clone = BaselineDetector(det.topology)
    clone.from_bytes(det.to_bytes())
    assert clone.baselines() == det.baselines()
    assert {b["runs"] for b in clone.baselines()} == {2}


def test_runs_learned_on_other_partitions_judge_a_run_the_same() -> None:
    """Issue 19: a job's baseline runs may be learned by other job-stage partitions. What one
    commits it hands on (`drain_learned`, a BaselineRun record); another adopts it, in any order,
    and judges a slower run exactly as the engine that learned every run itself."""
    learner_a, learner_b, judge, alone = (BaselineDetector(Topology()) for _ in range(4))
    _run(learner_a, "run-a", 10)
    _run(learner_b, "run-b", 10, start=T0 + 10**6)
    shared = learner_a.drain_learned() + learner_b.drain_learned()
    assert [r["job_id"] for r in shared] == ["run-a", "run-b"] and shared[0]["baseline_key"] == KEY
    assert learner_a.drain_learned() == []  # handed on once
    for record in reversed(shared):  # arrival order does not matter
        judge.adopt(record)
    _run(alone, "run-a", 10)
    _run(alone, "run-b", 10, start=T0 + 10**6)
    assert judge.baselines() == alone.baselines()
    slow = {"step_time": 1.3, "complete": False, "start": T0 + 2 * 10**6}
    assert _run(judge, "slow", 10, **slow) == _run(alone, "slow", 10, **slow) != []


def _parted_run(
    det: BaselineDetector,
    job: str,
    *,
    compute: float,
    comm: float,
    wait: float = 0.03,
    other: float = 0.0,
    complete: bool = True,
    start: int = T0,
    parts: bool = True,
) -> list[Finding]:
    """A run whose windows carry the step's time attribution (seconds per step of each part)."""
    det.topology.observe(job_started(job, start))
    out: list[Finding] = []
    for i in range(10):
        noise = 1 + 0.01 * ((i % 3) - 1)
        step = (compute + comm + wait + other) * noise
        ev = _window(job, i, step_time=step, start=start)
        if parts:
            ev.record.update(
                gpu_idle_frac=(comm + wait + other) / (compute + comm + wait + other),
                idle_data_wait_frac=wait * noise / step,
                idle_comm_frac=comm * noise / step,
                idle_other_frac=other * noise / step,
                data_wait_frac=wait * noise / step,
            )
        out += det.observe(ev)
    if complete:
        end = job_state(job, start + 13 * 30_000, "completed")
        det.topology.observe(end)
        out += det.observe(end)
        det.forget_job(job)
    return out


def test_a_slower_step_names_the_layer_of_the_part_that_grew_against_the_baseline() -> None:
    """Issue 23.7: step time up because communication grew (compute unchanged) is the network;
    because compute grew, the GPU; the summary says which part and by how much."""
    for compute, comm, layer, words in (
        (0.85, 0.42, "network", "communication"),
        (1.15, 0.12, "gpu", "GPU compute"),
    ):
        det = BaselineDetector(Topology())
        _parted_run(det, "run-a", compute=0.85, comm=0.12)
        _parted_run(det, "run-b", compute=0.85, comm=0.12, start=T0 + 10**6)
        out = _parted_run(det, "slow", compute=compute, comm=comm, complete=False, start=T0 + 2 * 10**6)
        active = [f for f in out if f.active]
        assert active and {f.suspected_layer for f in active} == {layer}
        assert f"{words} per step" in active[0].summary


def test_baseline_runs_without_parts_name_where_the_slow_step_goes() -> None:
    """Runs learned before the parts were kept: the slow window's largest part names the layer."""
    det = BaselineDetector(Topology())
    _parted_run(det, "run-a", compute=0.2, comm=0.8, parts=False)
    _parted_run(det, "run-b", compute=0.2, comm=0.8, parts=False, start=T0 + 10**6)
    out = _parted_run(det, "slow", compute=0.3, comm=1.0, complete=False, start=T0 + 2 * 10**6)
    active = [f for f in out if f.active]
    assert active and active[0].suspected_layer == "network" and "of the step" in active[0].summary


def test_the_deviating_metric_names_data_and_gpu_layers() -> None:
    """A data-wait fraction above the baseline is data; without a time attribution a step-time
    deviation stays unknown (nothing to name it by)."""
    det = BaselineDetector(Topology())
    _parted_run(det, "run-a", compute=0.85, comm=0.12, wait=0.03)
    _parted_run(det, "run-b", compute=0.85, comm=0.12, wait=0.03, start=T0 + 10**6)
    out = _parted_run(det, "slow", compute=0.85, comm=0.12, wait=0.6, complete=False, start=T0 + 2 * 10**6)
    active = [f for f in out if f.active]
    assert active and active[0].suspected_layer == "data"
    det = BaselineDetector(Topology())
    _run(det, "run-a", 10)
    _run(det, "run-b", 10, start=T0 + 10**6)
    active = [
        f for f in _run(det, "slow", 10, step_time=1.3, complete=False, start=T0 + 2 * 10**6) if f.active
    ]
    assert active and active[0].suspected_layer == "unknown"


def test_the_key_carries_the_parallel_layout_and_data_path_and_the_alert_says_what_matched() -> None:
    """Issue 35.2: a TP=8 run is not compared with TP=4 runs; the summary names the key's parts."""
    from streams.detectors.base import JobInfo
    from streams.detectors.baseline import key_words
    from streams.detectors.windows import baseline_key

    base = dict(
        workload_family="llama-pretrain", model_version="v1", gpu_class="H100-80GB", nodes=["n1", "n2"]
    )
    tp4 = JobInfo(
        "a",
        data_parallel=8,
        tensor_parallel=4,
        pipeline_parallel=1,
        dataset_version="ds1",
        storage_tier="lustre",
        **base,
    )
    tp8 = JobInfo(
        "b",
        data_parallel=4,
        tensor_parallel=8,
        pipeline_parallel=1,
        dataset_version="ds1",
        storage_tier="lustre",
        **base,
    )
    assert baseline_key(tp4) != baseline_key(tp8)
    assert baseline_key(tp4).endswith("|dp8.tp4.pp1|data:ds1@lustre")
    assert baseline_key(JobInfo("c", **base)) == "llama-pretrain|v1|H100-80GB|2n|bs-|seq-"  # names neither
    words = key_words(baseline_key(tp4))
    assert "parallel layout dp8.tp4.pp1" in words and "data path ds1@lustre" in words and "GPU class" in words
