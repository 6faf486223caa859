"""Run the detection app as a Faust worker in this process (what `ranksight worker` calls)."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from streams.app import WorkerOptions, build_app
from streams.errors import StreamsError

__all__ = ["STOP_GRACE_S", "install_stop_deadline", "run_worker"]

log = logging.getLogger("ranksight.worker")

# After SIGTERM/SIGINT the worker stops cleanly (Faust commits and leaves the group); if that has
# not finished within this many seconds - the event loop is busy or stuck - the process exits anyway.
STOP_GRACE_S = 10.0


def install_stop_deadline(grace_s: float = STOP_GRACE_S, on_stop: Callable[[], None] | None = None) -> None:
    """Make SIGTERM/SIGINT end the process within `grace_s` seconds whatever the event loop is doing.

    Faust handles these signals on its event loop (`loop.add_signal_handler`), so a loop busy in a
    long computation never sees them. A Python-level handler runs in the main thread between
    bytecodes even then: it starts a timer that exits the process when the clean stop has not
    finished in time. The signal still reaches Faust's handler through the loop's wakeup fd, so a
    responsive worker stops cleanly first. A second signal exits at once. `on_stop` (a worker
    without an event loop) is called on the first signal to begin the clean stop.
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


def run_worker(options: WorkerOptions) -> None:
    """Start the worker and block until it is stopped (SIGINT/SIGTERM stop it within seconds)."""
    from aiokafka.codec import has_lz4
    from faust.worker import Worker

    if not has_lz4():
        # Producers compress with lz4; aiokafka cannot read such batches without cramjam.
        raise StreamsError(
            "the worker cannot read lz4-compressed topics: pip install cramjam (aiokafka[lz4])"
        )

    class _Worker(Worker):
        def install_signal_handlers(self, *args: Any, **kwargs: Any) -> None:
            super().install_signal_handlers(*args, **kwargs)
            install_stop_deadline()

    started = time.monotonic()
    app = build_app(options)
    log.info("app built in %.2f s", time.monotonic() - started)
    worker = _Worker(app, loglevel=options.log_level, quiet=True, redirect_stdouts=False)
    worker.execute_from_commandline()
