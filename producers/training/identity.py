"""Who is reporting: job, run, rank and node, from arguments or the launcher's environment."""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["RankIdentity", "kubeflow_job_name", "resolve_identity"]


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
