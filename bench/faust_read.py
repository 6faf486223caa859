"""The read limit of a Faust agent: a do-nothing agent drains the worker's topics of a prefix.

Started by bench_worker.py (`python bench/faust_read.py N worker`, with `KAFKA_BOOTSTRAP` and
`RANKSIGHT_TOPIC_PREFIX` set) on the backlog it published: the same Faust app settings and
transport as `ranksight worker`, one agent over the same topics, nothing done per record but
counting (and decoding, with `BENCH_DECODE=1`). Prints one line, "faust read: <n> <seconds>", timed
from its partition assignment to its N-th record, and exits.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from typing import Any

from schemas.codec import Codec
from streams.runtime.faust_transport import App
from streams.runtime.options import JOB_TOPICS, NODE_TOPICS


def main() -> None:
    expected = int(sys.argv[1])
    prefix = os.environ.get("RANKSIGHT_TOPIC_PREFIX", "")
    decode = os.environ.get("BENCH_DECODE") == "1"
    app = App(
        f"{prefix}faust-read-{os.getpid()}",
        broker=f"kafka://{os.environ['KAFKA_BOOTSTRAP']}",
        store="memory://",
        datadir=tempfile.mkdtemp(),
        web_enabled=False,
        consumer_auto_offset_reset="earliest",
        stream_wait_empty=False,
        stream_buffer_maxsize=16_384,
        broker_max_poll_records=5_000,
        key_serializer="raw",
        value_serializer="raw",
    )
    # The worker's inputs that carry source records (not the internal bindings / re-keyed topics).
    names = [prefix + t for t in (*JOB_TOPICS, *NODE_TOPICS) if not t.startswith("rs.internal.")]
    source = app.topic(*names, key_serializer="raw", value_serializer="raw")
    codec = Codec()
    started: list[float] = []

    @app.on_partitions_assigned.connect  # type: ignore[arg-type]
    async def _assigned(app_: Any, assigned: Any, **kwargs: Any) -> None:
        if assigned and not started:
            started.append(time.perf_counter())

    @app.agent(source)
    async def read(stream: Any) -> None:
        count = 0
        async for fevent in stream.noack().events():
            if decode:
                codec.decode(fevent.value)
            count += 1
            if count >= expected:
                print(f"faust read: {count} {time.perf_counter() - started[0]:.3f}", flush=True)
                os._exit(0)

    sys.argv = [sys.argv[0], "worker", "--loglevel", "warn", "--without-web"]
    app.main()


if __name__ == "__main__":
    main()
