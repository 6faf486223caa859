"""torchrun's elastic agent restarts the workers after one dies: the dead rank's launcher reports its
RankFault, and rank 0's launcher in the new attempt a JobStateChanged `restarting` with the count.
Opt-in: `make test-frameworks` (RANKSIGHT_TORCH_TESTS=1: torchrun comes with torch)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from schemas.files import iter_container

pytestmark = [
    pytest.mark.torch,
    pytest.mark.skipif(
        os.environ.get("RANKSIGHT_TORCH_TESTS") != "1",
        reason="set RANKSIGHT_TORCH_TESTS=1 (make test-frameworks) to run torchrun",
    ),
]

_ROOT = Path(__file__).resolve().parents[3]
# Rank 1 dies by SIGKILL in the first attempt only; the restarted workers finish.
_JOB = """
import os, signal
if os.environ["RANK"] == "1" and os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0":
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_worker_failure_and_the_agents_restart_become_a_fault_and_a_restarting_state(
    tmp_path: Path,
) -> None:
    torchrun = Path(sys.executable).parent / "torchrun"
    if not torchrun.exists():
        pytest.skip("torchrun is not installed")
    job = tmp_path / "job.py"
    job.write_text(_JOB)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(_ROOT), os.environ.get("PYTHONPATH")])),
        "RANKSIGHT_DESTINATION": f"file://{tmp_path}/ev.avro",  # one file per rank's launcher
        "RANKSIGHT_JOB_ID": "elastic-job",
    }
    run = subprocess.run(
        [str(torchrun), "--nproc-per-node", "2", "--max-restarts", "1", "-m", "producers.training.launch", str(job)],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    [fault] = [e.record for e in iter_container(tmp_path / "ev.rank1.avro")]
    assert (fault["job_id"], fault["rank"], fault["kind"], fault["exit_code"]) == (
        "elastic-job",
        1,
        "exit",
        137,
    )
    [state] = [e.record for e in iter_container(tmp_path / "ev.rank0.avro")]
    assert (state["state"], state["restart_count"]) == ("restarting", 1)
    assert "elastic agent restarted the workers (restart 1 of 1)" in state["reason"]
