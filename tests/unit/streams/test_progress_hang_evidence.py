"""rank_hang without collective samples (issue 20 / 23.5): the hung rank named from its GPU, with GPM
where the GPU has it and from power and activity where it has not; what stalls and hangs say about
their layer (issue 23.7); and the metric history of hangs and zombies."""

from __future__ import annotations

from schemas.records import Event
from streams.detectors.base import Finding
from tests.unit.streams.builders import T0, gpu_sample, training_job
from tests.unit.streams.test_progress import _first, _run

STALL_S = 100  # the job's last step (training_job(seconds=100))


def _gpu(
    rank: int, s: float, *, util: float, power: float, sm: float | None = None, tensor: float | None = None
) -> Event:
    """Rank r's GPU (node-01, GPU r) at T0 + s seconds; GPM fields only when given (null elsewhere)."""
    event = gpu_sample("node-01", rank, T0 + int(s * 1000), util=util, power=power, pids=[1000 + rank])
    event.record["sm_active_pct"] = sm
    event.record["tensor_active_pct"] = tensor
    return event


def _job(
    during: dict[int, tuple[float, float, float | None, float | None]],
    *,
    gpm: bool,
    first: dict[int, float] | None = None,
) -> list[Event]:
    """A 4-rank job training 100 s (its GPUs computing at 600 W), then silent: each rank's GPU
    reads `during[rank]` = (activity, power, SM activity, tensor activity) every 5 s after the last
    step; `first[rank]`, when given, is its activity in the first two samples after it (the next
    step's start)."""
    events = training_job(seconds=STALL_S)
    for k in range(STALL_S // 5):
        s = 2.5 + 5 * k
        events += [
            _gpu(r, s, util=95, power=600, sm=80 if gpm else None, tensor=50 if gpm else None)
            for r in range(4)
        ]
    for k in range(40):
        s = STALL_S + 2.5 + 5 * k
        for r in range(4):
            util, power, sm, tensor = during[r]
            if first is not None and k < 2:
                util = first[r] if k == 0 else 0.0
                sm = None if not gpm else util
            events.append(_gpu(r, s, util=util, power=power, sm=sm, tensor=tensor))
    return sorted(events, key=lambda e: e.record["ts"])


def _hang(out: list[Finding]) -> Finding | None:
    return _first(out, "rank_hang")


def test_gpm_names_the_hung_kernel_among_peers_spinning_in_the_collective() -> None:
    """Every GPU 100 % busy; the peers' few NCCL SMs spin, rank 2's kernel holds every SM, no tensor work."""
    spin = (100.0, 250.0, 15.0, 0.0)
    _, out = _run(_job({0: spin, 1: spin, 2: (100.0, 330.0, 95.0, 0.0), 3: spin}, gpm=True), until_s=175)
    hang = _hang(out)
    assert hang is not None and hang.rank == 2
    assert hang.ts <= T0 + (STALL_S + 2 * 60) * 1000, "named within 2x the allowed silence"
    assert hang.suspected_layer == "gpu"
    assert hang.history_metric == "sm_active_pct" and hang.history and hang.history[-1][1] == 95.0


def test_gpm_peers_all_spinning_alike_name_no_rank_and_the_stall_says_network() -> None:
    spin = (100.0, 250.0, 15.0, 0.0)
    _, out = _run(_job(dict.fromkeys(range(4), spin), gpm=True), until_s=175)
    assert _hang(out) is None
    stall = _first(out, "job_stall")
    assert stall is not None and stall.suspected_layer == "network"


def test_gpm_a_rank_still_computing_while_its_peers_spin_is_the_one_they_wait_for() -> None:
    spin = (100.0, 250.0, 15.0, 0.0)
    _, out = _run(_job({0: spin, 1: spin, 2: (100.0, 600.0, 93.0, 60.0), 3: spin}, gpm=True), until_s=175)
    hang = _hang(out)
    assert hang is not None and hang.rank == 2 and hang.suspected_layer == "gpu"


def test_gpm_overrules_power_a_hotter_gpu_spinning_like_its_peers_is_not_hung() -> None:
    """Rank 0 draws a third more (a hotter part) but its SMs spin like its peers': no rank named."""
    spin = (100.0, 250.0, 15.0, 0.0)
    _, out = _run(_job({0: (100.0, 340.0, 15.0, 0.0), 1: spin, 2: spin, 3: spin}, gpm=True), until_s=175)
    assert _hang(out) is None and _first(out, "job_stall") is not None


def test_without_gpm_the_rank_drawing_well_above_its_cold_spinning_peers_is_named() -> None:
    """An A100: activity 100 % everywhere; the peers draw a third of their training power, rank 1 half."""
    spin = (100.0, 200.0, None, None)
    _, out = _run(_job({0: spin, 1: (100.0, 300.0, None, None), 2: spin, 3: spin}, gpm=False), until_s=175)
    hang = _hang(out)
    assert hang is not None and hang.rank == 1 and hang.suspected_layer == "gpu"
    assert hang.history_metric == "gpu_util_pct" and hang.history


def test_without_gpm_equal_power_names_no_rank() -> None:
    _, out = _run(_job(dict.fromkeys(range(4), (100.0, 300.0, None, None)), gpm=False), until_s=175)
    assert _hang(out) is None and _first(out, "job_stall") is not None


def test_every_gpu_idle_names_the_rank_whose_gpu_never_started_the_next_step() -> None:
    """The peers' GPUs ran the next step's forward and backward after the last step, then waited with
    no kernel; rank 3's never started it. The stall names it (its GPU idle: host code)."""
    idle = (0.0, 80.0, None, None)
    for gpm in (False, True):
        events = _job(dict.fromkeys(range(4), idle), gpm=gpm, first={0: 55.0, 1: 52.0, 2: 57.0, 3: 18.0})
        _, out = _run(events, until_s=175)
        hang = _hang(out)
        assert hang is not None and hang.rank == 3 and hang.suspected_layer == "host", gpm


def test_a_sample_taken_ms_after_the_last_step_is_that_step_s_work_not_the_next_one_s_start() -> None:
    """A job-wide input stall: every GPU idle after the last step. The agent samples GPU 0 2 ms
    before the step ends and GPUs 1-3 1-3 ms after it: their samples hold the last step's work,
    not a start of the next one that GPU 0 lacks (this named rank 0 hung in a 21x stall)."""
    events = training_job(seconds=STALL_S)
    skew = {0: -2, 1: 1, 2: 2, 3: 3}
    for k in range(1, 60):
        for r in range(4):
            ts = T0 + 5000 * k + skew[r]
            busy = ts <= T0 + STALL_S * 1000 + 5
            events.append(
                _gpu(r, (ts - T0) / 1000, util=95.0 if busy else 0.0, power=600.0 if busy else 80.0)
            )
    _, out = _run(sorted(events, key=lambda e: e.record["ts"]), until_s=175)
    assert _hang(out) is None
    assert _first(out, "job_stall") is not None


def test_every_gpu_idle_alike_names_no_rank_and_the_stall_says_data() -> None:
    """Every rank stopped after the same step (all waiting for input): nobody is out of line."""
    idle = (0.0, 80.0, None, None)
    events = _job(dict.fromkeys(range(4), idle), gpm=False, first=dict.fromkeys(range(4), 18.0))
    _, out = _run(events, until_s=175)
    assert _hang(out) is None
    stall = _first(out, "job_stall")
    assert stall is not None and stall.suspected_layer == "data"


def test_a_zombie_carries_the_steps_it_stopped_at() -> None:
    held = (0.0, 80.0, None, None)
    _, out = _run(_job(dict.fromkeys(range(4), held), gpm=False), until_s=302, params={"zombie_grace_s": 200})
    zombie = _first(out, "zombie_job")
    assert zombie is not None and zombie.history_metric == "step"
    points = zombie.history
    assert len(points) >= 2 and points[-1] == (T0 + 301_000, float(STALL_S)), points
    assert points[-2][1] == float(STALL_S)  # flat since the last advance
