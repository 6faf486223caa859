"""The node agent against a fake pynvml module and a fake /proc: nulls for unsupported fields, isolation
of a failing GPU, a clean error without a driver, XID events published at once, drift-free ticks."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from producers.agent import Agent, FakeDevice, FakeNvml, GpuSampler, HostSampler, next_tick
from producers.agent.fake_nvml import NVML_ERROR_DRIVER_NOT_LOADED, NVML_ERROR_LIBRARY_NOT_FOUND
from producers.errors import NvmlUnavailableError
from producers.publisher import MemoryPublisher
from schemas.codec import Codec


def _sampler(nvml: FakeNvml) -> GpuSampler:
    return GpuSampler(nvml, cluster="c1", node="node-a")


def test_every_gpu_gets_a_schema_valid_sample_per_tick() -> None:
    sampler = _sampler(FakeNvml(gpus=8))
    records = sampler.sample(1_700_000_000_000, 10.0)
    assert [r["gpu_index"] for r in records] == list(range(8))
    codec = Codec()
    for record in records:
        assert codec.decode(codec.encode(_gpu_event(record))).record == record
        assert record["power_w"] is not None and 0 < record["power_w"] <= record["power_limit_w"]
        assert record["gpu_util_pct"] is not None


def _gpu_event(record: dict) -> object:
    from schemas.records import Event

    return Event("GpuSample", record)


def test_unsupported_fields_are_null_only_for_that_gpu() -> None:
    devices = [
        FakeDevice(0, "GPU-a"),
        FakeDevice(1, "GPU-b", unsupported={"power", "ecc", "temp_mem", "remapped_rows"}),
    ]
    sampler = _sampler(FakeNvml(devices=devices))
    good, limited = sampler.sample(1, 1.0)
    for name in ("power_w", "ecc_corrected", "ecc_uncorrected", "temp_mem_c", "remapped_rows_correctable"):
        assert limited[name] is None, name
        assert good[name] is not None, name
    assert limited["gpu_util_pct"] is not None and limited["temp_gpu_c"] is not None
    assert sampler.errors == 0, "NotSupported is expected, not an error"


def test_a_gpu_failing_on_everything_does_not_stop_the_others(caplog: pytest.LogCaptureFixture) -> None:
    devices = [FakeDevice(0, "GPU-a"), FakeDevice(1, "GPU-b"), FakeDevice(2, "GPU-c")]
    nvml = FakeNvml(devices=devices)
    sampler = _sampler(nvml)
    devices[1].broken = True
    with caplog.at_level(logging.WARNING):
        first = sampler.sample(1, 1.0)
        logged = len(caplog.records)
        second = sampler.sample(2, 2.0)
    assert first[0]["gpu_util_pct"] is not None and first[2]["gpu_util_pct"] is not None
    assert first[1]["gpu_util_pct"] is None and first[1]["power_w"] is None
    assert first[1]["gpu_uuid"] == "GPU-b", "identity read at start survives"
    assert second[2]["power_w"] is not None
    assert logged > 0
    assert len(caplog.records) == logged, "each failing field is logged once, not every interval"


@pytest.mark.parametrize("code", [NVML_ERROR_LIBRARY_NOT_FOUND, NVML_ERROR_DRIVER_NOT_LOADED])
def test_missing_driver_raises_one_clear_error_pointing_to_simulate(code: int) -> None:
    with pytest.raises(NvmlUnavailableError, match="--simulate") as info:
        _sampler(FakeNvml(init_error=code))
    assert "\n" not in str(info.value)


def test_cli_without_driver_exits_with_one_line_and_no_traceback(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from typer.testing import CliRunner

    import producers.agent.gpu as gpu
    from ranksight.cli import app

    monkeypatch.setattr(gpu, "load_nvml", lambda: FakeNvml(init_error=NVML_ERROR_LIBRARY_NOT_FOUND))
    import producers.agent as agent_pkg

    monkeypatch.setattr(agent_pkg, "load_nvml", gpu.load_nvml)
    result = CliRunner().invoke(app, ["agent", "--count", "1", "--to", f"file://{tmp_path}/x.avro"])
    assert result.exit_code == 1
    assert "--simulate" in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "x.avro").exists()


def test_xid_event_is_published_immediately_as_a_gpu_sample() -> None:
    nvml = FakeNvml(gpus=4)
    publisher = MemoryPublisher()
    agent = Agent(publisher, host=None, gpus=_sampler(nvml), interval=3600)
    assert agent.watcher is not None and agent.watcher.registered == [0, 1, 2, 3]
    nvml.inject_xid(2, 79)
    assert agent.watcher.poll_once()
    assert len(publisher.events) == 1, "published without waiting for the next interval"
    event = publisher.events[0]
    assert event.type == "GpuSample"
    assert event.record["gpu_index"] == 2 and event.record["xid"] == 79


def test_double_bit_ecc_event_publishes_the_new_uncorrected_count() -> None:
    nvml = FakeNvml(gpus=2)
    publisher = MemoryPublisher()
    agent = Agent(publisher, host=None, gpus=_sampler(nvml), interval=3600)
    nvml.inject_double_bit_ecc(1)
    assert agent.watcher is not None and agent.watcher.poll_once()
    record = publisher.events[0].record
    assert record["gpu_index"] == 1 and record["ecc_uncorrected"] == 1 and record["xid"] is None


def test_xid_watcher_thread_publishes_while_the_agent_runs() -> None:
    nvml = FakeNvml(gpus=2)
    publisher = MemoryPublisher()
    agent = Agent(publisher, host=None, gpus=_sampler(nvml), interval=0.05)
    nvml.inject_xid(0, 48)
    agent.run(count=4)
    assert any(e.record["xid"] == 48 for e in publisher.events)


def test_nvlink_throughput_is_a_rate_from_the_counters() -> None:
    clock = [0.0]
    nvml = FakeNvml(gpus=1, clock=lambda: clock[0])
    sampler = _sampler(nvml)
    first = sampler.sample(1, 10.0)[0]
    second = sampler.sample(2, 11.0)[0]
    assert first["nvlink_tx_bytes_s"] is None, "no rate before two readings"
    # The fake adds 40 GiB per reading, split over 18 links.
    assert second["nvlink_tx_bytes_s"] == pytest.approx(40 * 1024**3, rel=0.01)


def _fake_proc(root: Path, retrans: int, oom: int, files: int) -> None:
    (root / "net").mkdir(parents=True, exist_ok=True)
    (root / "sys" / "fs").mkdir(parents=True, exist_ok=True)
    (root / "net" / "snmp").write_text(
        "Ip: Forwarding DefaultTTL\nIp: 1 64\n"
        "Tcp: RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens PassiveOpens AttemptFails EstabResets "
        "CurrEstab InSegs OutSegs RetransSegs InErrs OutRsts InCsumErrors\n"
        f"Tcp: 1 200 120000 -1 10 5 0 0 3 1000 900 {retrans} 0 1 0\n"
    )
    (root / "vmstat").write_text(f"nr_free_pages 100\noom_kill {oom}\n")
    (root / "sys" / "fs" / "file-nr").write_text(f"{files}\t0\t9223372036854775807\n")


def test_host_sample_reads_retransmit_rate_open_files_and_oom_kills(tmp_path: Path) -> None:
    _fake_proc(tmp_path, retrans=100, oom=0, files=512)
    host = HostSampler(cluster="c1", node="n", proc_root=tmp_path)
    first = host.sample(1000, 100.0)
    assert first["tcp_retrans_segs_s"] is None and first["net_rx_bytes_s"] is None
    _fake_proc(tmp_path, retrans=150, oom=2, files=700)
    second = host.sample(3000, 102.0)
    assert second["tcp_retrans_segs_s"] == pytest.approx(25.0)
    assert second["oom_kills"] == 2 and second["open_files"] == 700
    assert second["mem_total_bytes"] >= second["mem_available_bytes"] > 0
    assert second["net_rx_bytes_s"] is not None and second["net_rx_bytes_s"] >= 0


def test_host_sample_without_proc_files_has_nulls(tmp_path: Path) -> None:
    host = HostSampler(cluster="c1", node="n", proc_root=tmp_path)
    record = host.sample(1, 1.0)
    assert (
        record["tcp_retrans_segs_s"] is None and record["oom_kills"] is None and record["open_files"] is None
    )
    assert record["cpu_util_pct"] is not None


@given(
    start=st.floats(min_value=0, max_value=1e6),
    interval=st.floats(min_value=0.01, max_value=60),
    elapsed=st.floats(min_value=0, max_value=1e4),
)
def test_next_tick_is_on_the_grid_and_in_the_future(start: float, interval: float, elapsed: float) -> None:
    now = start + elapsed
    k, due = next_tick(start, interval, now)
    assert due == start + k * interval
    assert due > now - 1e-6
    assert due - interval <= now + 1e-6


def test_ticks_do_not_drift_with_sampling_cost() -> None:
    publisher = MemoryPublisher()
    ticks: list[float] = []
    agent = Agent(publisher, host=None, gpus=None, interval=0.05)

    def slow_tick(stats: object) -> None:
        ticks.append(time.monotonic())
        time.sleep(0.02)  # sampling cost must not push the schedule

    agent.run(count=10, on_tick=slow_tick)
    assert ticks[-1] - ticks[0] == pytest.approx(9 * 0.05, abs=0.03)
