"""Acting on a job through its scheduler: cancel or requeue (Slurm), suspend or restart its Pods (Kubernetes).

`ranksight remediate` decides *whether* (streams.alerting.remediation); these adapters only do
what they are told, name the job the way the scheduler does, and say what it answered:

- Slurm: `cancel` is `scancel <id>`, `requeue` is `scontrol requeue <id>` (the job goes back to
  pending and restarts from its latest checkpoint). The id is the job's scheduler label
  (`ranksight.dev/scheduler-job-id`) or else its ranksight job id (the SDK uses SLURM_JOB_ID), and
  must look like a Slurm job id (`123`, `123_4`), so nothing else ever reaches the command line.
- Kubernetes: the batch/v1 Job is `<namespace>/<name>` or the Job labelled
  `ranksight.dev/job-id=<job id>`. `requeue` deletes the Job's Pods (its controller creates new
  ones, a retry within `backoffLimit`); `cancel` first suspends the Job (`spec.suspend: true`, so
  no new Pods are created, and the Job can be resumed), then deletes its Pods.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, Protocol

from producers.scheduler.errors import SchedulerError
from producers.scheduler.kubernetes import JOB_ID_LABEL

__all__ = [
    "SCHEDULER_JOB_LABEL",
    "KubernetesActions",
    "SchedulerActionError",
    "SchedulerActions",
    "SlurmActions",
]

SCHEDULER_JOB_LABEL = "ranksight.dev/scheduler-job-id"
Action = Literal["cancel", "requeue"]
_SLURM_ID = re.compile(r"^\d+(_\d+)?$")


class SchedulerActionError(SchedulerError):
    """The scheduler refused an action, or the job cannot be named to it."""


class SchedulerActions(Protocol):
    """What `ranksight remediate` needs from a scheduler."""

    name: str

    def target(self, job_id: str, labels: Mapping[str, str]) -> str:
        """The job as the scheduler names it; raises `SchedulerActionError` when it cannot be named."""
        ...

    def describe(self, action: Action, target: str) -> str:
        """What `act` would do, in words (dry runs record it)."""
        ...

    def act(self, action: Action, target: str) -> str:
        """Do it; the scheduler's answer. Raises `SchedulerActionError` when refused."""
        ...


Runner = Callable[[Sequence[str]], str]


def _run(argv: Sequence[str]) -> str:
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=60, check=False)
    except FileNotFoundError:
        raise SchedulerActionError(
            f"`{argv[0]}` is not installed here; run remediate on a Slurm login node"
        ) from None
    except subprocess.TimeoutExpired:
        raise SchedulerActionError(f"`{' '.join(argv)}` did not answer within 60 s") from None
    if done.returncode != 0:
        message = (done.stderr.strip() or done.stdout.strip() or f"exit {done.returncode}").splitlines()[-1]
        raise SchedulerActionError(f"`{' '.join(argv)}` failed: {message}")
    return (done.stdout.strip() or "ok").splitlines()[-1]


class SlurmActions:
    """`scancel` and `scontrol requeue`."""

    name = "slurm"

    def __init__(self, *, runner: Runner = _run, job_label: str = SCHEDULER_JOB_LABEL) -> None:
        self._runner = runner
        self._label = job_label

    def target(self, job_id: str, labels: Mapping[str, str]) -> str:
        """The Slurm job id: the scheduler label, else the job id; only ids Slurm could have made pass."""
        target = str(labels.get(self._label) or job_id)
        if not _SLURM_ID.match(target):
            raise SchedulerActionError(
                f"job {job_id!r} has no Slurm job id (set label {self._label} on JobStarted, "
                "or use SLURM_JOB_ID as the job id)"
            )
        return target

    def _argv(self, action: Action, target: str) -> list[str]:
        return ["scancel", target] if action == "cancel" else ["scontrol", "requeue", target]

    def describe(self, action: Action, target: str) -> str:
        """The command that would run."""
        return " ".join(self._argv(action, target))

    def act(self, action: Action, target: str) -> str:
        """Run the command; its output ("ok" when silent, as scancel is)."""
        out = self._runner(self._argv(action, target))
        return f"{self.describe(action, target)}: {out}"


class KubernetesActions:
    """Suspend a batch/v1 Job and delete its Pods, through the official client."""

    name = "kubernetes"

    def __init__(self, *, namespace: str | None = None, api_client: Any = None) -> None:
        try:
            from kubernetes import client, config
        except ImportError:
            raise SchedulerActionError(
                "the Kubernetes client is not installed; pip install 'ranksight[kubernetes]'"
            ) from None
        if api_client is None:
            try:
                config.load_incluster_config()
            except config.ConfigException:
                try:
                    config.load_kube_config()
                except (config.ConfigException, OSError) as exc:
                    raise SchedulerActionError(
                        f"no Kubernetes configuration found ({exc}); set KUBECONFIG"
                    ) from None
            api_client = client.ApiClient()
        self._batch = client.BatchV1Api(api_client)
        self._core = client.CoreV1Api(api_client)
        self._namespace = namespace
        self._api_exception = client.ApiException

    def _call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except self._api_exception as exc:
            raise SchedulerActionError(
                f"the Kubernetes API refused to {what}: {exc.status} {exc.reason}"
            ) from None
        except OSError as exc:
            raise SchedulerActionError(f"the Kubernetes API does not answer ({what}): {exc}") from None

    def target(self, job_id: str, labels: Mapping[str, str]) -> str:
        """`namespace/name` of the Job: the job id itself, or the Job labelled with it."""
        if "/" in job_id:
            return job_id
        selector = f"{JOB_ID_LABEL}={job_id}"
        if self._namespace:
            jobs = self._call(
                "list Jobs", self._batch.list_namespaced_job, self._namespace, label_selector=selector
            )
        else:
            jobs = self._call("list Jobs", self._batch.list_job_for_all_namespaces, label_selector=selector)
        items = list(jobs.items)
        if len(items) != 1:
            raise SchedulerActionError(
                f"{len(items)} Kubernetes Jobs are labelled {selector}; expected exactly one"
            )
        return f"{items[0].metadata.namespace}/{items[0].metadata.name}"

    def describe(self, action: Action, target: str) -> str:
        """What would be done to the Job."""
        pods = f"delete the Pods of Job {target} (label job-name)"
        return f"suspend Job {target}, then {pods}" if action == "cancel" else pods

    def act(self, action: Action, target: str) -> str:
        """Suspend (cancel only) and delete the Job's Pods; names the Pods deleted."""
        namespace, _, name = target.partition("/")
        if action == "cancel":
            self._call(
                "suspend the Job",
                self._batch.patch_namespaced_job,
                name,
                namespace,
                {"spec": {"suspend": True}},
            )
        pods = self._call(
            "list the Job's Pods",
            self._core.list_namespaced_pod,
            namespace,
            label_selector=f"job-name={name}",
        )
        deleted = []
        for pod in pods.items:
            self._call("delete a Pod", self._core.delete_namespaced_pod, pod.metadata.name, namespace)
            deleted.append(pod.metadata.name)
        done = "suspended, " if action == "cancel" else ""
        return f"Job {target}: {done}deleted {len(deleted)} Pods ({', '.join(deleted) or 'none'})"
