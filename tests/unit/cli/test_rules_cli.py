"""`ranksight rules explain`: the value a job gets for each knob of a rule, and which file or override decided."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from ranksight.cli import app

runner = CliRunner()


def test_explain_names_the_override_that_decides_and_prints_globs_literally(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        "overrides:\n"
        "  - name: a100-memory\n"
        "    match: {gpu_class: '[AB]100*'}\n"
        "    detectors: {infrastructure: {gpu_mem_ratio: 0.95}}\n"
    )
    argv = [
        "rules",
        "explain",
        "gpu_memory_pressure",
        "--set",
        "gpu_class=A100-80GB",
        "--config",
        str(config),
    ]
    result = runner.invoke(app, argv, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    line = next(line for line in result.output.splitlines() if "gpu_mem_ratio" in line)
    assert "0.95" in line and "a100-memory" in line and "[AB]100*" in line
    other = runner.invoke(
        app, [*argv[:3], "--set", "gpu_class=H100", "--config", str(config)], env={"COLUMNS": "200"}
    )
    line = next(line for line in other.output.splitlines() if "gpu_mem_ratio" in line)
    assert "0.97" in line and "shipped default" in line


def test_explain_refuses_an_unknown_rule_or_key_in_one_sentence() -> None:
    bad = runner.invoke(app, ["rules", "explain", "no_such_rule"])
    assert (
        bad.exit_code != 0 and "unknown rule 'no_such_rule'" in bad.output and "Traceback" not in bad.output
    )
    key = runner.invoke(app, ["rules", "explain", "straggler", "--set", "gpu=A100"])
    assert key.exit_code != 0 and "expected KEY=VALUE" in key.output


def test_explain_shows_what_a_gpu_class_learned_from_a_recording(tmp_path: Path) -> None:
    """Issue 35.1: three healthy A100-40GB runs at 98.5 % memory teach the class its headroom."""
    from schemas.files import write_container
    from tests.unit.streams.builders import T0, gpu_sample, job_started, job_state

    events = []
    for n in range(3):
        job, node, start = f"a{n}", f"node-a{n}", T0 + n * 330_000  # back to back: no clock jump
        events.append(job_started(job, start, world_size=1, gpu_class="A100-40GB"))
        sample = [
            gpu_sample(node, 0, start + (i + 1) * 10_000, mem_used=int(0.985 * 80 * 2**30)) for i in range(30)
        ]
        for ev in sample:
            ev.record["job_id"] = job  # the agent attributes its GPU to the job
        events += sample
        events.append(job_state(job, start + 320_000, "completed"))
    recording = tmp_path / "runs.avro"
    write_container(recording, events)
    argv = [
        "rules",
        "explain",
        "gpu_memory_pressure",
        "--set",
        "gpu_class=A100-40GB",
        "--learn-from",
        str(recording),
    ]
    result = runner.invoke(app, argv, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    line = next(line for line in result.output.splitlines() if "gpu_mem_ratio" in line)
    assert "0.995" in line and "learned from 3 healthy runs of A100-40GB" in line
    other = runner.invoke(app, [*argv[:4], "gpu_class=H100-80GB", *argv[5:]], env={"COLUMNS": "200"})
    line = next(line for line in other.output.splitlines() if "gpu_mem_ratio" in line)
    assert "0.97" in line and "shipped default" in line
    missing = runner.invoke(app, [*argv[:5], "--learn-from", str(tmp_path / "none.avro")])
    assert missing.exit_code != 0 and "no such recording" in missing.output
