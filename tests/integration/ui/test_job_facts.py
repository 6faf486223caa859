"""The job page's facts and data-path panels (issue 23 UI items) on the simulated incident: progress and ETA
as `ranksight jobs` computes them, the data-path panel's median and worst rank, GPM activity per GPU and the
checkpoint facts, each checked against the raw rows; then the page in Chromium at two widths."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sinks.progress import job_progress
from tests.integration.ui.conftest import READY, STRAGGLER_JOB, UiStore, needs_chromium
from ui.pages.job import job_page


@pytest.fixture(scope="module")
def page(ui_store: UiStore) -> dict[str, Any]:
    """The straggler job's page over its whole span."""
    return job_page(ui_store.client, STRAGGLER_JOB, with_efficiency=False)


def test_progress_and_eta_are_what_ranksight_jobs_says(ui_store: UiStore, page: dict[str, Any]) -> None:
    """Target, steps done, fraction, rate and ETA equal `sinks.progress.job_progress` on the same store."""
    (expected,) = job_progress(ui_store.client, job=STRAGGLER_JOB)
    p = page["progress"]
    assert p["target_kind"] == expected.target_kind == "steps" and p["target"] == expected.target
    assert p["step"] == expected.step and p["done"] == expected.done
    assert p["fraction"] == pytest.approx(expected.fraction, abs=1e-5)
    assert p["rate_steps_s"] == pytest.approx(expected.rate_steps_s, abs=1e-4)
    assert p["eta_s"] == pytest.approx(expected.eta_s, abs=0.1) and p["eta_s"] > 0
    assert p["finish_ms"] == pytest.approx(expected.finish_ts, abs=100)


def test_the_data_path_panel_is_the_median_and_worst_rank_of_the_raw_samples(
    ui_store: UiStore, page: dict[str, Any]
) -> None:
    """For every bucket: read latency's median (ClickHouse's exact median: the upper middle) and the worst rank's
    latency with its rank; cache hit ratio's lowest; all from the rows the sink stored."""
    width, start, end = page["range"]["bucket_ms"], page["range"]["from_ms"], page["range"]["to_ms"]
    rows = ui_store.client.query(
        "SELECT toUnixTimestamp64Milli(ts), rank, read_latency_s, cache_hit_ratio FROM dataloader_samples "
        "WHERE job_id = {j:String}",
        parameters={"j": STRAGGLER_JOB},
    ).result_rows
    buckets: dict[int, list[tuple[float, float, int]]] = {}
    for ts, rank, latency, hits in rows:
        if start <= ts < end and latency is not None:
            buckets.setdefault(ts // width * width, []).append((latency, hits, rank))
    assert len(buckets) > 20
    latency = {
        b: (m, w, r)
        for (b, m), (_, w, r) in zip(
            page["datapath"]["read_latency_s"]["median"],
            page["datapath"]["read_latency_s"]["worst"],
            strict=True,
        )
    }
    hits = {b: w for b, w, _ in page["datapath"]["cache_hit_ratio"]["worst"]}
    for b, values in buckets.items():
        ordered = sorted(v[0] for v in values)
        worst = max(values, key=lambda v: (v[0], -v[2]))
        assert latency[b] == (round(ordered[len(ordered) // 2], 5), round(worst[0], 5), worst[2]), b
        assert hits[b] == round(min(v[1] for v in values), 4)


def test_gpm_activity_per_gpu_is_the_mean_of_its_samples(ui_store: UiStore, page: dict[str, Any]) -> None:
    """SM and tensor activity (NVML GPM, the simulated H100s report it) per bucket and GPU of the job."""
    cells = json.loads(page["gpm"]["cells"].text)
    assert page["gpm"]["columns"] == ["bucket index", "gpu", "sm_active", "tensor_active"]
    assert len(cells[0]) >= len(page["gpus"]["keys"]) * 10
    node, gpu = page["gpus"]["keys"][3]
    width, start = page["range"]["bucket_ms"], page["range"]["from_ms"]
    samples = ui_store.client.query(
        "SELECT toUnixTimestamp64Milli(ts), sm_active_pct, tensor_active_pct FROM gpu_samples "
        "WHERE node = {n:String} AND gpu_index = {g:Int32} AND ts >= fromUnixTimestamp64Milli({s:Int64}, 'UTC')",
        parameters={"n": node, "g": gpu, "s": start},
    ).result_rows
    x = cells[0][cells[1].index(3)]
    bucket = [(sm, tensor) for ts, sm, tensor in samples if (ts - start) // width == x]
    i = next(j for j in range(len(cells[0])) if cells[0][j] == x and cells[1][j] == 3)
    assert cells[2][i] == round(sum(s for s, _ in bucket) / len(bucket), 1)
    assert cells[3][i] == round(sum(t for _, t in bucket) / len(bucket), 1)


def test_checkpoint_facts_name_the_latest_verified_checkpoint_and_its_age(
    ui_store: UiStore, page: dict[str, Any]
) -> None:
    """The last verified checkpoint is the one verified last; its age runs to the page's end; the policy is the job's."""
    (verified,) = ui_store.client.query(
        "SELECT checkpoint_id, toUnixTimestamp64Milli(ts) FROM checkpoints WHERE job_id = {j:String} "
        "AND phase = 'verified' ORDER BY ts DESC LIMIT 1",
        parameters={"j": STRAGGLER_JOB},
    ).result_rows
    c = page["checkpoint"]
    assert c["last_verified"]["id"] == verified[0] and c["last_verified"]["ts"] == verified[1]
    assert c["verified_age_s"] == round((page["range"]["span"][1] - verified[1]) / 1000, 1)
    assert c["max_age_s"] == page["job"]["checkpoint_max_age_s"] == 1800 and c["stale"] is False


@needs_chromium
@pytest.mark.parametrize("width", (1600, 390))
def test_the_job_page_shows_progress_checkpoints_the_data_path_and_gpm(
    ui_url: str, browser: Any, page: dict[str, Any], width: int
) -> None:
    """Progress, ETA and checkpoint facts in the header; the data-path charts carry the panel's series; the GPU
    heatmap switches to SM and tensor activity."""
    context = browser.new_context(viewport={"width": width, "height": 900})
    tab = context.new_page()
    errors: list[str] = []
    tab.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        tab.goto(f"{ui_url}jobs/{STRAGGLER_JOB}")
        tab.wait_for_function(READY, timeout=60_000)
        facts = dict(
            tab.eval_on_selector_all(
                "#job-progress .fact",
                "fs => fs.map(f => [f.querySelector('dt').textContent, f.querySelector('dd').textContent])",
            )
        )
        p = page["progress"]
        assert facts["progress"] == f"{int(p['done'])} of 20K steps ({100 * p['fraction']:.1f} %)"
        assert facts["ETA"].endswith("steps/s") and "done 20" in facts["ETA"]
        assert facts["last verified checkpoint"].startswith(page["checkpoint"]["last_verified"]["id"])
        latency = tab.evaluate(
            "() => window.ranksight.charts.datapath_latency.getOption().series.map(s => [s.name, s.data.length])"
        )
        assert (
            dict(latency)["read latency worst rank"] == len(page["datapath"]["read_latency_s"]["worst"]) > 20
        )
        options = tab.eval_on_selector_all("select[name=gpu-metric] option", "os => os.map(o => o.value)")
        assert options == ["util", "sm_active", "tensor_active"]
        tab.select_option("select[name=gpu-metric]", "tensor_active")
        shown = tab.evaluate("() => window.ranksight.charts.gpu_util.getOption().series[0].data.length")
        assert tab.evaluate("() => window.ranksight.gpuMetric") == "tensor_active"
        assert shown == sum(1 for v in json.loads(page["gpm"]["cells"].text)[3] if v is not None)
    finally:
        context.close()
    assert not errors, errors


def test_the_job_header_says_where_the_job_runs(ui_store: UiStore, page: dict[str, Any]) -> None:
    """Issue 35.5: the header carries JobStarted's image and workspace (the simulator names neither)."""
    rows = ui_store.client.query(
        "SELECT argMax(image, ts), argMax(workspace, ts) FROM job_started WHERE job_id = {j:String}",
        parameters={"j": STRAGGLER_JOB},
    ).result_rows
    assert (page["job"]["image"], page["job"]["workspace"]) == tuple(rows[0]) == ("", "")
