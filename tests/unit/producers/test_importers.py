"""Real-data importers: Alibaba PAI mini-batch times, modded-nanogpt logs, Pythia losses -> events."""

from __future__ import annotations

import itertools
import os
import statistics
from pathlib import Path

import pytest
from typer.testing import CliRunner

from producers.importers import ImportFormatError, convert_nanogpt, convert_pai, convert_pythia
from ranksight.cli import app
from schemas.files import iter_container, parse_ts
from schemas.records import Event

REPO = Path(__file__).resolve().parents[3]
NANOGPT = {
    "muon": "eb5659d0-fb6a-49e5-a311-f1f89412f726.txt",
    "soap": "5bdc3988-496c-4232-b4ef-53764cb81c92.txt",
    "scaleup": "c0078066-c8c9-49c8-868a-ff4d4f32e615.txt",
}


@pytest.fixture(scope="module")
def real() -> Path:
    """The real-data folder (`RANKSIGHT_REAL_DATA`, else ../shared/data/real next to the repo): required."""
    path = Path(os.environ.get("RANKSIGHT_REAL_DATA") or REPO.parent / "shared" / "data" / "real")
    if not (path / "PROVENANCE.md").is_file():
        pytest.fail(
            f"real training data not found at {path}: set RANKSIGHT_REAL_DATA to the folder holding "
            "alibaba-pai-minibatch/, modded-nanogpt/ and pythia/ (see its PROVENANCE.md)"
        )
    return path


def of(events: list[Event], kind: str) -> list[dict]:
    return [e.record for e in events if e.type == kind]


def in_time_order(events: list[Event]) -> bool:
    ts = [e.record["ts"] for e in events]
    return ts == sorted(ts)


# -- Alibaba PAI -----------------------------------------------------------------------------


def test_pai_job1_gives_one_step_per_row_for_ten_bound_workers(real: Path) -> None:
    events = convert_pai(real / "alibaba-pai-minibatch" / "job_1_norm.csv")
    (job,) = of(events, "JobStarted")
    assert job["job_id"] == "pai-job_1" and job["world_size"] == 10 and job["workload_family"] == "pai-job_1"
    assert sorted(b["rank"] for b in of(events, "RankBound")) == list(range(10))
    steps = of(events, "StepCompleted")
    assert len(steps) == 3000
    assert all(s["forward_s"] is None and s["data_wait_s"] is None for s in steps)
    assert in_time_order(events) and events[-1].type == "JobStateChanged"
    peak = next(s for s in steps if s["rank"] == 6 and s["step"] == 1861)
    assert peak["step_time_s"] == pytest.approx(2.5)  # 1000 units x 2.5 s per 1000
    assert not any(e.type in ("GpuSample", "HostSample") for e in events)


def test_pai_job1_straggler_episode_spans_two_windows_with_five_steps_per_rank_in_each(real: Path) -> None:
    steps = of(convert_pai(real / "alibaba-pai-minibatch" / "job_1_norm.csv"), "StepCompleted")
    start = min(s["ts"] for s in steps if s["step"] == 1811)
    end = max(s["ts"] for s in steps if s["step"] == 1941)
    assert end - start >= 2 * 60_000
    rank0 = [s["ts"] for s in steps if s["rank"] == 0]
    # The imbalance detector scores a rank with at least 5 steps in a 60 s window: rows ~11 s apart.
    assert statistics.median(b - a for a, b in itertools.pairwise(rank0)) <= 11_000
    # All workers of one sampled iteration finish within one time region.
    at = [s["ts"] for s in steps if s["step"] == 1001]
    assert max(at) - min(at) < 5_000


def test_pai_files_with_trace_quirks_convert(real: Path) -> None:
    job2 = convert_pai(real / "alibaba-pai-minibatch" / "job_2_norm.csv")
    assert len(of(job2, "StepCompleted")) == 2401  # one duplicated (time, worker) row dropped
    job4 = convert_pai(real / "alibaba-pai-minibatch" / "job_4_norm.csv")
    assert len(of(job4, "StepCompleted")) == 21829 and in_time_order(job4)


def test_pai_malformed_row_names_the_line(tmp_path: Path) -> None:
    src = tmp_path / "job_9_norm.csv"
    src.write_text(",worker,gpu,time,batch_time_norm\n0,0,25,1,476\n1,1,25,one,470\n")
    with pytest.raises(ImportFormatError, match=r"job_9_norm.csv:3: not a number"):
        convert_pai(src)
    src.write_text("step,loss\n1,2\n")
    with pytest.raises(ImportFormatError, match=r":1: unexpected header"):
        convert_pai(src)


# -- modded-nanogpt --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("run", "steps", "vals"), [("muon", 6200, 51), ("soap", 6000, 49), ("scaleup", 15258, 124)]
)
def test_nanogpt_logs_give_a_step_per_train_line_and_a_validation_per_val_line(
    real: Path, run: str, steps: int, vals: int
) -> None:
    events = list(convert_nanogpt(real / "modded-nanogpt" / NANOGPT[run]))
    (job,) = of(events, "JobStarted")
    assert job["world_size"] == 8 and job["gpu_class"] == "H100-80GB"
    train = of(events, "StepCompleted")
    assert len(train) == steps and [s["step"] for s in train] == list(range(1, steps + 1))
    assert {s["rank"] for s in train} == {0}
    assert all(s["step_time_s"] > 0 for s in train)
    assert len(of(events, "ValidationResult")) == vals
    assert in_time_order(events) and events[-1].record["state"] == "completed"


def test_nanogpt_step_times_follow_train_time_across_the_compile_reset(real: Path) -> None:
    events = list(convert_nanogpt(real / "modded-nanogpt" / NANOGPT["muon"]))
    assert events[0].record["ts"] == parse_ts("2024-10-10T23:58:24Z")  # the nvidia-smi date
    train = {s["step"]: s for s in of(events, "StepCompleted")}
    assert train[11]["step_time_s"] == pytest.approx(0.214)  # train_time restarted at 214 ms
    assert statistics.median(s["step_time_s"] for s in train.values()) == pytest.approx(0.214, abs=0.005)
    assert train[919]["loss"] == pytest.approx(5.06, abs=0.01)


def test_nanogpt_soap_periodic_slow_steps_are_kept(real: Path) -> None:
    train = {
        s["step"]: s
        for s in of(list(convert_nanogpt(real / "modded-nanogpt" / NANOGPT["soap"])), "StepCompleted")
    }
    assert train[31]["step_time_s"] > 1.0 > train[32]["step_time_s"]


def test_nanogpt_unexpected_line_after_the_header_names_the_line(tmp_path: Path) -> None:
    src = tmp_path / "log.txt"
    src.write_text("Running pytorch\nstep:1/3 train_loss:3.0 train_time:10ms step_avg:nanms\ngarbage here\n")
    with pytest.raises(ImportFormatError, match=r"log.txt:3: expected a 'step:N/T"):
        list(convert_nanogpt(src))
    src.write_text("no steps at all\n")
    with pytest.raises(ImportFormatError, match="no 'step:N/T"):
        list(convert_nanogpt(src))


# -- Pythia ----------------------------------------------------------------------------------


def test_pythia_gives_one_step_per_row_with_a_synthetic_step_time(real: Path) -> None:
    events = list(convert_pythia(real / "pythia" / "70m-0.csv"))
    steps = of(events, "StepCompleted")
    assert len(steps) == 143_000
    by_step = {s["step"]: s for s in steps[:2000]}
    assert by_step[1000]["loss"] == pytest.approx(3.72, abs=0.05)
    assert steps[1]["ts"] - steps[0]["ts"] == 500 and steps[0]["step_time_s"] == 0.5
    assert in_time_order(events)


def test_pythia_every_k_keeps_every_kth_step_on_the_same_timeline(real: Path) -> None:
    full = {
        s["step"]: s["ts"] for s in of(list(convert_pythia(real / "pythia" / "70m-0.csv")), "StepCompleted")
    }
    some = of(list(convert_pythia(real / "pythia" / "70m-0.csv", every=10)), "StepCompleted")
    assert len(some) == 14_300 and all(s["step"] % 10 == 0 and s["ts"] == full[s["step"]] for s in some)


def test_pythia_bad_number_names_the_line(tmp_path: Path) -> None:
    src = tmp_path / "70m-9.csv"
    src.write_text("step,train/lm_loss\n0,11.0\n1,eleven\n")
    with pytest.raises(ImportFormatError, match=r"70m-9.csv:3: not a number"):
        list(convert_pythia(src))


# -- CLI -------------------------------------------------------------------------------------

runner = CliRunner()


def test_cli_import_pai_writes_a_readable_container(real: Path, tmp_path: Path) -> None:
    out = tmp_path / "pai.avro"
    res = runner.invoke(
        app, ["events", "import-pai", str(real / "alibaba-pai-minibatch" / "job_3_norm.csv"), "-o", str(out)]
    )
    assert res.exit_code == 0, res.output
    assert "wrote 2,501 events" in res.output
    assert sum(1 for e in iter_container(out) if e.type == "StepCompleted") == 2489


def test_cli_import_pythia_every(real: Path, tmp_path: Path) -> None:
    out = tmp_path / "py.avro"
    res = runner.invoke(
        app, ["events", "import-pythia", str(real / "pythia" / "70m-0.csv"), "-o", str(out), "--every", "100"]
    )
    assert res.exit_code == 0, res.output
    assert "wrote 1,433 events" in res.output


def test_cli_import_of_a_malformed_file_is_one_line_with_the_line_number_and_writes_nothing(
    tmp_path: Path,
) -> None:
    src = tmp_path / "run.txt"
    src.write_text("step:1/3 train_loss:3.0 train_time:10ms step_avg:nanms\nstep:2/3 oops\n")
    out = tmp_path / "out.avro"
    res = runner.invoke(app, ["events", "import-nanogpt", str(src), "-o", str(out)])
    assert res.exit_code == 1
    assert "run.txt:2:" in res.output and "Traceback" not in res.output
    assert not out.exists() and not list(tmp_path.glob(".out.avro*"))


def test_cli_import_of_a_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    res = runner.invoke(
        app, ["events", "import-pai", str(tmp_path / "nope.csv"), "-o", str(tmp_path / "x.avro")]
    )
    assert res.exit_code == 1 and "no such file" in res.output
