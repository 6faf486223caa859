"""Run the worker in this process until SIGINT/SIGTERM (what `ranksight worker` calls)."""

from __future__ import annotations

import logging

from streams import gc_policy
from streams.runtime.options import WorkerOptions
from streams.runtime.stop import install_stop_deadline

__all__ = ["run_worker"]

log = logging.getLogger("ranksight.worker")


def run_worker(options: WorkerOptions) -> None:
    """Run the worker on `options.runtime` until SIGINT/SIGTERM (it stops within `STOP_GRACE_S`)."""
    logging.basicConfig(
        level=getattr(logging, options.log_level.upper(), logging.WARNING),
        format="[%(asctime)s] [%(process)d] [%(levelname)s] %(name)s: %(message)s",
    )
    gc_policy.for_long_lived_state()
    if options.runtime == "faust":
        from streams.runtime.faust_adapter import run_faust

        run_faust(options)
        return
    from streams.runtime.loop import DirectWorker

    worker = DirectWorker(options)
    # The first signal begins the clean stop; a second one, or a stop not done in time, exits hard.
    install_stop_deadline(on_stop=worker.stop)
    worker.run()
