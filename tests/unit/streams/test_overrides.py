"""Knobs per workload (issue 35.1): an override changes a knob for the jobs its selector matches
and for no other job, the most specific override wins, a bad override fails at load, and the
engine's snapshot keeps each profile's state."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from schemas.records import Event
from streams.config import load_config
from streams.detectors.base import JobInfo
from streams.detectors.lr_invalid import DEFAULTS as LR_DEFAULTS
from streams.errors import ConfigError
from streams.offline.detection import DetectionEngine
from streams.overrides import explain
from streams.stages.engine import StageEngine
from tests.unit.streams.builders import T0, job_started, step

FINETUNE = {"workload_family": "finetune-7b", "gpu_class": "A100-80GB", "team": "llm-finetune"}
PRETRAIN = {"workload_family": "pretrain-70b", "gpu_class": "H100-80GB", "team": "llm-pretrain"}


def config(tmp_path: Path, overrides: list[dict]) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"overrides": overrides}))
    return path


def lr_steps(job: str, lr: float, n: int = 3) -> list[Event]:
    out = []
    for i in range(n):
        ev = step(job, 0, i, T0 + 10_000 + 1000 * i)
        ev.record["lr"] = lr
        out.append(ev)
    return out


def fired(engine: DetectionEngine, events: list[Event]) -> list[tuple[str, str]]:
    out = [e for ev in events for e in engine.process(ev)] + engine.finish()
    return sorted(
        {
            (a.record["rule"], a.record["job_id"])
            for a in out
            if a.type == "Alert" and a.record["status"] == "firing"
        }
    )


OVERRIDES = [
    {
        "name": "finetune-lr",
        "match": {"workload_family": "finetune*"},
        "detectors": {"numerical": {"lr_max": 0.01}},
    },
    {
        "name": "finetune-a100-lr",
        "match": {"workload_family": "finetune*", "gpu_class": "A100*"},
        "detectors": {"numerical": {"lr_max": 0.02}},
    },
]


def test_an_override_changes_the_knob_for_the_jobs_it_matches_only(tmp_path: Path) -> None:
    """lr 0.05: the fine-tune (ceiling 0.02 by its most specific override) pages; the pretrain
    run (shipped ceiling 100) does not; without overrides neither does."""
    cfg = load_config(config(tmp_path, OVERRIDES))
    events = [
        job_started("ft", T0, **FINETUNE),
        job_started("pt", T0, **PRETRAIN),
        *lr_steps("ft", 0.05),
        *lr_steps("pt", 0.05),
    ]
    assert fired(DetectionEngine(cfg), events) == [("lr_invalid", "ft")]
    assert fired(DetectionEngine(), events) == []


def test_the_most_specific_override_wins_whatever_its_place_in_the_file(tmp_path: Path) -> None:
    cfg = load_config(config(tmp_path, list(reversed(OVERRIDES))))
    ft = JobInfo("ft", **FINETUNE)
    configured = cfg.detectors.get("numerical", {})
    rows = {
        knob: (value, why)
        for knob, value, why in explain("numerical", LR_DEFAULTS, configured, cfg.overrides, ft)
    }
    assert rows["lr_max"][0] == 0.02 and "finetune-a100-lr" in rows["lr_max"][1]
    assert rows["lr_min"] == (0.0, "shipped default")
    # 0.015 is over the family's 0.01 but under the A100 override's 0.02: no page.
    events = [job_started("ft", T0, **FINETUNE), *lr_steps("ft", 0.015)]
    assert fired(DetectionEngine(cfg), events) == []


def test_a_snapshot_keeps_each_profiles_state(tmp_path: Path) -> None:
    cfg = load_config(config(tmp_path, OVERRIDES))
    stage = StageEngine(cfg, stage="job")
    for ev in [job_started("ft", T0, **FINETUNE), *lr_steps("ft", 0.05, n=1)]:
        stage.process(ev)
    again = StageEngine.restore(stage.snapshot(), cfg, stage="job")
    assert again.snapshot() == stage.snapshot()
    # The fine-tune's open condition came back with its profile: a step back in range resolves it.
    later = step("ft", 0, 5, T0 + 20_000)
    later.record["lr"] = 1e-4
    back = again.process(later) + again.advance(T0 + 60_000)
    statuses = [a.record["status"] for a in back if a.type == "Alert" and a.record["rule"] == "lr_invalid"]
    assert "resolved" in statuses


@pytest.mark.parametrize(
    ("override", "says"),
    [
        ({"match": {"gpu": "A100"}, "detectors": {"numerical": {"lr_max": 1}}}, "unknown selector match.gpu"),
        (
            {"match": {"gpu_class": "A100"}, "detectors": {"numerikal": {"lr_max": 1}}},
            "unknown detector section",
        ),
        (
            {"match": {"gpu_class": "A100"}, "detectors": {"numerical": {"lr_maks": 1}}},
            "unknown knob numerical.lr_maks",
        ),
        ({"match": {}, "detectors": {"numerical": {"lr_max": 1}}}, "`match` must map"),
        ({"match": {"gpu_class": "A100"}, "detectors": {"numerical": {"lr_max": "high"}}}, "bad value"),
        (
            {"match": {"gpu_class": "A100"}, "detectors": {"numerical": {"lr_max": 1}}, "when": "x"},
            "unknown key 'when'",
        ),
    ],
)
def test_a_bad_override_is_one_clear_error_at_load(tmp_path: Path, override: dict, says: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(config(tmp_path, [override]))
    assert says in str(info.value) and "overrides[0]" in str(info.value)
