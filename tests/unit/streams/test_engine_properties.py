"""Property: extreme-but-valid records mixed into a simulated stream change nothing they should not.

Hypothesis interleaves records that pass the Avro schema but carry extreme values (timestamps
from 1970 to past 2200, NaN/Inf in every float, ranks up to 10^9, 10 kB and unicode strings) into
a short simulated job with a straggler. Each record is passed with a Kafka-like `received_ts`
(the time of the stream when it arrived), as the worker and the offline replay do. The engine
must not raise, must do bounded work per record, must raise no alert on a value no producer can
measure, and must give the simulated events exactly the alerts they get alone.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from producers.simulator import load_scenario, simulate
from schemas.eventtime import MIN_EVENT_TS, event_ts
from schemas.records import Event
from streams.detectors.imbalance import ImbalanceDetector
from streams.offline.detection import DetectionEngine

_SCENARIO = """\
name: tiny_straggler
description: "One node, four GPUs, rank 1 throttles thermally for three minutes."
duration: 6m
cluster: {name: sim-p, nodes: 1, gpus_per_node: 4, gpu_class: H100-80GB}
jobs:
  - {id: pretrain-1b-0001, team: llm-pretrain, owner: alice, nodes: 1}
faults:
  - {type: straggler_gpu, job: pretrain-1b-0001, rank: 1, start: 1m, duration: 3m, magnitude: 1.6, variant: thermal}
"""

# Rules whose observed value is a loss, a gradient norm or a clock offset: any float is real there.
_ANY_VALUE_RULES = {"nonfinite_loss", "nonfinite_grad", "grad_spike", "loss_divergence", "clock_skew"}


@cache
def _valid(tmp: str) -> tuple[tuple[Event, ...], tuple[tuple[Any, ...], ...]]:
    path = Path(tmp) / "tiny.yaml"
    path.write_text(_SCENARIO)
    events = tuple(simulate(load_scenario(path), 0).events())
    engine = DetectionEngine()
    alerts = _alert_keys(_run(engine, [(e, event_ts(e)) for e in events]))
    return events, tuple(alerts)


def _run(engine: DetectionEngine, feed: list[tuple[Event, int]]) -> list[Event]:
    out: list[Event] = []
    windows = _imbalance(engine)
    for event, received in feed:
        before = sum(w.window_iterations for w in windows)
        out += engine.process(event, received_ts=received)
        # Bounded work per record: a few windows per job, never one per hop of elapsed time.
        jobs = sum(len(w.jobs) + 1 for w in windows)
        assert sum(w.window_iterations for w in windows) - before <= 4 * jobs, event
    return out + engine.finish()


def _imbalance(engine: DetectionEngine) -> list[ImbalanceDetector]:
    """Every imbalance detector of the engine (one per job-stage partition)."""
    return [d for d in engine.detectors if isinstance(d, ImbalanceDetector)]


def _alert_keys(out: list[Event]) -> list[tuple[Any, ...]]:
    return [
        (a["rule"], a["fingerprint"], a["status"], a["starts_at"], a["ends_at"], a["team"])
        for a in (e.record for e in out if e.type == "Alert")
    ]


# -- extreme values ----------------------------------------------------------------------
_floats = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf, -1.0, -1e300, 1e308, 0.0, 5e-324, 150.0, 1e9]),
    st.floats(allow_nan=True, allow_infinity=True),
)
_longs = st.one_of(st.sampled_from([-1, 0, 2**63 - 1, -(2**63)]), st.integers(-(2**63), 2**63 - 1))
_ints = st.integers(-(2**31), 2**31 - 1)
_ranks = st.one_of(st.integers(0, 10**9), st.sampled_from([0, 10**9, 2**31 - 1]))
_text = st.one_of(st.text(max_size=30), st.just("\U0001f525" * 2_500), st.just("x" * 10_000))


def _maybe(s: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.none(), s)


@st.composite
def _extreme(draw: Callable[..., Any], now: int) -> Event:
    """One schema-valid record with extreme values and identities of its own (prefix `x-`)."""
    ts = draw(
        st.one_of(
            st.just(now),
            st.integers(-(2**62), MIN_EVENT_TS - 1),  # 1970, zero, negative
            st.integers(MIN_EVENT_TS, now - 8 * 86_400_000),  # years behind
            st.integers(now + 301_000, 2**62),  # minutes to centuries ahead, past 2200
        )
    )
    job = "x-" + draw(_text)
    node = "xn-" + draw(_text)
    kind = draw(
        st.sampled_from(
            [
                "StepCompleted",
                "GpuSample",
                "HostSample",
                "JobStarted",
                "RankBound",
                "CheckpointEvent",
                "JobStateChanged",
                "RankFault",
                "CollectiveSample",
                "DataLoaderSample",
                "ValidationResult",
            ]
        )
    )
    f, mf, ml, mi = (
        (lambda: draw(_floats)),
        (lambda: draw(_maybe(_floats))),
        (lambda: draw(_maybe(_longs))),
        (lambda: draw(_maybe(_ints))),
    )
    base = {"ts": ts, "job_id": job, "run_id": draw(_text)}
    r: dict[str, Any]
    if kind == "StepCompleted":
        r = {
            **base,
            "rank": draw(_ranks),
            "step": draw(_longs),
            "samples": ml(),
            "tokens": ml(),
            "loss": mf(),
        }
        r |= {"lr": mf(), "grad_norm": mf(), "step_time_s": f(), "data_wait_s": mf(), "forward_s": mf()}
        r |= {"backward_s": mf(), "optimizer_s": mf(), "comm_s": mf(), "checkpoint_s": mf()}
        r |= {"skipped": draw(st.booleans())}
    elif kind == "GpuSample":
        r = {
            "ts": ts,
            "cluster": draw(_text),
            "node": node,
            "gpu_index": draw(_ints),
            "gpu_uuid": draw(_text),
        }
        for name in ("gpu_util_pct", "mem_util_pct", "power_w", "power_limit_w", "temp_gpu_c", "temp_mem_c"):
            r[name] = mf()
        for name in (
            "mem_used_bytes",
            "mem_total_bytes",
            "energy_mj",
            "clock_event_reasons",
            "ecc_corrected",
        ):
            r[name] = ml()
        for name in ("ecc_uncorrected", "pcie_tx_bytes_s", "pcie_rx_bytes_s", "pcie_replay_count"):
            r[name] = ml()
        for name in ("sm_clock_mhz", "mem_clock_mhz", "sm_clock_max_mhz", "xid"):
            r[name] = mi()
        r |= {"remapped_rows_correctable": mi(), "remapped_rows_uncorrectable": mi(), "gpu_name": None}
        r |= {"nvlink_tx_bytes_s": ml(), "nvlink_rx_bytes_s": ml(), "pids": draw(st.lists(_ints, max_size=3))}
    elif kind == "HostSample":
        r = {"ts": ts, "cluster": draw(_text), "node": node}
        for name in ("cpu_util_pct", "load1", "load5", "load15", "disk_read_bytes_s", "disk_write_bytes_s"):
            r[name] = mf()
        r |= {"net_rx_bytes_s": mf(), "net_tx_bytes_s": mf(), "tcp_retrans_segs_s": mf()}
        for name in (
            "mem_used_bytes",
            "mem_available_bytes",
            "mem_total_bytes",
            "swap_used_bytes",
            "oom_kills",
        ):
            r[name] = ml()
        r["open_files"] = mi()
    elif kind == "JobStarted":
        r = {
            **base,
            "owner": draw(_text),
            "team": draw(_text),
            "cluster": draw(_text),
            "model_name": draw(_text),
        }
        r |= {"model_version": draw(_text), "dataset_version": draw(_text), "workload_family": draw(_text)}
        r |= {"world_size": draw(_ints), "nodes": [node], "data_parallel": draw(_ints), "tensor_parallel": 1}
        r |= {"pipeline_parallel": 1, "global_batch_size": mi(), "seq_len": mi(), "gpu_class": draw(_text)}
        r |= {
            "checkpoint_max_age_s": mf(),
            "checkpoint_timeout_s": mf(),
            "labels": {draw(_text): draw(_text)},
        }
    elif kind == "RankBound":
        r = {**base, "rank": draw(_ranks), "local_rank": mi(), "node": node, "gpu_index": mi()}
        r |= {"gpu_uuid": draw(_maybe(_text)), "pid": draw(_ints)}
    elif kind == "CheckpointEvent":
        r = {**base, "rank": draw(_maybe(_ranks)), "checkpoint_id": draw(_text), "step": draw(_longs)}
        r |= {"phase": draw(st.sampled_from(["started", "completed", "failed", "verified", "restored"]))}
        r |= {
            "uri": None,
            "bytes": ml(),
            "duration_s": mf(),
            "version": None,
            "checksum": None,
            "error": None,
        }
    elif kind == "JobStateChanged":
        state = draw(
            st.sampled_from(["pending", "running", "restarting", "preempted", "failed", "completed"])
        )
        r = {**base, "state": state, "reason": draw(_maybe(_text)), "exit_code": mi()}
        r |= {"restart_count": draw(_ints), "owner": None, "team": None}
    elif kind == "RankFault":
        r = {**base, "rank": draw(_ranks), "node": draw(_maybe(st.just(node))), "exit_code": mi()}
        r |= {
            "kind": draw(st.sampled_from(["oom", "exit", "collective_timeout", draw(_text)])),
            "detail": None,
        }
    elif kind == "CollectiveSample":
        r = {**base, "rank": draw(_ranks), "op": draw(_text), "interval_s": f(), "count": draw(_longs)}
        r |= {"bytes": ml(), "time_s": f(), "bus_bw_gbps": mf()}
    elif kind == "DataLoaderSample":
        r = {**base, "rank": draw(_ranks), "interval_s": f(), "batches": ml(), "wait_s": mf()}
        r |= {"queue_depth": mi(), "workers": mi()}
    else:
        r = {**base, "step": draw(_longs), "metrics": {draw(_text): f()}, "duration_s": mf()}
    return Event(kind, r)


def _mixed(valid: tuple[Event, ...], data: st.DataObject) -> list[tuple[Event, int]]:
    """The valid events, each received at its own time, with extreme records drawn between them."""
    n = data.draw(st.integers(1, 40), label="extreme records")
    positions = sorted(data.draw(st.lists(st.integers(0, len(valid) - 1), min_size=n, max_size=n)))
    feed: list[tuple[Event, int]] = []
    at = 0
    for i, event in enumerate(valid):
        ts = event_ts(event)
        feed.append((event, ts))
        while at < len(positions) and positions[at] == i:
            feed.append((data.draw(_extreme(ts), label=f"after valid event {i}"), ts))
            at += 1
    return feed


def _valid_identity(alert: dict[str, Any]) -> bool:
    return not str(alert["job_id"]).startswith("x-") and not str(alert.get("node") or "").startswith("xn-")


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)
@given(data=st.data())
def test_extreme_records_raise_nothing_and_change_no_alert_of_the_valid_events(
    data: st.DataObject, tmp_path_factory: Any
) -> None:
    valid, valid_alerts = _valid(str(tmp_path_factory.getbasetemp()))
    feed = _mixed(valid, data)
    out = _run(DetectionEngine(), feed)  # no exception, bounded work per record

    alerts = [e.record for e in out if e.type == "Alert"]
    assert _alert_keys([Event("Alert", a) for a in alerts if _valid_identity(a)]) == list(valid_alerts)

    first, last = event_ts(valid[0]), event_ts(valid[-1])
    span_s = (last - first) // 1000 + 1
    for a in alerts:
        # Alerts live in the stream's time, never in a bogus record's.
        for name in ("ts", "starts_at", "ends_at"):
            if a[name] is not None:
                assert first - 10_000 <= a[name] <= last, (name, a)
        # No duration longer than the stream itself ("no progress for 5447168335 s").
        for seconds in re.findall(r"(\d[\d,]*(?:\.\d+)?) s\b", a["summary"]):
            assert float(seconds.replace(",", "")) <= span_s, a["summary"]
        if a["rule"] not in _ANY_VALUE_RULES:
            for name in ("observed", "expected"):
                assert a[name] is None or math.isfinite(a[name]), (name, a)
