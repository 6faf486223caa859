"""Engine snapshots: version 3 (issue 31.3: the step is the topology's pace, placements its bindings)
and a version 2 snapshot, taken by the code before it, restoring and going on as if never stopped.

`tests/fixtures/snapshots/detection_engine_v2.bin` is `DetectionEngine.snapshot()` of commit 88fee26
(SNAPSHOT_VERSION 2) after the first 400 records of `test_engine._stalled_job()`: its stage engines
still hold the `progress` map and the summariser's `placed` map that version 3 dropped.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import pytest

from streams.config import load_config
from streams.detectors.base import dumps_state, loads_state
from streams.errors import StreamsError
from streams.offline.detection import DetectionEngine
from streams.stages.engine import SNAPSHOT_VERSION, StageEngine
from tests.unit.streams.test_engine import _stalled_job

V2 = Path(__file__).resolve().parents[2] / "fixtures" / "snapshots" / "detection_engine_v2.bin"
CUT = 400


def _alerts(out: list) -> list[tuple[str, str, str]]:
    return [(e.record["alert_id"], e.record["rule"], e.record["status"]) for e in out if e.type == "Alert"]


def test_the_version_is_three_and_a_stage_snapshot_says_so() -> None:
    engine = StageEngine(load_config(None), stage="rank")
    assert SNAPSHOT_VERSION == 3
    assert loads_state(zlib.decompress(engine.snapshot()))["version"] == 3


def test_a_version_2_snapshot_restores_and_raises_the_alerts_of_an_uninterrupted_run() -> None:
    events = _stalled_job()
    state = loads_state(zlib.decompress(V2.read_bytes()))
    ranks = [loads_state(zlib.decompress(bytes.fromhex(h))) for h in state["rank"]]
    assert {r["version"] for r in ranks} == {2} and any(r["summarizer"]["placed"] for r in ranks)
    whole = DetectionEngine(load_config(None))
    expected = [x for e in events for x in whole.process(e)] + whole.finish()
    restored = DetectionEngine.restore(V2.read_bytes(), load_config(None))
    out = [x for e in events[CUT:] for x in restored.process(e)] + restored.finish()
    assert _alerts(out) == _alerts(expected) and _alerts(out)  # the stall fires after the cut
    # The whole records too: the step and progress time they carry come from the restored pace.
    assert [e.record for e in out if e.type == "Alert"] == [e.record for e in expected if e.type == "Alert"]


def test_a_snapshot_of_an_unknown_version_is_refused_with_what_to_do() -> None:
    engine = StageEngine(load_config(None), stage="job")
    state = loads_state(zlib.decompress(engine.snapshot()))
    state["version"] = 1
    with pytest.raises(StreamsError, match=r"version 1 is not supported.*delete it"):
        StageEngine.restore(zlib.compress(dumps_state(state)), load_config(None), stage="job")


def test_the_offline_driver_reads_its_envelope_as_a_stage_engine_does() -> None:
    """Review note D6: one envelope (version, compression, errors) for both; a stage's own
    snapshot travels inside."""
    engine = DetectionEngine(load_config(None), partitions=2)
    state = loads_state(zlib.decompress(engine.snapshot()))
    assert state["version"] == SNAPSHOT_VERSION and len(state["rank"]) == 2
    state["version"] = 1
    with pytest.raises(StreamsError, match=r"version 1 is not supported.*delete it"):
        DetectionEngine.restore(zlib.compress(dumps_state(state)), load_config(None))
    with pytest.raises(StreamsError, match="corrupt"):
        DetectionEngine.restore(b"not a snapshot", load_config(None))
