"""Stopping the worker: SIGTERM/SIGINT end the process within a grace period, whatever it is doing."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType

__all__ = ["STOP_GRACE_S", "install_stop_deadline"]

log = logging.getLogger("ranksight.worker")

# After SIGTERM/SIGINT the worker stops cleanly (checkpoints every partition, leaves the group);
# if that has not finished within this many seconds the process exits anyway.
STOP_GRACE_S = 10.0


def install_stop_deadline(grace_s: float = STOP_GRACE_S, on_stop: Callable[[], None] | None = None) -> None:
    """Make SIGTERM/SIGINT end the process within `grace_s` seconds whatever the worker is doing.

    Installed explicitly for both signals, whatever disposition the process inherited: a program
    started with `cmd &` from a script or by `nohup` inherits SIGINT *ignored*, and Python then never
    raises KeyboardInterrupt. A Python-level handler runs in the main thread between bytecodes: it
    calls `on_stop` (the clean stop begins) and starts a timer that exits the process if the clean
    stop has not finished in time. A second signal exits at once.
    """
    armed: list[threading.Timer] = []

    def _exit(signum: int) -> None:
        log.warning("still stopping %.0f s after %s: exiting now", grace_s, signal.Signals(signum).name)
        sys.stderr.flush()
        os._exit(128 + signum)

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        if armed:
            _exit(signum)
        timer = threading.Timer(grace_s, _exit, (signum,))
        timer.daemon = True
        armed.append(timer)
        timer.start()
        if on_stop is not None:
            log.warning("%s: stopping (checkpointing every partition first)", signal.Signals(signum).name)
            on_stop()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _on_signal)
