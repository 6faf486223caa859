"""A restore test scheduled through real Slurm (issue 35.4): the rendered batch script runs the
team's restore command and reports its verdict as a RestoreTest record, with the identity it ran."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from schemas.files import iter_container
from tests.integration.scheduler.conftest import SlurmCluster

pytestmark = pytest.mark.integration


def _render(tmp_path: Path, name: str, command: str) -> tuple[Path, Path]:
    out = tmp_path / f"{name}.avro"
    script = tmp_path / f"{name}.sbatch"
    done = subprocess.run(
        [sys.executable, "-m", "ranksight.cli", "checkpoint", "restore-job", "--slurm", "--gpus", "0",
         "--job", f"{name}; touch {tmp_path}/pwned", "--checkpoint", "ckpt-7", "--command", command,
         "--code-version", "abc123", "--checkpoint-format", "dcp-2", "--to", f"file://{out}", "-o", str(script)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return script, out


def _records(path: Path, deadline: float) -> list[dict]:
    while time.monotonic() < deadline:
        if path.exists():
            try:
                return [e.record for e in iter_container(path) if e.type == "RestoreTest"]
            except Exception:  # still being written
                pass
        time.sleep(0.5)
    raise AssertionError(f"no RestoreTest written to {path}")


def test_a_scheduled_restore_test_reports_passed_and_failed_with_its_identity(
    slurm: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The batch job runs `ranksight` from this interpreter's environment.
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    ok_script, ok_out = _render(tmp_path, "good", "true")
    bad_script, bad_out = _render(tmp_path, "bad", "echo restoring; exit 3")
    slurm.sbatch(str(ok_script))
    slurm.sbatch(str(bad_script))
    deadline = time.monotonic() + 240
    [ok] = _records(ok_out, deadline)
    [bad] = _records(bad_out, deadline)
    assert ok["passed"] is True and ok["checkpoint_id"] == "ckpt-7"
    assert (ok["code_version"], ok["checkpoint_format"]) == ("abc123", "dcp-2")
    assert ok["job_id"] == f"good; touch {tmp_path}/pwned"  # a literal id, never a shell command
    assert bad["passed"] is False and "exited with status 3" in (bad["error"] or "")
    assert not (tmp_path / "pwned").exists(), slurm.logs()
