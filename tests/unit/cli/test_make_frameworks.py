"""`make test-frameworks` where PyTorch's CPU wheel index cannot be reached (issue 24.8)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def test_an_unreachable_torch_index_says_what_to_do_and_fails_fast(tmp_path: Path) -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    index = f"http://127.0.0.1:{closed}/whl/cpu"
    started = time.monotonic()
    done = subprocess.run(
        ["make", "-s", "framework-torch", f"TORCH_INDEX_URL={index}",
         f"FRAMEWORK_VENV={tmp_path / 'fw'}", f"PYTHON={sys.executable}"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode != 0
    assert f"PyTorch's CPU wheel index {index} cannot be reached" in done.stderr, done.stderr
    assert "TORCH_INDEX_URL=<a mirror of it>" in done.stderr and "pip install /path/to/torch" in done.stderr
    assert time.monotonic() - started < 120  # said at once, not after pip's retries
