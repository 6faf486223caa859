"""The fault catalogue: what each injectable fault is expected to raise and which knobs it takes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["FAULTS", "FaultKind", "Scope"]

Scope = Literal["rank", "gpu", "node", "job"]


@dataclass(frozen=True)
class FaultKind:
    """One fault type: the alert rule it must raise, rules that may co-fire, and its parameters."""

    name: str
    alert: str | None
    also: tuple[str, ...]
    layer: str | None
    scope: Scope
    summary: str
    # Type-specific knobs and their defaults; `magnitude` and `duration` live here too when they
    # have a type-specific default (None = lasts to the end of the scenario).
    params: dict[str, Any] = field(default_factory=dict)


def _kind(
    name: str,
    alert: str | None,
    also: tuple[str, ...],
    layer: str | None,
    scope: Scope,
    summary: str,
    **params: Any,
) -> FaultKind:
    return FaultKind(name, alert, also, layer, scope, summary, params)


FAULTS: dict[str, FaultKind] = {
    k.name: k
    for k in (
        _kind(
            "straggler_gpu",
            "straggler",
            ("gpu_throttling", "gpu_imbalance"),
            "gpu",
            "rank",
            "one GPU throttles (thermal or power): clocks down, throttle bits set, its compute slower",
            magnitude=1.5,
            variant="thermal",
            ramp=0.0,
            duration=360.0,
        ),
        _kind(
            "slow_data_worker",
            "straggler",
            ("gpu_imbalance",),
            "data",
            "rank",
            "one rank waits longer for its data loader (magnitude = extra wait, x base step time)",
            magnitude=0.5,
            ramp=0.0,
            duration=360.0,
        ),
        _kind(
            "network_degradation",
            "network_degradation",
            (),
            "network",
            "node",
            "one node's link degrades: every rank's collective slower, TCP retransmits on the node",
            magnitude=2.0,
            retransmits=900.0,
            ramp=0.0,
            duration=360.0,
        ),
        _kind(
            "rank_hang",
            "rank_hang",
            ("job_stall", "zombie_job"),
            None,
            "rank",
            "one rank stops; the others block in the collective; ends with a collective timeout",
            gpus="busy",
            duration=None,
        ),
        _kind(
            "job_stall",
            "job_stall",
            ("zombie_job",),
            None,
            "job",
            "every rank stops stepping (e.g. a hung filesystem), no checkpoint open; resumes after",
            duration=480.0,
        ),
        _kind(
            "long_checkpoint",
            None,
            (),
            "checkpoint",
            "job",
            "a long but successful checkpoint pauses the steps; must NOT be reported as a stall",
            duration=300.0,
        ),
        _kind(
            "loss_divergence",
            "loss_divergence",
            (),
            "model",
            "job",
            "loss trends up (magnitude = nats per minute)",
            magnitude=0.3,
            duration=None,
        ),
        _kind(
            "nan_loss", "nonfinite_loss", ("nonfinite_grad",), "model", "job", "loss is NaN", duration=30.0
        ),
        _kind(
            "nan_grad",
            "nonfinite_grad",
            (),
            "model",
            "job",
            "gradient norm is inf/NaN, the optimizer skips the steps",
            duration=30.0,
        ),
        _kind(
            "grad_spike",
            "grad_spike",
            (),
            "model",
            "job",
            "gradient norm jumps (magnitude = factor) for a few steps; loss spikes too",
            magnitude=50.0,
            duration=4.0,
        ),
        _kind(
            "checkpoint_failure",
            "checkpoint_failed",
            ("checkpoint_stale",),
            "checkpoint",
            "job",
            "checkpoints fail (e.g. quota exceeded) during the window",
            duration=900.0,
            error="OSError: [Errno 122] Disk quota exceeded",
        ),
        _kind(
            "restore_test_failure",
            "restore_test_failed",
            (),
            "checkpoint",
            "job",
            "a restore test of the latest verified checkpoint fails (optimizer state missing): no recovery point",
            duration=None,
            error="KeyError: 'optimizer' (the checkpoint has no optimizer state)",
        ),
        _kind(
            "restore_test_passed",
            None,
            (),
            "checkpoint",
            "job",
            "a restore test of the latest verified checkpoint passes; must NOT be reported",
            duration=None,
        ),
        _kind(
            "checkpoint_never_completes",
            "checkpoint_stuck",
            ("checkpoint_stale", "checkpoint_failed"),
            "checkpoint",
            "job",
            "an asynchronous checkpoint starts and never completes; it is abandoned (failed) at the end",
            duration=900.0,
        ),
        _kind(
            "xid_error",
            "xid_error",
            (),
            "gpu",
            "gpu",
            "the driver reports an XID on one GPU (a GpuSample with `xid` at the moment)",
            xid=79,
            duration=0.0,
        ),
        _kind(
            "ecc_uncorrectable",
            "ecc_uncorrectable",
            ("xid_error",),
            "gpu",
            "gpu",
            "uncorrectable ECC errors on one GPU (counter increments, a row remapped, optional XID 48)",
            count=1,
            xid=48,
            duration=0.0,
        ),
        _kind(
            "gpu_memory_pressure",
            "gpu_memory_pressure",
            (),
            "gpu",
            "gpu",
            "device memory in use above 97% of total (magnitude = fraction in use)",
            magnitude=0.985,
            duration=360.0,
        ),
        _kind(
            "host_oom",
            "host_memory_pressure",
            (),
            "host",
            "node",
            "host memory exhausted: available near 0, swap up, kernel OOM kills",
            oom_kills=2,
            rank_fault=False,
            duration=300.0,
        ),
        _kind(
            "agent_silent",
            "telemetry_missing",
            (),
            "telemetry",
            "node",
            "a node's agent stops sending GpuSample/HostSample while the job keeps stepping",
            duration=300.0,
        ),
        _kind(
            "foreign_process",
            "foreign_process",
            (),
            "gpu",
            "gpu",
            "a process not bound to the job shows up on one of its GPUs",
            pid=None,
            mem_gib=6.0,
            duration=300.0,
        ),
        _kind(
            "throughput_regression",
            "baseline_deviation",
            (),
            "performance",
            "job",
            "the run is slower than earlier runs of its workload family (magnitude = step time factor)",
            magnitude=1.3,
            ramp=0.0,
            duration=None,
        ),
        _kind(
            "restart_loop",
            "restart_loop",
            (),
            None,
            "job",
            "the job crashes and restarts from its checkpoint again and again",
            restarts=4,
            every=120.0,
            duration=None,
        ),
        _kind(
            "long_pending",
            "long_pending",
            (),
            "scheduler",
            "job",
            "the job stays pending before it runs (duration = time pending)",
            duration=720.0,
        ),
        _kind(
            "zombie",
            "zombie_job",
            ("job_stall",),
            None,
            "job",
            "the training loop ends but the processes keep their GPUs; the job never ends",
            duration=None,
        ),
        _kind(
            "ib_degradation",
            "network_degradation",
            (),
            "network",
            "node",
            "a node's InfiniBand port degrades: IB throughput down, port errors up, every collective slower",
            magnitude=2.0,
            ramp=0.0,
            duration=360.0,
        ),
        _kind(
            "storage_slowdown",
            "straggler",
            ("gpu_imbalance", "network_degradation", "baseline_deviation", "job_stall"),
            "data",
            "node",
            "the storage server under one node is slow: that node's ranks wait for data (magnitude = extra"
            " wait, x base step time); one incident, not one alert per rank",
            magnitude=0.6,
            ramp=0.0,
            duration=360.0,
        ),
        _kind(
            "checkpoint_unverified",
            "checkpoint_stale",
            (),
            "checkpoint",
            "job",
            "checkpoints complete but are never verified: the latest verified checkpoint ages",
            duration=None,
        ),
        _kind(
            "contention",
            "throughput_drop",
            ("foreign_process", "gpu_memory_pressure", "baseline_deviation"),
            "gpu",
            "job",
            "a foreign process on one GPU slows the whole job (magnitude = step time factor); the run's"
            " own recent history is the baseline",
            magnitude=2.0,
            pid=None,
            mem_gib=6.0,
            duration=75.0,
        ),
        # -- the data path (issue 12.4) --------------------------------------------------------
        _kind(
            "repeated_batches",
            "repeated_data",
            (),
            "data",
            "rank",
            "one rank's loader cycles through the same few batches (magnitude = how many) while its GPU"
            " keeps computing: the batch fingerprints repeat",
            magnitude=4.0,
            duration=360.0,
        ),
        _kind(
            "epoch_replay",
            None,
            (),
            "data",
            "job",
            "a loader without shuffling starts a short epoch (magnitude = epoch length in steps) and"
            " replays it; batches repeat once per epoch; must NOT be reported",
            magnitude=200.0,
            duration=None,
        ),
        _kind(
            "data_errors",
            "data_errors",
            (),
            "data",
            "rank",
            "one rank's loader fails to open files (magnitude = failed opens per loader sample) and skips them",
            magnitude=3.0,
            duration=300.0,
        ),
        _kind(
            "data_errors_transient",
            None,
            (),
            "data",
            "rank",
            "one rank's loader reports a short burst of file-open errors, then recovers; must NOT be reported",
            magnitude=2.0,
            duration=3.0,
        ),
        # -- validation behaviour (issue 12.5) -------------------------------------------------
        _kind(
            "validation_divergence",
            "validation_divergence",
            (),
            "model",
            "job",
            "validation loss rises (magnitude = relative rise per minute, compounding) while training loss"
            " keeps falling: overfitting",
            magnitude=0.1,
            duration=None,
        ),
        _kind(
            "validation_noise",
            None,
            (),
            "model",
            "job",
            "validation loss is noisy (magnitude = relative standard deviation) but follows training;"
            " must NOT be reported",
            magnitude=0.005,
            duration=None,
        ),
        _kind(
            "validation_missing",
            "validation_missing",
            (),
            "model",
            "job",
            "evaluations stop being run while training goes on",
            duration=None,
        ),
        _kind(
            "validation_late",
            None,
            (),
            "model",
            "job",
            "one evaluation runs late (magnitude = delay as a fraction of the period), within tolerance;"
            " must NOT be reported",
            magnitude=0.3,
            duration=None,
        ),
    )
}
