"""Which job runs on each GPU of this node, decided locally from whatever the node has.

Sources, first match wins per GPU:

1. **SDK bindings** (`producers.training.bindings`): a training process using the SDK leaves
   `<runtime dir>/bindings/<pid>.json` with its job, run and GPU UUID.
2. **Slurm**: for the pids NVML lists on the GPU, the job id in `/proc/<pid>/cgroup`
   (`.../job_<id>/...`, cgroup v1 and v2), else `SLURM_JOB_ID` (and `RANKSIGHT_JOB_ID` /
   `RANKSIGHT_RUN_ID`, which win) in `/proc/<pid>/environ` (readable by root or the job's user).
3. **Kubernetes**: the kubelet pod-resources API `List` names the pod each GPU UUID is allocated
   to; the job is the pod's Kubeflow job name (`<job>-worker-3` -> `<job>`) or the pod name. The
   agent calls `/v1.PodResourcesLister/List` on the kubelet socket (needs `grpcio`), or reads a
   recorded response (JSON or protobuf bytes) from a file.

A GPU no source claims is published without a job. The answer is refreshed every
`refresh_s` (default 10 s), not every tick: reading /proc and the kubelet socket costs more than
the NVML counters.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from producers.training.bindings import Binding, read_bindings, reader_dirs
from producers.training.identity import kubeflow_job_name

__all__ = [
    "Attributor",
    "JobRef",
    "PodDevices",
    "decode_pod_resources",
    "kubelet_list",
    "parse_pod_resources_json",
    "slurm_job_of_pid",
]

log = logging.getLogger(__name__)

KUBELET_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
_GPU_RESOURCES = ("nvidia.com/gpu",)
_SLURM_CGROUP = re.compile(r"/job_(\d+)(?:/|$)")


@dataclass(frozen=True)
class JobRef:
    """The job (and run, when known) a GPU belongs to, and which source said so."""

    job_id: str
    run_id: str | None
    source: str  # "sdk", "slurm" or "kubernetes"


@dataclass(frozen=True)
class PodDevices:
    """One container's GPUs, from the kubelet pod-resources API."""

    namespace: str
    pod: str
    container: str
    resource: str
    device_ids: tuple[str, ...]


# -- Slurm ----------------------------------------------------------------------------------------


def _environ(proc: Path, pid: int) -> dict[str, str]:
    try:
        raw = (proc / str(pid) / "environ").read_bytes()
    except OSError:
        return {}
    out: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            out[key.decode(errors="replace")] = value.decode(errors="replace")
    return out


def slurm_job_of_pid(proc: Path, pid: int) -> JobRef | None:
    """The job of a process: its Slurm cgroup, else its environment (RANKSIGHT_JOB_ID, SLURM_JOB_ID)."""
    env = _environ(proc, pid)
    job = env.get("RANKSIGHT_JOB_ID")
    if job:
        return JobRef(job, env.get("RANKSIGHT_RUN_ID"), "sdk")
    try:
        cgroup = (proc / str(pid) / "cgroup").read_text()
    except OSError:
        cgroup = ""
    for line in cgroup.splitlines():
        match = _SLURM_CGROUP.search(line)
        if match:
            return JobRef(match.group(1), _slurm_run(env), "slurm")
    if env.get("SLURM_JOB_ID"):
        return JobRef(env["SLURM_JOB_ID"], _slurm_run(env), "slurm")
    return None


def _slurm_run(env: Mapping[str, str]) -> str | None:
    restarts = env.get("SLURM_RESTART_COUNT")
    if restarts is None:
        return None
    # The SDK's run id for a Slurm job (producers.training.identity): "" until the first requeue.
    return f"restart-{restarts}" if restarts != "0" else ""


# -- Kubernetes -----------------------------------------------------------------------------------


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, i
        shift += 7


def _fields(buf: bytes) -> Iterable[tuple[int, int, Any]]:
    """(field number, wire type, value) of a protobuf message; length-delimited values as bytes."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        number, wire = key >> 3, key & 7
        value: int | bytes
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 2:
            size, i = _varint(buf, i)
            value, i = buf[i : i + size], i + size
        elif wire == 1:
            value, i = buf[i : i + 8], i + 8
        elif wire == 5:
            value, i = buf[i : i + 4], i + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        yield number, wire, value


def decode_pod_resources(data: bytes) -> list[PodDevices]:
    """Decode a `v1.ListPodResourcesResponse` (kubelet pod-resources API) from protobuf bytes.

    pod_resources = 1 {name = 1, namespace = 2, containers = 3 {name = 1, devices = 2
    {resource_name = 1, device_ids = 2}}}; other fields (cpu ids, memory, topology) are skipped.
    """
    out: list[PodDevices] = []
    for number, wire, pod in _fields(data):
        if number != 1 or wire != 2:
            continue
        name = namespace = ""
        containers: list[bytes] = []
        for n, w, v in _fields(pod):
            if w != 2:
                continue
            if n == 1:
                name = v.decode()
            elif n == 2:
                namespace = v.decode()
            elif n == 3:
                containers.append(v)
        for container in containers:
            cname = ""
            devices: list[bytes] = []
            for n, w, v in _fields(container):
                if w == 2 and n == 1:
                    cname = v.decode()
                elif w == 2 and n == 2:
                    devices.append(v)
            for device in devices:
                resource = ""
                ids: list[str] = []
                for n, w, v in _fields(device):
                    if w == 2 and n == 1:
                        resource = v.decode()
                    elif w == 2 and n == 2:
                        ids.append(v.decode())
                out.append(PodDevices(namespace, name, cname, resource, tuple(ids)))
    return out


def parse_pod_resources_json(data: Mapping[str, Any]) -> list[PodDevices]:
    """The same response as JSON (protobuf JSON names `podResources`/`deviceIds`, or snake_case)."""

    def get(d: Mapping[str, Any], snake: str, camel: str) -> Any:
        return d.get(snake, d.get(camel))

    out: list[PodDevices] = []
    for pod in get(data, "pod_resources", "podResources") or []:
        for container in pod.get("containers") or []:
            for device in container.get("devices") or []:
                out.append(
                    PodDevices(
                        pod.get("namespace", ""),
                        pod.get("name", ""),
                        container.get("name", ""),
                        get(device, "resource_name", "resourceName") or "",
                        tuple(get(device, "device_ids", "deviceIds") or ()),
                    )
                )
    return out


def kubelet_list(socket_path: str = KUBELET_SOCKET, timeout: float = 2.0) -> bytes:
    """Call `/v1.PodResourcesLister/List` on the kubelet socket; the raw response bytes (needs grpcio)."""
    import grpc  # optional: only nodes that use the Kubernetes source need it

    with grpc.insecure_channel(f"unix://{socket_path}") as channel:
        call = channel.unary_unary(
            "/v1.PodResourcesLister/List",
            request_serializer=lambda b: b,
            response_deserializer=lambda b: b,
        )
        return bytes(call(b"", timeout=timeout))


def load_pod_resources(source: str) -> list[PodDevices]:
    """From a recorded response file (`.json`, or protobuf bytes), or the kubelet socket itself."""
    path = Path(source)
    if path.is_socket():
        return decode_pod_resources(kubelet_list(source))
    data = path.read_bytes()
    if path.suffix == ".json":
        return parse_pod_resources_json(json.loads(data))
    return decode_pod_resources(data)


# -- the attributor -------------------------------------------------------------------------------


class Attributor:
    """Maps GPU UUIDs (and their pids) to jobs; `refresh(gpus)` re-reads the sources, `job_for(uuid)` answers."""

    def __init__(
        self,
        *,
        proc_root: str | Path = "/proc",
        bindings: list[Path] | None = None,
        pod_resources: str | None = None,
        env: Mapping[str, str] | None = None,
        refresh_s: float = 10.0,
        alive: Callable[[], frozenset[int]] | None = None,
    ) -> None:
        self.proc = Path(proc_root)
        self.bindings = bindings if bindings is not None else reader_dirs(env)
        self.pod_resources = pod_resources
        self.refresh_s = refresh_s
        self._alive = alive
        self._by_uuid: dict[str, JobRef] = {}
        self._jobs: set[str] = set()
        self._last: float | None = None
        self._k8s_logged = False

    def due(self, now_s: float) -> bool:
        """Whether `refresh_s` passed since the last refresh."""
        return self._last is None or now_s - self._last >= self.refresh_s

    def refresh(self, gpus: Iterable[tuple[str, list[int]]], now_s: float = 0.0) -> dict[str, JobRef]:
        """Re-read every source for these (GPU UUID, pids on it) and keep the answer."""
        self._last = now_s
        gpus = list(gpus)
        alive = self._alive() if self._alive is not None else None
        sdk: list[Binding] = list(read_bindings(self.bindings, alive=alive, proc=self.proc))
        by_uuid_sdk = {b.gpu_uuid: b for b in sdk if b.gpu_uuid}
        by_pid_sdk = {b.pid: b for b in sdk}
        pods = self._pods()
        answer: dict[str, JobRef] = {}
        for uuid, pids in gpus:
            ref: JobRef | None = None
            binding = by_uuid_sdk.get(uuid) or next((by_pid_sdk[p] for p in pids if p in by_pid_sdk), None)
            if binding is not None:
                ref = JobRef(binding.job_id, binding.run_id, "sdk")
            if ref is None:
                for pid in pids:
                    ref = slurm_job_of_pid(self.proc, pid)
                    if ref is not None:
                        break
            if ref is None and uuid in pods:
                ref = pods[uuid]
            if ref is not None:
                answer[uuid] = ref
        self._by_uuid = answer
        # The host's jobs: those holding GPUs, and SDK processes here without one (CPU-only ranks).
        self._jobs = {ref.job_id for ref in answer.values()} | {b.job_id for b in sdk}
        return answer

    def _pods(self) -> dict[str, JobRef]:
        if not self.pod_resources:
            return {}
        try:
            devices = load_pod_resources(self.pod_resources)
        except Exception as exc:  # the kubelet may be restarting; the other sources still work
            if not self._k8s_logged:
                self._k8s_logged = True
                log.warning("kubelet pod-resources unavailable (%s); retrying at each refresh", exc)
            return {}
        out: dict[str, JobRef] = {}
        for d in devices:
            if d.resource not in _GPU_RESOURCES:
                continue
            for device_id in d.device_ids:
                out[device_id] = JobRef(kubeflow_job_name(d.pod), None, "kubernetes")
        return out

    def job_for(self, uuid: str) -> JobRef | None:
        """The job of a GPU at the last refresh."""
        return self._by_uuid.get(uuid)

    def job_ids(self) -> list[str]:
        """Every job on this node at the last refresh (holding a GPU, or an SDK process), sorted."""
        return sorted(self._jobs)
