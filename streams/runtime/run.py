"""Run the worker in this process until SIGINT/SIGTERM (what `ranksight worker` calls)."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType

from streams.runtime.options import WorkerOptions

__all__ = ["STOP_GRACE_S", "install_stop_deadline", "run_worker"]

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


def run_worker(options: WorkerOptions) -> None:
    """Run the worker on `options.runtime` until SIGINT/SIGTERM (it stops within `STOP_GRACE_S`)."""
    logging.basicConfig(
        level=getattr(logging, options.log_level.upper(), logging.WARNING),
        format="[%(asctime)s] [%(process)d] [%(levelname)s] %(name)s: %(message)s",
    )
    if options.runtime == "faust":
        from streams.runtime.faust_adapter import run_faust

        run_faust(options)
        return
    from streams.runtime.loop import DirectWorker

    worker = DirectWorker(options)
    # The first signal begins the clean stop; a second one, or a stop not done in time, exits hard.
    install_stop_deadline(on_stop=worker.stop)
    worker.run()
