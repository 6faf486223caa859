"""`ranksight agent`: the node agent (GPU telemetry through NVML, host telemetry through psutil)."""

from __future__ import annotations

import logging
import socket
from pathlib import Path
from typing import Annotated, Any

import typer

from ranksight.console import console, err_console, fail, user_errors
from ranksight.signals import stop_signals

__all__ = ["register"]


_Interval = Annotated[float, typer.Option("--interval", min=0.05, help="Seconds between samples.")]
_Cluster = Annotated[
    str | None, typer.Option("--cluster", help="Cluster name (default: RANKSIGHT_CLUSTER or 'local').")
]
_Node = Annotated[str | None, typer.Option("--node", help="Node name (default: the host name).")]
_Simulate = Annotated[bool, typer.Option("--simulate", help="Simulated GPUs (no NVIDIA driver needed).")]
_Gpus = Annotated[int, typer.Option("--gpus", min=0, help="Number of simulated GPUs (with --simulate).")]
_NoGpu = Annotated[bool, typer.Option("--no-gpu", help="Host telemetry only (CPU-only nodes).")]
_To = Annotated[str, typer.Option("--to", help="'kafka' (KAFKA_BOOTSTRAP) or file:///path/events.avro.")]
_Count = Annotated[int | None, typer.Option("--count", min=1, help="Stop after this many intervals.")]
_SpoolDir = Annotated[
    Path | None,
    typer.Option(
        "--spool-dir", help="Disk spool for Kafka outages (default: $RANKSIGHT_HOME/spool/agent-<node>)."
    ),
]
_SpoolMaxMb = Annotated[int, typer.Option("--spool-max-mb", min=1, help="Bound of the disk spool, MiB.")]
_ReportEvery = Annotated[
    int, typer.Option("--report-every", min=1, help="Print a status line every N intervals.")
]
_SlowInterval = Annotated[
    float,
    typer.Option(
        "--slow-interval",
        min=0.0,
        help="Seconds between reads of slowly changing GPU fields (ECC, remapped rows, pids, power limit).",
    ),
]
_Attribution = Annotated[
    bool,
    typer.Option(
        "--attribution/--no-attribution", help="Stamp each GPU sample with the job holding the GPU."
    ),
]
_BindingsDir = Annotated[
    list[Path],
    typer.Option(
        "--bindings-dir",
        help="Where the SDK leaves bindings (repeatable; default: RANKSIGHT_RUNTIME_DIR and the usual places).",
    ),
]
_PodResources = Annotated[
    str | None,
    typer.Option(
        "--pod-resources",
        help="Kubelet pod-resources socket or a recorded List response (.json or protobuf); "
        "default: the kubelet socket when present.",
    ),
]
_MetricsPort = Annotated[
    int,
    typer.Option(
        "--metrics-port",
        min=0,
        max=65535,
        envvar="RANKSIGHT_AGENT_METRICS_PORT",
        help="Serve Prometheus /metrics on this port if prometheus_client is installed (0: off).",
    ),
]
_ProcRoot = Annotated[Path, typer.Option("--proc-root", help="The /proc of the host (Slurm attribution).")]


def agent(
    interval: _Interval = 1.0,
    cluster: _Cluster = None,
    node: _Node = None,
    simulate: _Simulate = False,
    gpus: _Gpus = 8,
    no_gpu: _NoGpu = False,
    to: _To = "kafka",
    count: _Count = None,
    spool_dir: _SpoolDir = None,
    spool_max_mb: _SpoolMaxMb = 256,
    report_every: _ReportEvery = 60,
    slow_interval: _SlowInterval = 10.0,
    attribution: _Attribution = True,
    bindings_dir: _BindingsDir = [],  # noqa: B006 (typer reads it; nothing appends to it)
    pod_resources: _PodResources = None,
    metrics_port: _MetricsPort = 0,
    proc_root: _ProcRoot = Path("/proc"),
) -> None:
    """Sample this node's GPUs and host every interval and publish GpuSample / HostSample events."""
    from producers.agent import Agent, FakeNvml, GpuSampler, HostSampler, load_nvml
    from producers.agent.attribution import KUBELET_SOCKET, Attributor
    from producers.publisher import open_publisher
    from ranksight.errors import KafkaNotFoundError
    from ranksight.producing import finish
    from ranksight.settings import load_settings

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = load_settings(cluster=cluster)
    node_name = node or socket.gethostname()
    with user_errors():
        sampler = None
        if not no_gpu:
            nvml: Any = FakeNvml(gpus=gpus) if simulate else load_nvml()
            sampler = GpuSampler(
                nvml, cluster=settings.cluster, node=node_name, slow_interval_s=slow_interval
            )
        kafka_conf: dict[str, Any] | None = None
        knobs: dict[str, Any] = {}
        if to == "kafka":
            from ranksight.broker import check_broker, kafka_settings
            from ranksight.producing import drain_other_spools

            try:
                settings = kafka_settings(cluster=cluster)
            except KafkaNotFoundError as exc:
                fail(f"{exc} (or use --to file:///path.avro)")
            # Wrong credentials or an untrusted certificate: one sentence; an absent broker: spool.
            check_broker(settings, allow_unreachable=True)
            kafka_conf = settings.kafka_config()
            knobs["spool_max_bytes"] = spool_max_mb * 1024 * 1024
            spool_dir = spool_dir or settings.spool_root / f"agent-{node_name}"
            drain_other_spools(settings, exclude=(spool_dir.name,))
        publisher = open_publisher(
            to, kafka_conf=kafka_conf, topic_prefix=settings.topic_prefix, spool_dir=spool_dir, **knobs
        )
    assert publisher is not None
    host = HostSampler(cluster=settings.cluster, node=node_name)
    attributor = None
    if attribution:
        kubelet = pod_resources or (KUBELET_SOCKET if Path(KUBELET_SOCKET).exists() else None)
        attributor = Attributor(
            proc_root=proc_root, bindings=list(bindings_dir) or None, pod_resources=kubelet
        )
    runner = Agent(publisher, host=host, gpus=sampler, interval=interval, attributor=attributor)
    gpu_text = "no GPUs" if sampler is None else f"{sampler.count} {'simulated ' if simulate else ''}GPU(s)"
    err_console.print(
        f"agent on {node_name} ({settings.cluster}): {gpu_text} + host, every {interval:g}s -> {to}"
    )

    metrics = _agent_metrics_server(metrics_port)

    def _report(stats: Any) -> None:
        if metrics is not None:
            from producers.agent.metrics import agent_metrics

            metrics.publish(agent_metrics(stats, publisher.stats))
        if stats.ticks % report_every == 0:
            p = publisher.stats
            err_console.print(
                f"{stats.ticks} intervals: {stats.gpu_samples} GPU + {stats.host_samples} host samples, "
                f"{stats.xid_events} XID/ECC events; delivered {p.get('delivered', 0)}, "
                f"spooled {p.get('spooled', 0)}, dropped {p.get('spool_dropped', 0)}"
            )

    # SIGINT and SIGTERM (also when started with SIGINT ignored) end the sampling loop; what was
    # sampled is flushed within the stop budget, and what Kafka did not take stays in the spool.
    with stop_signals(on_stop=runner.stop, name="agent") as stop:
        try:
            stats = runner.run(count=count, on_tick=_report)
        except KeyboardInterrupt:
            stats = runner.stats
        finally:
            left = finish(publisher, 10.0, stop)
            if sampler is not None:
                sampler.close()
    console.print(
        f"sampled {stats.ticks} intervals: {stats.gpu_samples} GPU samples, {stats.host_samples} host samples, "
        f"{stats.xid_events} XID/ECC events"
        + (f"; {left} events not delivered (kept in the spool)" if left else "")
    )


def register(app: typer.Typer) -> None:
    """Add the `agent` command."""
    app.command("agent")(agent)


def _agent_metrics_server(port: int) -> Any:
    """A /metrics server for the agent, or None: off, or prometheus_client not installed (the light
    install keeps working, with one line saying why there are no metrics)."""
    if not port:
        return None
    import importlib.util

    if importlib.util.find_spec("prometheus_client") is None:
        err_console.print(
            "[yellow]warning:[/] --metrics-port needs prometheus_client (pip install prometheus_client);"
            " the agent runs without /metrics"
        )
        return None
    from infra.metrics import MetricsServer

    with user_errors():
        return MetricsServer(port)
