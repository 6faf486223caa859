"""Issue 34.3: inhibition is decided when it happens and published then, across the two stages.

A thermally throttled GPU makes its rank a straggler: `straggler` (job stage) fires within seconds,
`gpu_throttling` (rank stage, 120 s sustain) two minutes later. When the throttling fires, the
straggler's firing record is re-sent muted at that moment -- before, the job stage marked it muted
in its grouper only, so the page showed both firing and only the straggler's resolved record said
muted (a muting the history showed and nobody saw live)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from producers.simulator import load_scenario, simulate
from ranksight.evaluation import run_scenario
from schemas.codec import Codec
from streams.alerting.routing import load_router
from streams.config import load_config
from streams.offline.evaluate import evaluate_alerts
from streams.runtime.options import WorkerOptions
from tests.unit.streams.runtime.fake_kafka import FakeKafka, alerts_of, drive

CODEC = Codec()

SCENARIO = """
name: throttled_straggler
duration: 7m
cluster: {name: sim-a, nodes: 1, gpus_per_node: 8, gpu_class: H100-80GB}
jobs:
  - {id: job-t, team: llm-pretrain, owner: alice, nodes: 1}
faults:
  - {type: straggler_gpu, job: job-t, rank: 5, start: 2m, duration: 4m, magnitude: 1.5, variant: thermal}
"""


def test_a_straggler_is_muted_live_when_the_throttling_that_explains_it_fires(tmp_path: Path) -> None:
    path = tmp_path / "throttled_straggler.yaml"
    path.write_text(SCENARIO)
    alerts = [a for a in run_scenario(path, 0, load_config(), load_router()).alerts if a["rank"] == 5]
    first = {a["rule"]: a for a in reversed(alerts) if a["status"] == "firing"}
    straggler, throttling = first["straggler"], first["gpu_throttling"]
    assert straggler["inhibited_by"] is None and straggler["ts"] < throttling["ts"]
    muted = [a for a in alerts if a["rule"] == "straggler" and a["status"] == "firing" and a["inhibited_by"]]
    assert muted, "the straggler is re-sent muted when the throttling fires"
    # Re-sent muted when the throttling fired, and muted in every record after (the straggler's
    # refreshes while it fires carry the muting too: a page never shows it unmuted again).
    assert throttling["ts"] in {a["ts"] for a in muted}
    first_muted = next(i for i, a in enumerate(alerts) if a["rule"] == "straggler" and a["inhibited_by"])
    after = [a for a in alerts[first_muted:] if a["rule"] == "straggler" and a["status"] == "firing"]
    assert after == muted
    assert {a["inhibited_by"] for a in muted} == {throttling["alert_id"]}
    assert {a["alert_id"] for a in muted} == {straggler["alert_id"]}
    # The resolved record says what the live record said from then on, never more.
    (resolved,) = {
        a["alert_id"]: a for a in alerts if a["rule"] == "straggler" and a["status"] == "resolved"
    }.values()
    assert resolved["inhibited_by"] == throttling["alert_id"]


# The throttling comes first: a thermal straggler of 1.22x with the throttling rule's sustain at 20 s
# (its default 120 s lets the straggler's 40 s of evidence win).
THROTTLED_FIRST = SCENARIO.replace("magnitude: 1.5", "magnitude: 1.22").replace(
    "duration: 4m", "duration: 5m"
)
FAST_THROTTLE = {"detectors": {"infrastructure": {"throttle_sustain_s": 20.0}}}


def _straggler_and_throttling(alerts: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    ours = [a for a in alerts if a["rank"] == 5 or a["rule"] == "gpu_throttling"]
    throttling = next(a for a in ours if a["rule"] == "gpu_throttling" and a["status"] == "firing")
    return [a for a in ours if a["rule"] == "straggler"], throttling


def test_a_straggler_whose_throttling_fires_first_is_muted_from_its_first_record(tmp_path: Path) -> None:
    """Issue 34.3 with both firing together: gpu_throttling fires, then its straggler. Every record of
    the straggler (its firing, its refreshes, its resolution) is muted by the throttling, in the
    offline replay and in the alerts topic the worker writes: no page ever showed it unmuted."""
    path = tmp_path / "throttled_first.yaml"
    path.write_text(THROTTLED_FIRST)
    config = load_config(None, FAST_THROTTLE)
    run = run_scenario(path, 0, config, load_router())
    straggler, throttling = _straggler_and_throttling(run.alerts)
    firing = [a for a in straggler if a["status"] == "firing"]
    assert firing and throttling["ts"] < firing[0]["ts"], "the throttling fires first"
    assert len(firing) > 1, "the straggler is refreshed while it fires"
    assert {a["inhibited_by"] for a in straggler} == {throttling["alert_id"]}
    assert {a["group_key"] for a in straggler} == {throttling["group_key"]}
    result = evaluate_alerts("throttled_first", run.alerts, run.labels, config, jobs=run.jobs)
    assert "straggler" not in result.rules and result.inhibited >= 1  # recorded, never paged
    # The worker core writes the same to the alerts topic (its records, decoded from the topic).
    events = list(simulate(load_scenario(path), seed=0).events())
    kafka = FakeKafka(6)
    kafka.publish(events, CODEC)
    drive(
        kafka,
        WorkerOptions(bootstrap="unused", workdir=tmp_path / "worker", config_path=_config_file(tmp_path)),
    )
    topic, topic_throttling = _straggler_and_throttling(alerts_of(kafka, CODEC))
    assert topic and {a["inhibited_by"] for a in topic} == {topic_throttling["alert_id"]}
    assert {(a["alert_id"], a["status"]) for a in topic} == {(a["alert_id"], a["status"]) for a in straggler}


def _config_file(tmp_path: Path) -> Path:
    path = tmp_path / "fast_throttle.yaml"
    path.write_text(yaml.safe_dump(FAST_THROTTLE))
    return path
