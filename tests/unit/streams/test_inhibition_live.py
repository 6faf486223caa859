"""Issue 34.3: inhibition is decided when it happens and published then, across the two stages.

A thermally throttled GPU makes its rank a straggler: `straggler` (job stage) fires within seconds,
`gpu_throttling` (rank stage, 120 s sustain) two minutes later. When the throttling fires, the
straggler's firing record is re-sent muted at that moment -- before, the job stage marked it muted
in its grouper only, so the page showed both firing and only the straggler's resolved record said
muted (a muting the history showed and nobody saw live)."""

from __future__ import annotations

from pathlib import Path

from ranksight.evaluation import run_scenario
from streams.alerting.routing import load_router
from streams.config import load_config

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
