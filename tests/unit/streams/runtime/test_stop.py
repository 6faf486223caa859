"""Stopping the worker: SIGTERM/SIGINT end the process within the grace period, whatever it is doing."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

_BLOCKED_LOOP = """
import asyncio, signal, sys, time
from streams.runtime.stop import install_stop_deadline

async def main():
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, lambda: print("loop got SIGTERM", flush=True))
    install_stop_deadline(1.0)
    print("busy", flush=True)
    while True:  # a computation that never yields to the loop
        sum(range(1000))

asyncio.run(main())
"""


def test_sigterm_ends_a_process_whose_event_loop_is_blocked() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", _BLOCKED_LOOP],
        stdout=subprocess.PIPE,
        cwd=Path(__file__).resolve().parents[4],
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"busy\n"
    signalled = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(20)
    finally:
        proc.kill()
    print(f"exited {time.monotonic() - signalled:.1f} s after SIGTERM")
    assert code == 128 + signal.SIGTERM
