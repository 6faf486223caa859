"""Communication without hand timing in real multi-process jobs: torchrun starts 2 gloo ranks that
run a stock DDP model and then an FSDP2 model; rank 1 turns slow in forward halfway through each.

The SDK's comm hook (DDP) and wrapped collectives (FSDP) fill every step's `comm_s`: the healthy
rank's communication grows by about the slow rank's extra time, and its compute does not (the
wait is taken out of backward). Opt-in: `make test-frameworks` (RANKSIGHT_TORCH_TESTS=1).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from schemas.files import iter_container

pytestmark = [
    pytest.mark.torch,
    pytest.mark.skipif(
        os.environ.get("RANKSIGHT_TORCH_TESTS") != "1",
        reason="set RANKSIGHT_TORCH_TESTS=1 (make test-frameworks) to run real torch.distributed jobs",
    ),
]

_JOB = Path(__file__).with_name("comm_job.py")
_ROOT = Path(__file__).resolve().parents[3]
STEPS, SLOW_FROM, DELAY = 30, 15, 0.03


def _records(path: Path, kind: str) -> list[dict[str, Any]]:
    return [e.record for e in iter_container(path) if e.type == kind]


def _median(steps: list[dict[str, Any]], field: str, *, after: bool) -> float:
    # Skip the first steps of each half (start-up, and the step the slowdown begins).
    chosen = [s for s in steps if (s["step"] >= SLOW_FROM + 2 if after else 2 <= s["step"] < SLOW_FROM)]
    return statistics.median(float(s[field]) for s in chosen)


@pytest.fixture(scope="module")
def job_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch")
    out = tmp_path_factory.mktemp("comm")
    torchrun = Path(sys.executable).parent / "torchrun"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(_ROOT), os.environ.get("PYTHONPATH")])),
    }
    run = subprocess.run(
        [str(torchrun), "--nproc-per-node", "2", str(_JOB), "--out", str(out), "--steps", str(STEPS),
         "--slow-from", str(SLOW_FROM), "--delay", str(DELAY)],
        env=env, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    return out


def test_stock_ddp_reports_comm_and_the_healthy_rank_waits_for_the_slow_one(job_dir: Path) -> None:
    healthy = _records(job_dir / "ddp.rank0.avro", "StepCompleted")
    slow = _records(job_dir / "ddp.rank1.avro", "StepCompleted")
    assert len(healthy) == len(slow) == STEPS
    assert all(s["comm_s"] is not None for s in healthy + slow), "every step has its collective time"
    grew = _median(healthy, "comm_s", after=True) - _median(healthy, "comm_s", after=False)
    assert grew > 0.5 * DELAY, f"the healthy rank's comm grew by only {grew:.4f} s"
    # The wait is taken out of backward: the healthy rank's compute stays far below the slow rank's.
    compute = [{**s, "c": s["forward_s"] + s["backward_s"]} for s in healthy]
    slow_compute = [{**s, "c": s["forward_s"] + s["backward_s"]} for s in slow]
    assert _median(compute, "c", after=True) < _median(slow_compute, "c", after=True) - 0.5 * DELAY
    # The slow rank waits less than the healthy one: who waited for whom.
    assert _median(slow, "comm_s", after=True) < _median(healthy, "comm_s", after=True)
    samples = _records(job_dir / "ddp.rank0.avro", "CollectiveSample")
    assert samples and {s["op"] for s in samples} == {"allreduce"}
    assert sum(s["count"] for s in samples) >= STEPS  # one or more buckets per step
    assert all(s["bytes"] for s in samples)


def test_fsdp_collectives_are_timed_through_torch_distributed(job_dir: Path) -> None:
    healthy = _records(job_dir / "fsdp.rank0.avro", "StepCompleted")
    slow = _records(job_dir / "fsdp.rank1.avro", "StepCompleted")
    assert len(healthy) == len(slow) == STEPS
    assert all(s["comm_s"] is not None for s in healthy + slow)
    ops = {s["op"] for s in _records(job_dir / "fsdp.rank0.avro", "CollectiveSample")}
    assert {"allgather", "reduce_scatter"} <= ops
    assert _median(slow, "comm_s", after=True) < _median(healthy, "comm_s", after=True)
