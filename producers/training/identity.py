"""Who is reporting: job, run, rank and node, from arguments or the launcher's environment."""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "RankIdentity",
    "expand_hostlist",
    "job_nodes",
    "kubeflow_job_name",
    "resolve_identity",
    "visible_gpu",
]


@dataclass(frozen=True)
class RankIdentity:
    """The identity every training event carries."""

    job_id: str
    run_id: str
    rank: int
    local_rank: int | None
    world_size: int
    node: str
    cluster: str


_KUBEFLOW_POD = re.compile(r"^(?P<job>.+)-(?:master|worker|launcher|trainer-node)-\d+(?:-[a-z0-9]{5})?$")


def kubeflow_job_name(pod: str) -> str:
    """The job of a training pod: `<job>-worker-3` / `<job>-master-0` (Kubeflow) -> `<job>`; else the pod name."""
    match = _KUBEFLOW_POD.match(pod)
    return match.group("job") if match else pod


def _int(env: Mapping[str, str], *names: str) -> int | None:
    for name in names:
        value = env.get(name)
        if value is not None and value.strip().lstrip("-").isdigit():
            return int(value)
    return None


def resolve_identity(
    job_id: str | None = None,
    rank: int | None = None,
    *,
    world_size: int | None = None,
    local_rank: int | None = None,
    node: str | None = None,
    run_id: str | None = None,
    cluster: str | None = None,
    env: Mapping[str, str] | None = None,
) -> RankIdentity:
    """Arguments win; then RANKSIGHT_*, Slurm, torchrun (RANK, LOCAL_RANK, WORLD_SIZE, TORCHELASTIC_RUN_ID), Kubernetes.

    In a Kubernetes pod (KUBERNETES_SERVICE_HOST set) the node is NODE_NAME (the downward API's
    `spec.nodeName`, by convention) and, failing every other id, the job is the pod's Kubeflow
    job name: the same name the node agent derives from the kubelet's pod-resources API.
    """
    env = os.environ if env is None else env
    k8s = bool(env.get("KUBERNETES_SERVICE_HOST"))
    pod = env.get("HOSTNAME") or socket.gethostname()
    elastic = env.get("TORCHELASTIC_RUN_ID")
    if elastic in ("", "none"):
        elastic = None  # torchrun's default rendezvous id says nothing about the job
    job = (
        job_id
        or env.get("RANKSIGHT_JOB_ID")
        or env.get("SLURM_JOB_ID")
        or elastic
        or (kubeflow_job_name(pod) if k8s else None)
        or f"local-{socket.gethostname()}"
    )
    restarts = env.get("TORCHELASTIC_RESTART_COUNT") or env.get("SLURM_RESTART_COUNT")
    run = (
        run_id
        if run_id is not None
        else env.get("RANKSIGHT_RUN_ID", f"restart-{restarts}" if restarts and restarts != "0" else "")
    )
    the_rank = rank if rank is not None else _int(env, "RANK", "SLURM_PROCID") or 0
    the_local = local_rank if local_rank is not None else _int(env, "LOCAL_RANK", "SLURM_LOCALID")
    the_world = world_size if world_size is not None else _int(env, "WORLD_SIZE", "SLURM_NTASKS") or 1
    the_node = (
        node
        or env.get("RANKSIGHT_NODE")
        or env.get("SLURMD_NODENAME")
        or (env.get("NODE_NAME") or env.get("KUBERNETES_NODE_NAME") if k8s else None)
        or socket.gethostname()
    )
    the_cluster = cluster or env.get("RANKSIGHT_CLUSTER") or env.get("SLURM_CLUSTER_NAME") or "local"
    return RankIdentity(job, run, the_rank, the_local, the_world, the_node, the_cluster)


_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def _split_top(text: str) -> list[str]:
    """Split a Slurm host list at the commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def expand_hostlist(text: str, limit: int = 100_000) -> list[str]:
    """Slurm's compressed host list -> host names: `gpu-[01-03,07],login1` -> gpu-01, gpu-02, gpu-03, gpu-07, login1.

    A malformed list gives what could be read (a name with a bracket it cannot expand is kept as is).
    """
    hosts: list[str] = []
    for part in _split_top(text):
        expanded = [""]
        rest = part
        while rest and len(expanded) <= limit:
            open_at = rest.find("[")
            close_at = rest.find("]", open_at + 1)
            if open_at < 0 or close_at < 0:
                expanded = [e + rest for e in expanded]
                break
            prefix, body, rest = rest[:open_at], rest[open_at + 1 : close_at], rest[close_at + 1 :]
            values: list[str] = []
            for item in body.split(","):
                match = _RANGE.match(item.strip())
                if match is None:
                    values = [f"[{body}]"]
                    break
                lo, hi = match.group(1), match.group(2) or match.group(1)
                width = len(lo)
                values += [str(n).zfill(width) for n in range(int(lo), int(hi) + 1)]
            expanded = [e + prefix + v for e in expanded for v in values]
        hosts.extend(expanded)
        if len(hosts) >= limit:
            break
    return hosts[:limit]


def job_nodes(ident: RankIdentity, env: Mapping[str, str] | None = None) -> list[str]:
    """The nodes of the job as the launcher knows them: Slurm's node list, else this node for a one-node job.

    Empty when a multi-node job's nodes are unknown here (torchrun on several hosts): a wrong list
    would make every rank elsewhere look misplaced.
    """
    env = os.environ if env is None else env
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if nodelist:
        return expand_hostlist(nodelist)
    local_world = _int(env, "LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE")
    if ident.world_size <= 1 or (local_world is not None and local_world >= ident.world_size):
        return [ident.node]
    return []


def visible_gpu(
    local_rank: int | None, env: Mapping[str, str] | None = None, nvml: Any = None
) -> tuple[int | None, str | None]:
    """(index, uuid) of the GPU this rank uses (CUDA_VISIBLE_DEVICES[local_rank]) through NVML, or (None, None)."""
    env = os.environ if env is None else env
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1", "none", "NoDevFiles"):
        return None, None
    slot = local_rank or 0
    if visible is not None:
        entries = [e.strip() for e in visible.split(",") if e.strip()]
        if slot >= len(entries):
            return None, None
        target = entries[slot]
    else:
        target = str(slot)
    try:
        if nvml is None:
            nvml = importlib.import_module("pynvml")
        nvml.nvmlInit()
    except Exception:  # no driver, no library: this rank has no visible GPU to report
        return None, None
    try:
        if target.startswith(("GPU-", "MIG-")):
            handle = nvml.nvmlDeviceGetHandleByUUID(target)
        else:
            handle = nvml.nvmlDeviceGetHandleByIndex(int(target))
        uuid = nvml.nvmlDeviceGetUUID(handle)
        index = int(nvml.nvmlDeviceGetIndex(handle))
        return index, uuid.decode() if isinstance(uuid, bytes) else str(uuid)
    except Exception:
        return None, None
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()
