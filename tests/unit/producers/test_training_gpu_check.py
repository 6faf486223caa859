"""bench/gpu_check.py on a machine without a GPU says so in one line and exits 0 (so a GPU session can run
it as is, and CI never fails on it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "bench" / "gpu_check.py"


def test_gpu_check_without_a_gpu_says_so_and_exits_0() -> None:
    try:
        import torch

        if torch.cuda.is_available():
            pytest.skip("this machine has a GPU: run bench/gpu_check.py itself")
    except ImportError:
        pass
    run = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "nothing measured" in run.stdout
    assert run.stdout.count("\n") == 1 and "Traceback" not in run.stderr
