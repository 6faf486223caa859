"""Comparing runs: the same workload family by default, any runs by choice, by step or by tokens, with
a configuration diff; served by the UI and carried by job reports.

Three runs of one family are added to the package's store for the module (two of job `cmp-a`, with
different batch sizes, and one of `cmp-b`), with step times and tokens chosen so each series has a
known value, and removed again after.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from schemas.records import Event
from tests.integration.ui.conftest import READY, STRAGGLER_JOB, UiStore, needs_chromium
from tests.integration.ui.test_queries import _forget_job
from ui.errors import NotFoundError
from ui.pages.compare import compare
from ui.report import write_report
from ui.server import UiServer
from ui.store import load_events

FAMILY = "cmp-family"
# (job, run, global batch, step time s, tokens per rank and step, first step's time offset s)
RUNS = (
    ("cmp-a", "cmp-a-r0", 256, 1.0, 4096, 0),
    ("cmp-a", "cmp-a-r1", 512, 2.0, 8192, 600),
    ("cmp-b", "cmp-b-r0", 256, 0.5, 4096, 1200),
)
RANKS, STEPS = 2, 60


def _events(start_ms: int) -> list[Event]:
    events = []
    for job, run, batch, step_s, tokens, offset in RUNS:
        t0 = start_ms + offset * 1000
        events.append(
            Event(
                "JobStarted",
                {
                    "ts": t0,
                    "job_id": job,
                    "run_id": run,
                    "owner": "o",
                    "team": "t",
                    "cluster": "c",
                    "world_size": RANKS,
                    "workload_family": FAMILY,
                    "model_name": "m",
                    "global_batch_size": batch,
                    "seq_len": 2048,
                    "labels": {"lr_schedule": "cosine" if job == "cmp-a" else "linear"},
                },
            )
        )
        for step in range(STEPS):
            for rank in range(RANKS):
                events.append(
                    Event(
                        "StepCompleted",
                        {
                            "ts": t0 + int((step + 1) * step_s * 1000) + rank,
                            "job_id": job,
                            "run_id": run,
                            "rank": rank,
                            "step": step,
                            "step_time_s": step_s,
                            "data_wait_s": 0.1 * step_s,
                            "forward_s": 0.3 * step_s,
                            "tokens": tokens,
                            "loss": 5.0 - step / STEPS,
                        },
                    )
                )
    return events


@pytest.fixture(scope="module")
def runs_in_store(ui_store: UiStore) -> Iterator[UiStore]:
    """The store with the three runs of the family, removed after the module."""
    load_events(ui_store.client, _events(ui_store.start_ms))
    try:
        yield ui_store
    finally:
        for job in {r[0] for r in RUNS}:
            _forget_job(ui_store.client, job)


def test_one_job_is_compared_with_its_workload_family_by_step_and_by_tokens(runs_in_store: UiStore) -> None:
    """`compare(job)`: its runs and the family's, aligned series with known values, and what differs."""
    data = compare(runs_in_store.client, ["cmp-a"])
    assert data["family"] == FAMILY
    assert [(r["job_id"], r["run_id"]) for r in data["runs"]] == [(j, r) for j, r, *_ in RUNS]
    assert data["bucket_steps"] == 1  # 60 steps: one point per step
    for run, series in zip(RUNS, data["series"], strict=True):
        _, _, _, step_s, tokens, _ = run
        assert series["step"] == list(range(STEPS))
        assert series["tokens"] == [tokens * RANKS * (k + 1) for k in range(STEPS)]  # cumulative, all ranks
        assert set(series["step_time"]) == {step_s}
        assert series["segments"]["data_wait"][0] == pytest.approx(0.1 * step_s)
        assert series["tokens_per_gpu_s"][0] == pytest.approx(tokens / step_s)  # tokens per GPU-second
        assert series["loss"][0] == pytest.approx(5.0)
    assert set(data["config"]["differs"]) == {"global_batch_size", "label lr_schedule"}
    assert data["runs"][0]["config"]["global_batch_size"] == "256"
    assert data["runs"][1]["config"]["global_batch_size"] == "512"


def test_any_runs_can_be_chosen_across_families(runs_in_store: UiStore) -> None:
    """Several jobs, or runs by id, are compared whatever their family; an unknown one is not found."""
    chosen = compare(runs_in_store.client, [STRAGGLER_JOB], ["cmp-b-r0"])
    assert {r["job_id"] for r in chosen["runs"]} == {STRAGGLER_JOB, "cmp-b"} and chosen["family"] == ""
    assert "workload_family" in chosen["config"]["differs"] or "model_name" in chosen["config"]["differs"]
    with pytest.raises(NotFoundError):
        compare(runs_in_store.client, ["no-such-job"])


@needs_chromium
def test_the_compare_page_overlays_the_runs_and_switches_to_tokens(
    runs_in_store: UiStore, browser: Any, tmp_path: Path
) -> None:
    """/compare?job= draws one line per run on each chart, by step then by tokens; the diff lists what differs;
    the job page links it and the job's report carries it."""
    server = UiServer(runs_in_store.client, "127.0.0.1", 0)
    url = server.start()
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        page.goto(f"{url}jobs/cmp-a")
        page.wait_for_function(READY, timeout=60_000)
        page.click("#compare-link")
        page.wait_for_function(READY, timeout=60_000)
        assert page.url.endswith("/compare?job=cmp-a")
        charts = page.evaluate(
            "() => Object.keys(window.ranksight.charts).filter(k => k.startsWith('compare_')).sort()"
        )
        assert charts == [
            "compare_goodput",
            "compare_loss",
            "compare_segment",
            "compare_step_time",
            "compare_throughput",
        ]
        lines = page.evaluate(
            "() => window.ranksight.charts.compare_throughput.getOption().series.map(s => [s.name, s.data[0]])"
        )
        assert [name for name, _ in lines] == [f"{j} · {r}" for j, r, *_ in RUNS]
        assert [point for _, point in lines] == [[0, pytest.approx(t / s)] for _, _, _, s, t, _ in RUNS]
        page.select_option("select[name=x]", "tokens")
        first_x = page.evaluate(
            "() => window.ranksight.charts.compare_step_time.getOption().series.map(s => s.data[0][0])"
        )
        assert first_x == [t * 2 for *_, t, _ in RUNS]
        differs = page.eval_on_selector_all("#config-diff tr.differs", "rows => rows.map(r => r.dataset.key)")
        assert sorted(differs) == ["global_batch_size", "label lr_schedule"]
        page.uncheck("#only-diffs")
        assert page.locator("#config-diff tr.same").count() > 5
        assert not errors, errors
    finally:
        context.close()
        server.stop()
    out = tmp_path / "cmp.html"
    write_report(runs_in_store.client, out, job_id="cmp-b")
    offline = browser.new_context(viewport={"width": 1400, "height": 900}, offline=True)
    report = offline.new_page()
    report.goto(out.as_uri())
    report.wait_for_function(READY, timeout=60_000)
    assert report.evaluate("() => window.ranksight.compare.runs.length") == 3
    assert report.locator("#compare-charts .panel").count() == 5
    offline.close()
