"""The agent attributes GPUs to jobs on the node: SDK binding files, Slurm (a fake /proc tree with
cgroup v1/v2 paths and environ files), Kubernetes (recorded pod-resources responses); unattributed
GPUs are still published."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from producers.agent import Agent, FakeDevice, FakeNvml, GpuSampler, HostSampler
from producers.agent.attribution import (
    Attributor,
    JobRef,
    decode_pod_resources,
    parse_pod_resources_json,
    slurm_job_of_pid,
)
from producers.publisher import MemoryPublisher
from producers.training import Reporter
from producers.training.bindings import Binding, process_start_time, read_bindings, write_binding


def _proc(root: Path, pid: int, *, cgroup: str = "", environ: dict[str, str] | None = None) -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "cgroup").write_text(cgroup)
    (d / "environ").write_bytes(b"\0".join(f"{k}={v}".encode() for k, v in (environ or {}).items()))


def _agent(nvml: FakeNvml, attributor: Attributor, tmp_path: Path) -> tuple[Agent, MemoryPublisher]:
    publisher = MemoryPublisher()
    host_proc = tmp_path / "hostproc"
    host_proc.mkdir(exist_ok=True)
    agent = Agent(
        publisher,
        host=HostSampler(cluster="c", node="n", proc_root=host_proc),
        gpus=GpuSampler(nvml, cluster="c", node="n"),
        interval=1.0,
        watch_xid=False,
        attributor=attributor,
    )
    return agent, publisher


def _by_gpu(publisher: MemoryPublisher) -> dict[int, dict]:
    return {e.record["gpu_index"]: e.record for e in publisher.events if e.type == "GpuSample"}


def test_slurm_job_from_cgroup_v2_v1_and_environ(tmp_path: Path) -> None:
    _proc(tmp_path, 101, cgroup="0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0\n")
    _proc(tmp_path, 102, cgroup="12:pids:/\n5:cpuset:/slurm/uid_1000/job_77/step_batch\n")
    _proc(tmp_path, 103, cgroup="0::/user.slice\n", environ={"SLURM_JOB_ID": "9", "SLURM_RESTART_COUNT": "1"})
    _proc(tmp_path, 104, environ={"RANKSIGHT_JOB_ID": "llm-7", "RANKSIGHT_RUN_ID": "r2", "SLURM_JOB_ID": "9"})
    _proc(tmp_path, 105, cgroup="0::/user.slice/user-1000.slice\n")
    assert slurm_job_of_pid(tmp_path, 101) == JobRef("4242", None, "slurm")
    assert slurm_job_of_pid(tmp_path, 102) == JobRef("77", None, "slurm")
    assert slurm_job_of_pid(tmp_path, 103) == JobRef("9", "restart-1", "slurm")
    assert slurm_job_of_pid(tmp_path, 104) == JobRef("llm-7", "r2", "sdk")
    assert slurm_job_of_pid(tmp_path, 105) is None
    assert slurm_job_of_pid(tmp_path, 999) is None, "a process that exited"


def test_agent_stamps_slurm_jobs_and_publishes_unattributed_gpus(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    _proc(proc, 501, cgroup="0::/system.slice/slurmstepd.scope/job_31/step_0/user/task_0\n")
    _proc(proc, 502, cgroup="0::/system.slice/slurmstepd.scope/job_32/step_0/user/task_0\n")
    devices = [FakeDevice(0, "GPU-a", pids=[501]), FakeDevice(1, "GPU-b", pids=[502]), FakeDevice(2, "GPU-c")]
    attributor = Attributor(proc_root=proc, bindings=[tmp_path / "none"])
    agent, publisher = _agent(FakeNvml(devices=devices), attributor, tmp_path)
    agent.tick()
    gpus = _by_gpu(publisher)
    assert (gpus[0]["job_id"], gpus[1]["job_id"], gpus[2]["job_id"]) == ("31", "32", None)
    [host] = [e.record for e in publisher.events if e.type == "HostSample"]
    assert host["job_ids"] == ["31", "32"]


def test_sdk_binding_wins_and_stale_bindings_are_dropped(tmp_path: Path) -> None:
    bindings = tmp_path / "bindings"
    write_binding(
        bindings, Binding(pid=os.getpid(), job_id="sdk-job", run_id="run-3", rank=0, gpu_uuid="GPU-b")
    )
    write_binding(bindings, Binding(pid=2**22 + 17, job_id="gone", run_id="", gpu_uuid="GPU-a"))
    proc = tmp_path / "proc"
    _proc(proc, 601, cgroup="0::/system.slice/slurmstepd.scope/job_99/step_0\n")
    devices = [FakeDevice(0, "GPU-a"), FakeDevice(1, "GPU-b", pids=[601])]
    alive = frozenset({os.getpid(), 601})
    attributor = Attributor(proc_root=proc, bindings=[bindings], alive=lambda: alive)
    agent, publisher = _agent(FakeNvml(devices=devices), attributor, tmp_path)
    agent.tick()
    gpus = _by_gpu(publisher)
    assert (gpus[1]["job_id"], gpus[1]["run_id"]) == ("sdk-job", "run-3"), (
        "the SDK's binding beats the cgroup"
    )
    assert gpus[0]["job_id"] is None, "a binding of a dead process is stale"
    assert (bindings / f"{2**22 + 17}.json").exists(), "the agent never deletes (pid namespaces)"


def test_a_reused_pid_does_not_inherit_an_old_binding(tmp_path: Path) -> None:
    proc, bindings = tmp_path / "proc", tmp_path / "bindings"
    stat = "4242 (python3 (train) x) S 1 4242 4242 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 {start} 1 1\n"
    (proc / "4242").mkdir(parents=True)
    (proc / "4242" / "stat").write_text(stat.format(start=777))
    assert process_start_time(4242, proc) == 777
    write_binding(bindings, Binding(pid=4242, job_id="old", run_id="", gpu_uuid="GPU-a", start_time=555))
    write_binding(bindings, Binding(pid=4242 + 1, job_id="gone", run_id="", gpu_uuid="GPU-b", start_time=1))
    assert list(read_bindings([bindings], proc=proc)) == [], "pid 4242 now belongs to another process"
    write_binding(bindings, Binding(pid=4242, job_id="new", run_id="r", gpu_uuid="GPU-a", start_time=777))
    assert [b.job_id for b in read_bindings([bindings], proc=proc)] == ["new"]


def test_a_reporter_binding_reaches_the_agent_on_the_same_node(tmp_path: Path) -> None:
    nvml = FakeNvml(gpus=2)
    runtime = tmp_path / "run" / "bindings"
    reporter = Reporter(
        "train-42",
        1,
        local_rank=1,
        node="n",
        publisher=MemoryPublisher(),
        env={},
        nvml=nvml,
        runtime_dir=runtime,
    )
    reporter.flush(5)
    attributor = Attributor(bindings=[runtime])  # the real /proc: this process is the training rank
    agent, publisher = _agent(nvml, attributor, tmp_path)
    agent.tick()
    reporter.close()
    gpus = _by_gpu(publisher)
    assert (gpus[0]["job_id"], gpus[1]["job_id"]) == (None, "train-42")


def _pb_len(number: int, payload: bytes) -> bytes:
    key = (number << 3) | 2
    size = len(payload)
    varint = b""
    while True:
        byte, size = size & 0x7F, size >> 7
        varint += bytes([byte | (0x80 if size else 0)])
        if not size:
            break
    return bytes([key]) + varint + payload


def _recorded_list_response() -> bytes:
    """v1.ListPodResourcesResponse as the kubelet sends it: 2 pods, GPUs plus CPU ids and another device."""

    def pod(name: str, ns: str, gpus: list[str]) -> bytes:
        device = _pb_len(1, b"nvidia.com/gpu") + b"".join(_pb_len(2, g.encode()) for g in gpus)
        nic = _pb_len(1, b"rdma/hca") + _pb_len(2, b"mlx5_0")
        cpu_ids = bytes([0x1A, 2, 4, 5])  # packed repeated int64 cpu_ids = 3
        container = _pb_len(1, b"pytorch") + _pb_len(2, device) + _pb_len(2, nic) + cpu_ids
        return _pb_len(1, name.encode()) + _pb_len(2, ns.encode()) + _pb_len(3, container)

    return _pb_len(1, pod("llama-ft-worker-1", "ml", ["GPU-a", "GPU-b"])) + _pb_len(
        1, pod("notebook-x", "users", ["GPU-c"])
    )


def test_kubernetes_pod_resources_protobuf_and_json_agree(tmp_path: Path) -> None:
    devices = decode_pod_resources(_recorded_list_response())
    gpus = [(d.pod, d.device_ids) for d in devices if d.resource == "nvidia.com/gpu"]
    assert gpus == [("llama-ft-worker-1", ("GPU-a", "GPU-b")), ("notebook-x", ("GPU-c",))]
    as_json = {
        "podResources": [
            {
                "name": "llama-ft-worker-1",
                "namespace": "ml",
                "containers": [
                    {
                        "name": "pytorch",
                        "devices": [{"resourceName": "nvidia.com/gpu", "deviceIds": ["GPU-a", "GPU-b"]}],
                    }
                ],
            },
            {
                "name": "notebook-x",
                "namespace": "users",
                "containers": [
                    {"name": "nb", "devices": [{"resourceName": "nvidia.com/gpu", "deviceIds": ["GPU-c"]}]}
                ],
            },
        ]
    }
    parsed = [
        (d.pod, d.device_ids) for d in parse_pod_resources_json(as_json) if d.resource == "nvidia.com/gpu"
    ]
    assert parsed == gpus


@pytest.mark.parametrize("fmt", ["bin", "json"])
def test_agent_stamps_kubernetes_jobs_from_a_recorded_response(tmp_path: Path, fmt: str) -> None:
    path = tmp_path / f"list.{fmt}"
    if fmt == "bin":
        path.write_bytes(_recorded_list_response())
    else:
        path.write_text(
            json.dumps(
                {
                    "pod_resources": [
                        {
                            "name": "llama-ft-worker-1",
                            "namespace": "ml",
                            "containers": [
                                {
                                    "name": "c",
                                    "devices": [
                                        {"resource_name": "nvidia.com/gpu", "device_ids": ["GPU-a", "GPU-b"]}
                                    ],
                                }
                            ],
                        }
                    ]
                }
            )
        )
    devices = [FakeDevice(0, "GPU-a"), FakeDevice(1, "GPU-b"), FakeDevice(2, "GPU-z")]
    attributor = Attributor(proc_root=tmp_path / "proc", bindings=[], pod_resources=str(path))
    agent, publisher = _agent(FakeNvml(devices=devices), attributor, tmp_path)
    agent.tick()
    gpus = _by_gpu(publisher)
    assert [gpus[i]["job_id"] for i in range(3)] == ["llama-ft", "llama-ft", None]


def test_a_missing_kubelet_leaves_the_other_sources_working(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    proc = tmp_path / "proc"
    _proc(proc, 701, cgroup="0::/system.slice/slurmstepd.scope/job_5/step_0\n")
    attributor = Attributor(proc_root=proc, bindings=[], pod_resources=str(tmp_path / "no.sock"))
    answer = attributor.refresh([("GPU-a", [701]), ("GPU-b", [])], 0.0)
    assert answer == {"GPU-a": JobRef("5", None, "slurm")}
    attributor.refresh([("GPU-a", [701])], 20.0)
    assert sum("pod-resources" in r.getMessage() for r in caplog.records) == 1, "logged once"


def test_attribution_is_refreshed_at_its_own_cadence(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    _proc(proc, 801, cgroup="0::/system.slice/slurmstepd.scope/job_1/step_0\n")
    attributor = Attributor(proc_root=proc, bindings=[], refresh_s=10)
    assert attributor.due(0.0)
    attributor.refresh([("GPU-a", [801])], 0.0)
    assert not attributor.due(9.9) and attributor.due(10.0)
    assert attributor.job_ids() == ["1"]


def test_bindings_reader_skips_garbage(tmp_path: Path) -> None:
    (tmp_path / "1.json").write_text("{not json")
    (tmp_path / "2.json").write_text(json.dumps({"pid": "x"}))
    assert list(read_bindings([tmp_path], alive=frozenset({1, 2}))) == []


def test_the_simulator_stamps_telemetry_like_an_attributing_agent() -> None:
    from producers.simulator import load_scenario, simulate

    events = list(simulate(load_scenario("foreign_process"), 3).events())
    bound = {
        (e.record["node"], e.record["gpu_uuid"]): e.record["job_id"] for e in events if e.type == "RankBound"
    }
    gpu = [e.record for e in events if e.type == "GpuSample"]
    stamped = [r for r in gpu if (r["node"], r["gpu_uuid"]) in bound and r["pids"]]
    assert stamped and all(r["job_id"] == bound[(r["node"], r["gpu_uuid"])] for r in stamped)
    assert all(r["run_id"] for r in stamped)
    assert any(r["job_id"] is None for r in gpu), "a GPU no job holds stays unattributed"
    hosts = [e.record for e in events if e.type == "HostSample"]
    jobs = {j for j in bound.values()}
    assert any(set(h["job_ids"]) == {j for j in jobs if j} for h in hosts)


def test_host_sample_reads_infiniband_port_counters(tmp_path: Path) -> None:
    proc, sysfs = tmp_path / "proc", tmp_path / "sys"
    proc.mkdir()

    def port(dev: str, n: int, rcv: int, xmit: int, sym: int) -> None:
        c = sysfs / "class" / "infiniband" / dev / "ports" / str(n) / "counters"
        c.mkdir(parents=True, exist_ok=True)
        for name, value in (("port_rcv_data", rcv), ("port_xmit_data", xmit), ("symbol_error", sym)):
            (c / name).write_text(f"{value}\n")

    host = HostSampler(cluster="c", node="n", proc_root=proc, sys_root=sysfs)
    port("mlx5_0", 1, 1000, 2000, 0)
    port("mlx5_1", 1, 0, 0, 5)
    first = host.sample(1, 10.0)
    assert first["ib_rx_bytes_s"] is None and first["ib_errors"] is None, "rates need two samples"
    port("mlx5_0", 1, 1000 + 250_000, 2000 + 500_000, 0)  # counters are 4-byte words
    port("mlx5_1", 1, 0, 0, 8)
    second = host.sample(2, 12.0)
    assert second["ib_rx_bytes_s"] == pytest.approx(250_000 * 4 / 2)
    assert second["ib_tx_bytes_s"] == pytest.approx(500_000 * 4 / 2)
    assert second["ib_errors"] == 3
    bare = HostSampler(cluster="c", node="n", proc_root=proc, sys_root=tmp_path / "nosys").sample(3, 1.0)
    assert (bare["ib_rx_bytes_s"], bare["ib_tx_bytes_s"], bare["ib_errors"]) == (None, None, None)


def test_ranksight_agent_stamps_jobs_from_a_recorded_pod_resources_file(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from ranksight.cli import app
    from schemas.files import iter_container

    uuid = FakeNvml(gpus=1).devices[0].uuid
    recorded = tmp_path / "list.json"
    recorded.write_text(
        json.dumps(
            {
                "podResources": [
                    {
                        "name": "bert-worker-0",
                        "namespace": "ml",
                        "containers": [
                            {
                                "name": "c",
                                "devices": [{"resourceName": "nvidia.com/gpu", "deviceIds": [uuid]}],
                            }
                        ],
                    }
                ]
            }
        )
    )
    out = tmp_path / "a.avro"
    args = ["agent", "--simulate", "--gpus", "2", "--count", "1", "--to", f"file://{out}"]
    args += ["--pod-resources", str(recorded), "--bindings-dir", str(tmp_path / "none")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    events = list(iter_container(out))
    gpus = {e.record["gpu_index"]: e.record["job_id"] for e in events if e.type == "GpuSample"}
    assert gpus == {0: "bert", 1: None}
    [host] = [e.record for e in events if e.type == "HostSample"]
    assert host["job_ids"] == ["bert"]


def test_a_cpu_only_node_lists_the_jobs_of_its_sdk_processes(tmp_path: Path) -> None:
    bindings = tmp_path / "bindings"
    write_binding(bindings, Binding(pid=os.getpid(), job_id="cpu-job", run_id="", rank=3))
    publisher = MemoryPublisher()
    host_proc = tmp_path / "hostproc"
    host_proc.mkdir()
    agent = Agent(
        publisher,
        host=HostSampler(cluster="c", node="n", proc_root=host_proc),
        gpus=None,
        attributor=Attributor(bindings=[bindings]),
    )
    agent.tick()
    [host] = [e.record for e in publisher.events]
    assert host["job_ids"] == ["cpu-job"]


def test_host_sample_reads_roce_congestion_counters_and_ports_down(tmp_path: Path) -> None:
    """A fake sysfs tree shaped like a ConnectX RoCE port (the real path needs IB hardware)."""
    proc, sysfs = tmp_path / "proc", tmp_path / "sys"
    proc.mkdir()

    def port(dev: str, counters: dict[str, int], hw: dict[str, int], state: str = "4: ACTIVE") -> None:
        base = sysfs / "class" / "infiniband" / dev / "ports" / "1"
        for folder, values in (("counters", counters), ("hw_counters", hw)):
            (base / folder).mkdir(parents=True, exist_ok=True)
            for name, value in values.items():
                (base / folder / name).write_text(f"{value}\n")
        (base / "state").write_text(f"{state}\n")
        (base / "phys_state").write_text("5: LinkUp\n")

    host = HostSampler(cluster="c", node="n", proc_root=proc, sys_root=sysfs)
    base = {"port_rcv_data": 0, "port_xmit_data": 0, "port_xmit_wait": 100, "link_downed": 0}
    port("mlx5_0", base, {"np_ecn_marked_roce_packets": 10, "np_cnp_sent": 1, "rp_cnp_handled": 2})
    port("mlx5_1", {**base, "port_xmit_wait": 0}, {})  # an IB port: no RoCE hw counters
    first = host.sample(1, 10.0)
    assert first["ib_ports_down"] == 0 and first["ib_xmit_wait_s"] is None
    port("mlx5_0", {**base, "port_xmit_wait": 4100, "link_downed": 1},
         {"np_ecn_marked_roce_packets": 510, "np_cnp_sent": 41, "rp_cnp_handled": 62}, state="1: DOWN")  # fmt: skip
    second = host.sample(2, 12.0)
    assert second["ib_xmit_wait_s"] == pytest.approx(4000 / 2)
    assert second["ib_ecn_marked_s"] == pytest.approx(500 / 2)
    assert second["ib_cnp_s"] == pytest.approx(100 / 2)
    assert second["ib_errors"] == 1 and second["ib_ports_down"] == 1
