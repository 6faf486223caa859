"""Run the detection app as a Faust worker in this process (what `ranksight worker` calls)."""

from __future__ import annotations

import logging
import time

from streams.app import WorkerOptions, build_app
from streams.errors import StreamsError

__all__ = ["run_worker"]

log = logging.getLogger("ranksight.worker")


def run_worker(options: WorkerOptions) -> None:
    """Start the worker and block until it is stopped (SIGINT/SIGTERM stop it cleanly)."""
    from aiokafka.codec import has_lz4
    from faust.worker import Worker

    if not has_lz4():
        # Producers compress with lz4; aiokafka cannot read such batches without cramjam.
        raise StreamsError(
            "the worker cannot read lz4-compressed topics: pip install cramjam (aiokafka[lz4])"
        )
    started = time.monotonic()
    app = build_app(options)
    log.info("app built in %.2f s", time.monotonic() - started)
    worker = Worker(app, loglevel=options.log_level, quiet=True, redirect_stdouts=False)
    worker.execute_from_commandline()
