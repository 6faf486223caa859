"""Acceptance check on a real NVIDIA GPU: the SDK's segment times against CUDA-event truth, its overhead on
the step, and the node agent's NVML cost. Prints everything; without a GPU it says so and exits 0.

    python bench/gpu_check.py [--steps 60] [--hidden 4096] [--layers 6] [--batch 4096] [--json out.json]

1. Segments. A small MLP trains in blocks that alternate between (a) a loop timed by hand with
   CUDA events at the segment edges, synchronised at the end of the block (the truth), and
   (b) the same loop under `Reporter(timing="cuda")`. Per segment: the SDK's median next to the
   truth's median (target: within 5 %), and what host clocks report for the same loop
   (`timing="host"`, no synchronisation: the enqueue time).
2. Overhead. Step time (host clock over a synchronised block / steps) with and without the SDK,
   alternating blocks (target: < 1 % of the step time).
3. Agent. `GpuSampler` on the real `pynvml`: wall time per GPU per sample (target < 5 ms) and
   CPU for 8 GPUs at 1 Hz (target < 1 % of one core), the per-call cost of every NVML function it
   calls (GPM's included), and for comparison the functions it no longer calls per tick.
4. GPM. On a Hopper or newer GPU: the sampler's GPM metrics over one second of each of three
   loads: idle, dense bf16 matmuls (tensor pipes busy) and a single spinning kernel
   (`torch.cuda._sleep`: the GPU "busy" at ~100 % while one SM spins, the shape of a collective
   blocked on a peer). Expected: the matmul shows tensor activity, the spin shows ~100 %
   utilisation with almost no SM or tensor activity.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SEGMENTS = ("data_wait", "forward", "backward", "optimizer")


def _model(torch: Any, hidden: int, layers: int) -> tuple[Any, Any]:
    torch.manual_seed(0)
    mods: list[Any] = []
    for _ in range(layers):
        mods += [torch.nn.Linear(hidden, hidden), torch.nn.GELU()]
    model = torch.nn.Sequential(*mods, torch.nn.Linear(hidden, 1)).cuda()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


def _batch(torch: Any, batch: int, hidden: int, pinned: Any) -> tuple[Any, Any]:
    x = pinned.to("cuda", non_blocking=True)  # a host->device copy, as a data loader would
    return x, x[:, :1]


def _truth_block(torch: Any, model: Any, opt: Any, steps: int, batch: int, hidden: int, pinned: Any) -> dict:
    """Per-segment and per-step GPU times from events recorded by hand (synchronised once, at the end)."""
    marks: list[dict[str, Any]] = []
    for _ in range(steps):
        ev = {k: torch.cuda.Event(enable_timing=True) for k in ("s", *SEGMENTS, "e")}
        ev["s"].record()
        x, y = _batch(torch, batch, hidden, pinned)
        ev["data_wait"].record()
        loss = torch.nn.functional.mse_loss(model(x), y)
        ev["forward"].record()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        ev["backward"].record()
        opt.step()
        ev["optimizer"].record()
        ev["e"].record()
        marks.append(ev)
    torch.cuda.synchronize()
    out: dict[str, list[float]] = {k: [] for k in (*SEGMENTS, "step")}
    for ev in marks:
        prev = ev["s"]
        for seg in SEGMENTS:
            out[seg].append(prev.elapsed_time(ev[seg]) / 1e3)
            prev = ev[seg]
        out["step"].append(ev["s"].elapsed_time(ev["e"]) / 1e3)
    return out


def _sdk_block(
    reporter: Any,
    torch: Any,
    model: Any,
    opt: Any,
    steps: int,
    batch: int,
    hidden: int,
    pinned: Any,
    first: int,
) -> None:
    for n in range(first, first + steps):
        with reporter.step(n) as s:
            with s.segment("data_wait"):
                x, y = _batch(torch, batch, hidden, pinned)
            with s.segment("forward"):
                loss = torch.nn.functional.mse_loss(model(x), y)
            with s.segment("backward"):
                opt.zero_grad(set_to_none=True)
                loss.backward()
            with s.segment("optimizer"):
                opt.step()
            s.record(loss=loss.detach(), samples=batch)


def _plain_block(torch: Any, model: Any, opt: Any, steps: int, batch: int, hidden: int, pinned: Any) -> None:
    for _ in range(steps):
        x, y = _batch(torch, batch, hidden, pinned)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()


def _timed(torch: Any, fn: Any) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def _steps_of(publisher: Any) -> list[dict[str, Any]]:
    return [e.record for e in publisher.events if e.type == "StepCompleted"]


def check_segments(torch: Any, args: argparse.Namespace, report: dict[str, Any]) -> None:
    """SDK (CUDA events) and host clocks against hand-recorded CUDA events, interleaved blocks."""
    from producers.publisher import MemoryPublisher
    from producers.training import Reporter

    model, opt = _model(torch, args.hidden, args.layers)
    pinned = torch.randn(args.batch, args.hidden).pin_memory()
    _plain_block(torch, model, opt, 5, args.batch, args.hidden, pinned)  # warm-up (kernels, allocator)
    gpu_pub, host_pub = MemoryPublisher(validate=False), MemoryPublisher(validate=False)
    cuda_rep = Reporter("gpu-check", 0, publisher=gpu_pub, bind=False, env={}, timing="cuda")
    host_rep = Reporter("gpu-check-host", 0, publisher=host_pub, bind=False, env={}, timing="host")
    truth: dict[str, list[float]] = {k: [] for k in (*SEGMENTS, "step")}
    block = max(5, args.steps // 4)
    done = 0
    while done < args.steps:
        t = _truth_block(torch, model, opt, block, args.batch, args.hidden, pinned)
        for k, v in t.items():
            truth[k] += v
        _sdk_block(cuda_rep, torch, model, opt, block, args.batch, args.hidden, pinned, done)
        _sdk_block(host_rep, torch, model, opt, block, args.batch, args.hidden, pinned, done)
        torch.cuda.synchronize()
        done += block
    cuda_rep.close(60)
    host_rep.close(60)
    sdk, host = _steps_of(gpu_pub), _steps_of(host_pub)
    print(f"\n== 1. segment times, median of {len(sdk)} steps (SDK: CUDA events, resolved off-thread)")
    print(
        f"{'segment':10s} {'SDK ms':>9s} {'truth ms':>9s} {'diff':>7s} {'host clock ms':>14s}   target: within 5 %"
    )
    rows = {}
    for seg, field in [(s, f"{s}_s") for s in SEGMENTS] + [("step", "step_time_s")]:
        got = statistics.median(r[field] for r in sdk) * 1e3
        want = statistics.median(truth[seg]) * 1e3
        naive = statistics.median(r[field] for r in host) * 1e3
        diff = (got - want) / want * 100 if want else float("nan")
        rows[seg] = {"sdk_ms": got, "truth_ms": want, "diff_pct": diff, "host_clock_ms": naive}
        ok = "ok" if abs(diff) <= 5 else "OFF"
        print(f"{seg:10s} {got:9.3f} {want:9.3f} {diff:+6.1f}% {naive:14.3f}   {ok}")
    report["segments"] = rows
    report["sdk_errors"] = cuda_rep.stats["sdk_errors"]


def check_overhead(torch: Any, args: argparse.Namespace, report: dict[str, Any]) -> None:
    """Step time with and without the SDK, alternating synchronised blocks."""
    from producers.publisher import MemoryPublisher
    from producers.training import Reporter

    model, opt = _model(torch, args.hidden, args.layers)
    pinned = torch.randn(args.batch, args.hidden).pin_memory()
    _plain_block(torch, model, opt, 5, args.batch, args.hidden, pinned)
    reporter = Reporter(
        "gpu-check-ovh", 0, publisher=MemoryPublisher(validate=False), bind=False, env={}, timing="cuda"
    )
    block = max(10, args.steps // 3)
    bare: list[float] = []
    sdk: list[float] = []
    first = 0
    for _ in range(4):
        bare.append(
            _timed(torch, lambda: _plain_block(torch, model, opt, block, args.batch, args.hidden, pinned))
            / block
        )
        sdk.append(
            _timed(
                torch,
                lambda f=first: _sdk_block(
                    reporter, torch, model, opt, block, args.batch, args.hidden, pinned, f
                ),
            )
            / block
        )
        first += block
    reporter.close(60)
    b, s = statistics.median(bare) * 1e3, statistics.median(sdk) * 1e3
    pct = (s - b) / b * 100
    print(f"\n== 2. step time, median of 4 blocks of {block} steps")
    print(f"without SDK {b:.3f} ms, with SDK {s:.3f} ms: overhead {pct:+.2f} % (target < 1 %)")
    report["overhead"] = {"bare_ms": b, "sdk_ms": s, "overhead_pct": pct}


def check_agent(args: argparse.Namespace, report: dict[str, Any]) -> None:
    """The sampler on the real NVML: cost per GPU per tick and per NVML function."""
    import psutil

    from producers.agent import GpuSampler, load_nvml
    from producers.agent.gpu import TimedNvml

    nvml = load_nvml()
    timed = TimedNvml(nvml)
    sampler = GpuSampler(timed, cluster="gpu-check", node="gpu-check")
    proc = psutil.Process()
    ticks = args.agent_ticks
    sampler.sample(0, time.monotonic())  # first tick: probes which fields exist
    timed._costs.clear()
    cpu0 = sum(proc.cpu_times()[:2])
    walls = []
    for k in range(ticks):
        t0 = time.perf_counter()
        records = sampler.sample(k, time.monotonic())
        walls.append((time.perf_counter() - t0) / sampler.count)
        time.sleep(0.05)
    cpu = sum(proc.cpu_times()[:2]) - cpu0
    per_gpu_ms = statistics.median(walls) * 1e3
    cpu_per_gpu_tick = cpu / (ticks * sampler.count)
    core_pct_8 = cpu_per_gpu_tick * 8 * 100  # 8 GPUs, one tick per second
    print(f"\n== 3. node agent on the real NVML: {sampler.count} GPU(s), {ticks} ticks")
    print(f"sample() per GPU: median {per_gpu_ms:.3f} ms wall (target < 5 ms)")
    print(
        f"CPU: {cpu_per_gpu_tick * 1e3:.3f} ms per GPU per tick -> 8 GPUs at 1 Hz = {core_pct_8:.3f} % of one core (target < 1 %)"
    )
    print(
        f"last record of GPU 0: {json.dumps({k: records[0][k] for k in ('gpu_name', 'clock_event_reasons', 'pids', 'nvlink_tx_bytes_s', 'pcie_tx_bytes_s')})}"
    )
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_agent import print_costs

    print_costs(timed, ticks, sampler.count)
    old: dict[str, float] = {}
    h = sampler.handles[0]
    for name, call in [
        (
            "nvmlDeviceGetPcieThroughput (was called twice per tick)",
            lambda: nvml.nvmlDeviceGetPcieThroughput(h, nvml.NVML_PCIE_UTIL_TX_BYTES),
        ),
        ("nvmlDeviceGetComputeRunningProcesses", lambda: nvml.nvmlDeviceGetComputeRunningProcesses(h)),
    ]:
        t0 = time.perf_counter()
        for _ in range(5):
            with contextlib.suppress(nvml.NVMLError):
                call()
        old[name] = (time.perf_counter() - t0) / 5 * 1e3
        print(f"for comparison: {name}: {old[name]:.3f} ms per call")
    report["agent"] = {
        "per_gpu_ms": per_gpu_ms,
        "cpu_pct_8_gpus_1hz": core_pct_8,
        "calls": {k: {"calls": n, "mean_us": s / n * 1e6} for k, (n, s) in timed.costs().items()},
        "old_calls_ms": old,
    }
    sampler.close()


def check_gpm(torch: Any, args: argparse.Namespace, report: dict[str, Any]) -> None:
    """GPM metrics of the sampler under idle, matmul and a spinning kernel (a collective's shape)."""
    from producers.agent import GpuSampler, load_nvml
    from producers.agent.gpu import GPM_FIELDS

    sampler = GpuSampler(load_nvml(), cluster="gpu-check", node="gpu-check")
    index = torch.cuda.current_device()
    print(f"\n== 4. GPM on GPU {index}: supported per GPU {sampler.gpm_supported}")
    if not sampler.gpm_supported[index]:
        report["gpm"] = {"supported": False}
        print("no GPM on this GPU (before Hopper, or the driver does not offer it): fields stay null")
        sampler.close()
        return
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)

    def matmuls() -> None:
        for _ in range(args.gpm_matmuls):
            a @ b

    def spin() -> None:
        torch.cuda._sleep(int(3.0 * 2e9))  # ~3 s of one spinning thread block at ~2 GHz

    rows: dict[str, dict[str, Any]] = {}
    for phase, work in (("idle", None), ("matmul", matmuls), ("spin", spin)):
        torch.cuda.synchronize()
        if work is not None:
            work()  # queued: the GPU works through it while the host samples
        time.sleep(0.3)
        sampler.sample(0, time.monotonic())  # the interval starts
        time.sleep(1.0)
        record = sampler.sample(1, time.monotonic())[index]
        torch.cuda.synchronize()
        rows[phase] = {k: record[k] for k in ("gpu_util_pct", *GPM_FIELDS)}
    print(f"{'load':8s} {'util %':>7s} {'SM act %':>9s} {'occup %':>8s} {'tensor %':>9s} {'DRAM %':>7s}")
    for phase, r in rows.items():
        cells = [r["gpu_util_pct"], *(r[f] for f in GPM_FIELDS)]
        print(f"{phase:8s} " + " ".join(f"{'-' if v is None else f'{v:.1f}':>8s}" for v in cells))
    spin_ok = (rows["spin"]["gpu_util_pct"] or 0) > 80 and (rows["spin"]["tensor_active_pct"] or 0) < 5
    matmul_ok = (rows["matmul"]["tensor_active_pct"] or 0) > 20
    print(
        f"matmul shows tensor work: {'ok' if matmul_ok else 'NO'}; spinning kernel busy without tensor work: "
        f"{'ok' if spin_ok else 'NO'}"
    )
    report["gpm"] = {"supported": True, "phases": rows, "matmul_ok": matmul_ok, "spin_ok": spin_ok}
    sampler.close()


def main() -> int:
    """Run the four checks, or say why they cannot run."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--agent-ticks", type=int, default=50)
    p.add_argument(
        "--gpm-matmuls", type=int, default=2000, help="bf16 8192^2 matmuls queued for the GPM check"
    )
    p.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    args = p.parse_args()
    try:
        import torch
    except ImportError:
        print("no GPU check: torch is not installed (pip install torch); nothing measured")
        return 0
    if not torch.cuda.is_available():
        print("no GPU: torch sees no CUDA device; nothing measured")
        return 0
    torch.backends.cuda.matmul.allow_tf32 = False
    print(f"GPU: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    report: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(0),
        "args": vars(args) | {"json": str(args.json)},
    }
    check_segments(torch, args, report)
    check_overhead(torch, args, report)
    try:
        check_agent(args, report)
    except Exception as exc:  # no NVML in this container: the SDK checks still count
        print(f"\n== 3. node agent: cannot read NVML here: {exc}")
    try:
        check_gpm(torch, args, report)
    except Exception as exc:
        print(f"\n== 4. GPM: cannot read NVML GPM here: {exc}")
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
