"""`ranksight simulate` and scenario files: validation messages, output files, round trips."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from producers.simulator import ScenarioError, builtin_scenarios, load_scenario, simulate
from producers.simulator.scenario import parse_duration, scenario_from_mapping
from ranksight.cli import app
from schemas.files import JsonlFormat, iter_container, write_container

runner = CliRunner()

MINIMAL = {
    "name": "tiny",
    "duration": "3m",
    "cluster": {"nodes": 1, "gpus_per_node": 2},
    "jobs": [{"id": "job-1", "team": "llm", "nodes": 1}],
}


def _with(**changes: object) -> dict[str, object]:
    doc = json.loads(json.dumps(MINIMAL))
    for path, value in changes.items():
        target = doc
        keys = path.split("__")
        for key in keys[:-1]:
            target = target[int(key)] if isinstance(target, list) else target[key]
        target[keys[-1]] = value
    return doc


@pytest.mark.parametrize(
    ("doc", "key", "words"),
    [
        (_with(durration="3m"), "durration", "did you mean duration"),
        (_with(jobs__0__stp_time="1s"), "jobs[0].stp_time", "did you mean step_time"),
        (_with(cluster__gpu_per_node=4), "cluster.gpu_per_node", "did you mean gpus_per_node"),
        (_with(jobs__0__checkpoint={"evry": "5m"}), "jobs[0].checkpoint.evry", "did you mean every"),
        (_with(jobs__0__step_time="fast"), "jobs[0].step_time", "expected a duration"),
        (
            _with(faults=[{"type": "straggler", "job": "job-1", "start": "1m"}]),
            "faults[0].type",
            "straggler_gpu",
        ),
        (_with(faults=[{"type": "straggler_gpu", "job": "job-1", "start": "1m"}]), "faults[0].rank", "needs"),
        (
            _with(faults=[{"type": "straggler_gpu", "job": "job-1", "rank": 9, "start": "1m"}]),
            "faults[0].rank",
            "0..1",
        ),
        (
            _with(faults=[{"type": "nan_loss", "job": "job-1", "start": "1m", "magnitude": 2}]),
            "faults[0].magnitude",
            "unknown key",
        ),
        (
            _with(faults=[{"type": "rank_hang", "job": "job-1", "rank": 0, "start": "1m", "gpus": "warm"}]),
            "faults[0].gpus",
            "busy, idle",
        ),
        (_with(faults=[{"type": "job_stall", "job": "nope", "start": "1m"}]), "faults[0].job", "no job"),
        (_with(jobs__0__nodes=3), "jobs[0].nodes", "1 are free"),
        (
            _with(
                jobs=[
                    {"id": "a", "team": "t", "nodes": ["node-01"]},
                    {"id": "b", "team": "t", "nodes": ["node-01"]},
                ]
            ),
            "jobs[1].nodes",
            "already used by job a",
        ),
        (_with(jobs=3), "jobs", "non-empty list"),
        (_with(jobs__0__team=None) | {}, "jobs[0].team", "non-empty string"),
    ],
)
def test_a_scenario_error_names_the_offending_key(doc: dict[str, object], key: str, words: str) -> None:
    with pytest.raises(ScenarioError) as err:
        scenario_from_mapping(doc, "s.yaml")
    assert err.value.key == key
    assert str(err.value).startswith(f"s.yaml: {key}: ")
    assert words in str(err.value)


def test_a_minimal_scenario_gets_sane_defaults() -> None:
    sc = scenario_from_mapping(MINIMAL, "s.yaml")
    (job,) = sc.jobs
    assert (sc.duration, job.nodes, job.world_size, job.step_time, sc.telemetry.interval) == (
        180.0,
        ("node-01",),
        2,
        1.0,
        2.0,
    )
    assert job.family == "llama-7b-pretrain"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90.0), ("90s", 90.0), ("20m", 1200.0), ("1h30m", 5400.0), ("500ms", 0.5), (7, 7.0)],
)
def test_durations_read_like_people_write_them(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


def test_a_scenario_file_that_is_not_yaml_or_missing_is_a_one_line_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("jobs: [\n")
    with pytest.raises(ScenarioError, match="not valid YAML"):
        load_scenario(bad)
    with pytest.raises(ScenarioError, match="no such scenario file or built-in"):
        load_scenario("no_such_scenario")


def test_events_round_trip_through_a_container_file(tmp_path: Path) -> None:
    sc = load_scenario("nan_loss").with_overrides(duration=9 * 60)
    events = list(simulate(sc, 3).events())
    path = tmp_path / "events.avro"
    assert write_container(path, events) == len(events)
    back = list(iter_container(path))
    fmt = JsonlFormat()
    assert [fmt.to_line(e) for e in back] == [fmt.to_line(e) for e in events]
    assert any(e.type == "StepCompleted" and math.isnan(e.record["loss"]) for e in back)


def test_the_cli_writes_events_and_labels_that_events_dump_reads_back_identically(tmp_path: Path) -> None:
    out = tmp_path / "run" / "events.avro"
    args = [
        "simulate",
        "--scenario",
        "xid_error",
        "--seed",
        "5",
        "--out",
        str(out),
        "--duration",
        "9m",
        "-q",
    ]
    first = runner.invoke(app, args)
    assert first.exit_code == 0, first.output
    labels = [json.loads(line) for line in (out.parent / "labels.jsonl").read_text().splitlines()]
    assert [(lb["fault"], lb["alert"], lb["gpu_index"]) for lb in labels] == [("xid_error", "xid_error", 6)]
    dumped = runner.invoke(app, ["events", "dump", str(out)])
    assert dumped.exit_code == 0
    sc = load_scenario("xid_error").with_overrides(duration=540)
    fmt = JsonlFormat()
    expected = "".join(fmt.to_line(e) + "\n" for e in simulate(sc, 5).events())
    assert dumped.stdout == expected
    again = runner.invoke(app, [*args[:5], "--out", str(tmp_path / "again.avro"), "--duration", "9m", "-q"])
    assert again.exit_code == 0
    assert runner.invoke(app, ["events", "dump", str(tmp_path / "again.avro")]).stdout == expected
    assert (tmp_path / "labels.jsonl").read_text() == (out.parent / "labels.jsonl").read_text()


def test_the_cli_moves_the_start_and_honours_an_explicit_labels_path(tmp_path: Path) -> None:
    out, labels = tmp_path / "e.avro", tmp_path / "l" / "faults.jsonl"
    res = runner.invoke(
        app,
        ["simulate", "-s", "healthy", "-o", str(out), "--labels", str(labels), "--duration", "1m",
         "--start", "2027-03-01T12:00:00Z", "-q"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    first = next(iter_container(out))
    assert first.record["ts"] == 1803902400000
    assert labels.read_text() == ""


def test_the_cli_names_what_is_wrong_without_a_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "typo.yaml"
    bad.write_text(yaml.safe_dump(_with(jobs__0__stp_time="1s")))
    res = runner.invoke(app, ["simulate", "-s", str(bad), "-o", str(tmp_path / "x.avro")])
    assert res.exit_code == 1
    assert "typo.yaml: jobs[0].stp_time: unknown key, did you mean step_time?" in res.output
    assert "Traceback" not in res.output
    assert not (tmp_path / "x.avro").exists()
    nowhere = runner.invoke(app, ["simulate", "-s", "healthy"])
    assert nowhere.exit_code == 1 and "--out" in nowhere.output


def test_list_shows_every_builtin_scenario_with_its_expected_alert() -> None:
    res = runner.invoke(app, ["simulate", "--list"])
    assert res.exit_code == 0
    for name in builtin_scenarios():
        assert name in res.output
    assert "long_checkpoint -> no alert" in res.output


def test_the_progress_line_never_goes_backwards(capsys: pytest.CaptureFixture[str]) -> None:
    """The engine generates job by job, then node by node; the minutes it reports restart each pass."""
    from ranksight.commands.simulate import _Progress

    now = [0.0]
    progress = _Progress(30 * 60, quiet=False, clock=lambda: now[0])
    for minutes in (20.5, 6.2, 12.5, 25.0, 3.0, 30.0):
        now[0] += 3.0
        progress(1000, minutes * 60)
    shown = [
        float(line.split("simulated ")[1].split(" of")[0])
        for line in capsys.readouterr().err.splitlines()
        if "simulated" in line
    ]
    assert shown == [20.5, 20.5, 20.5, 25.0, 25.0, 30.0]


def test_a_live_simulation_ends_about_now() -> None:
    from ranksight.commands.simulate import live_start_ms

    assert live_start_ms(600.0, now_ms=1_800_000_000_000) == 1_800_000_000_000 - 600_000


def test_generate_writes_scenario_files_that_load_and_evaluate(tmp_path: Path) -> None:
    """`simulate --generate N` writes N valid scenario files; `evaluate --scenarios` scores them."""
    out = tmp_path / "generated"
    result = runner.invoke(app, ["simulate", "--generate", "4", "--seed", "5", "--out", str(out)])
    assert result.exit_code == 0, result.output
    files = sorted(out.glob("*.yaml"))
    assert len(files) == 4 and files[1].stem.endswith("-twin")
    scenarios = [load_scenario(f) for f in files]
    # A case and its must-not-alert twin (no fault, or a benign one), simulated for the same time.
    assert len(scenarios[0].faults) == 1 and scenarios[0].duration == scenarios[1].duration > 0
    scored = runner.invoke(app, ["evaluate", "--scenarios", str(out), "--only", files[1].stem])
    assert scored.exit_code == 0, scored.output
    assert "overall recall" in scored.output


def test_evaluate_generated_prints_a_summary_line() -> None:
    result = runner.invoke(app, ["evaluate", "--generated", "2", "--seed", "3"])
    assert result.exit_code == 0, result.output
    assert "2 generated cases (seed 3)" in " ".join(result.output.split())
