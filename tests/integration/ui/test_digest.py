"""A report from a recording, streamed per panel (each page's fold), says what the store's pages say.

The package's store holds the `mixed` recording replayed through the detectors; the digest reads
the same recording (replayed by the CLI layer) without any store. Every panel of every job page,
its efficiency panel and comparison, and an alert page must agree value for value: the same
buckets, the same rounding. Only what ClickHouse picks arbitrarily is left out (`any(team)` of an
alert routed to two teams).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ranksight.commands.report import recorded, replayed
from sinks.efficiency import PriceList
from tests.integration.ui.conftest import PRICE_PER_GPU_H, STRAGGLER_JOB, UiStore
from ui.errors import NotFoundError, UiError
from ui.pages.alert import alert_page, alert_report
from ui.pages.common import RawJson
from ui.pages.compare import compare_of_job
from ui.pages.job import job_page, job_report

# Added to the store by other tests of the package (test_queries' evaluation bands): not in the recording.
_ADDED_EVALUATIONS = {"ev-1", "ev-2"}
_ARBITRARY = {"team", "receiver"}


def _plain(value: Any) -> Any:
    if isinstance(value, RawJson):
        return json.loads(value.text)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _differences(store: Any, streamed: Any, path: str = "") -> list[str]:
    out: list[str] = []
    if isinstance(store, dict) and isinstance(streamed, dict):
        for key in sorted(set(store) | set(streamed), key=str):
            if key in _ARBITRARY and path.startswith((".alerts", ".alert", ".evidence.alerts")):
                continue
            if key not in store or key not in streamed:
                out.append(f"{path}.{key}: only in {'the report' if key not in store else 'the store'}")
            else:
                out += _differences(store[key], streamed[key], f"{path}.{key}")
    elif isinstance(store, list) and isinstance(streamed, list):
        if len(store) != len(streamed):
            return [f"{path}: {len(store)} items in the store, {len(streamed)} in the report"]
        for i, (a, b) in enumerate(zip(store, streamed, strict=True)):
            out += _differences(a, b, f"{path}[{i}]")
    elif isinstance(store, float | int) and isinstance(streamed, float | int) and not isinstance(store, bool):
        # A mean summed in another order can differ in its last bit, which can flip the rounding of a
        # value that sits on a half: one unit of the last shown digit, no more.
        unit = 10.0 ** -len(repr(float(store)).split(".")[1]) if "e" not in repr(float(store)) else 0.0
        if not math.isclose(store, streamed, rel_tol=1e-9, abs_tol=1e-12 + unit * 1.0001):
            out.append(f"{path}: {store} in the store, {streamed} in the report")
    elif store != streamed:
        out.append(f"{path}: {store!r} in the store, {streamed!r} in the report")
    return out


@pytest.fixture(scope="module")
def sources(ui_store: UiStore) -> tuple[Any, Any]:
    """The package's recording as the CLI layer hands it to a report: replayed, and as stored."""
    return (lambda: replayed([ui_store.recording])), (lambda: recorded([ui_store.recording]))


@pytest.mark.parametrize("job", ["pretrain-13b-0301", "vit-h-0302", "asr-0303"])
def test_every_panel_of_a_job_report_equals_the_stores_page(
    ui_store: UiStore, sources: tuple[Any, Any], job: str
) -> None:
    """Heatmap, steps, GPUs, hosts, loader, collectives, bands, states, alerts, efficiency, compare: equal."""
    prices = PriceList.parse([f"default={PRICE_PER_GPU_H}"])
    store = _plain(job_page(ui_store.client, job, prices=prices))
    store["compare"] = _plain(compare_of_job(ui_store.client, job))
    store["evaluations"] = [e for e in store["evaluations"] if e["id"] not in _ADDED_EVALUATIONS]
    replay, recording = sources
    streamed = _plain(job_report(replay, job, prices=prices, sources=recording))
    assert streamed.pop("_events") > 10_000
    if any(e["id"] in _ADDED_EVALUATIONS for e in job_page(ui_store.client, job)["evaluations"]):
        # The store's efficiency counts the evaluations another test added: compared without them.
        store.pop("efficiency")
        streamed.pop("efficiency")
    assert _differences(store, streamed) == []
    assert streamed["heatmap"]["cells"][0] and streamed["gpus"]["cells"][0]  # not equal because empty
    if job == STRAGGLER_JOB:  # the panels issue 23 added hold data here, so they were compared
        assert streamed["datapath"]["read_latency_s"]["worst"] and streamed["gpm"]["cells"][0]
        assert streamed["progress"]["eta_s"] and streamed["checkpoint"]["last_verified"]
        muted = [a for a in streamed["alerts"] if a["muted_by"]]
        assert muted and all(len(a["copies"]) == 2 for a in streamed["alerts"])


def test_an_alert_report_equals_the_stores_alert_page(ui_store: UiStore, sources: tuple[Any, Any]) -> None:
    """The alert (its records, history, threshold, resolution) and its evidence panels are the store's."""
    alert_id = ui_store.client.query(
        "SELECT alert_id FROM alerts WHERE rule = 'straggler' AND job_id = {j:String} LIMIT 1",
        parameters={"j": STRAGGLER_JOB},
    ).result_rows[0][0]
    store = _plain(alert_page(ui_store.client, alert_id))
    streamed = _plain(alert_report(sources[0], alert_id))
    streamed.pop("_events")
    store["evidence"]["evaluations"] = [
        e for e in store["evidence"]["evaluations"] if e["id"] not in _ADDED_EVALUATIONS
    ]
    assert _differences(store, streamed) == []
    assert streamed["alert"]["history"] and streamed["evidence"]["heatmap"]["cells"][0]
    # The straggler fired before its cause: gpu_throttling on the same GPU muted it; two routed copies.
    assert streamed["alert"]["muted_by"]["rule"] == "gpu_throttling" and len(streamed["alert"]["copies"]) == 2


def test_unknown_jobs_and_alerts_say_what_the_recording_holds(sources: tuple[Any, Any]) -> None:
    """A job the recording lacks is one sentence naming the jobs it holds; an alert it lacks, not found."""
    with pytest.raises(
        UiError, match=r"not in the recording \(it holds: asr-0303, pretrain-13b-0301, vit-h-0302\)"
    ):
        job_report(sources[0], "no-such-job")
    with pytest.raises(NotFoundError):
        alert_report(sources[0], "no-such-alert")


def test_the_report_command_stays_in_bounded_memory(ui_store: UiStore, tmp_path: Path) -> None:
    """`ranksight report recording --job` opens no store: its peak RSS stays far under chDB's own (~300 MB)."""
    out = tmp_path / "r.html"
    code = (
        "import sys; from ranksight.cli import main; sys.argv = ['ranksight', 'report', "
        f"{str(ui_store.recording)!r}, '--job', {STRAGGLER_JOB!r}, '-o', {str(out)!r}]\n"
        "try:\n    main()\nexcept SystemExit as exc:\n    assert not exc.code, exc.code\n"
        # VmHWM, not ru_maxrss: the latter keeps the forking parent's peak (this test process holds chDB).
        "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1]\n"
        "print('chdb', 'chdb' in sys.modules, 'peak_mb', int(hwm) // 1024)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "chdb False" in done.stdout  # no store was opened (chDB alone is ~300 MB resident)
    peak = int(done.stdout.split("peak_mb")[-1])
    assert peak < 200, peak
    html = out.read_text()
    assert '"rule":"straggler"' in html and '"compare":' in html
