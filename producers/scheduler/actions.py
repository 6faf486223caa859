"""Acting on a job through its scheduler: look it up, then cancel or requeue it (Slurm), or suspend
the Job and delete its Pods (Kubernetes).

`ranksight remediate` decides *whether* (streams.alerting.remediation); these adapters read the job
from the scheduler itself, name it the way the scheduler does, do what they are told and say what
the scheduler answered. Nothing here reads a Kafka record: a record's job id is only the question
asked of the scheduler, and what comes back is what is acted on (docs/security.md).

- Slurm: the ranksight job id must be the Slurm job id (the SDK uses SLURM_JOB_ID): ASCII digits,
  `123` or an array task `123_4`, nothing else. `lookup` reads it with `squeue --json --jobs`,
  keeps only the entry whose id is exactly that one, and reports Slurm's user, account, cluster,
  state and start time. `cancel` is `scancel <id>`, `requeue` is `scontrol requeue <id>`.
- Kubernetes: only in the namespaces the operator named. The job id is `<namespace>/<name>` of a
  batch/v1 Job, or the value of the Job's `ranksight.dev/job-id` label, looked up in those
  namespaces only. `requeue` deletes the Job's Pods (its controller creates new ones, a retry
  within `backoffLimit`); `cancel` first suspends the Job (`spec.suspend: true`: no new Pods,
  and it can be resumed), then deletes its Pods.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from producers.scheduler.errors import SchedulerError
from producers.scheduler.kubernetes import JOB_ID_LABEL, observation_from_job

__all__ = [
    "KubernetesActions",
    "SchedulerActionError",
    "SchedulerActions",
    "SchedulerJob",
    "SlurmActions",
    "slurm_job_id",
]

Action = Literal["cancel", "requeue"]
# Only what Slurm itself makes: ASCII digits, an array task after `_`. `fullmatch` (not `$`, which
# also matches before a trailing newline) and ASCII (`\d` would take Arabic-Indic digits).
_SLURM_ID = re.compile(r"[0-9]+(?:_[0-9]+)?", re.ASCII)
# A label value (RFC 1123 label rules): anything else could change a label selector's meaning.
_LABEL_VALUE = re.compile(r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?", re.ASCII)
# A namespace or Job name (DNS-1123 subdomain): what the API could have named.
_K8S_NAME = re.compile(r"[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?", re.ASCII)


class SchedulerActionError(SchedulerError):
    """The scheduler refused an action or a look-up, or the job cannot be named to it."""


@dataclass(frozen=True)
class SchedulerJob:
    """One job as its scheduler reports it now: what remediation checks, and the target it acts on."""

    job_id: str  # the ranksight job id this scheduler job answers to (its id, or its job-id label)
    target: str  # how the scheduler names it: a Slurm id, `namespace/name`
    state: str  # a ranksight JobState symbol (`running`, `pending`, ...)
    native_state: str  # the scheduler's own word
    user: str | None = None  # Slurm user; Kubernetes: the Job's ranksight.dev/owner label
    account: str | None = None  # Slurm account; Kubernetes: the namespace
    cluster: str = ""  # Slurm's cluster name; Kubernetes: the operator's --cluster
    start_ts: int | None = None  # ms; when this run started
    labels: Mapping[str, str] = field(default_factory=dict)  # Kubernetes: the Job's labels


def slurm_job_id(job_id: str) -> str:
    """The Slurm job id a ranksight job id is; raises `SchedulerActionError` for anything Slurm could not have made."""
    if not isinstance(job_id, str) or not _SLURM_ID.fullmatch(job_id):
        raise SchedulerActionError(
            f"job {job_id!r} is not a Slurm job id: remediate acts on Slurm jobs whose ranksight job id "
            "is their SLURM_JOB_ID (digits, or 123_4 for an array task)"
        )
    return job_id


class SchedulerActions(Protocol):
    """What `ranksight remediate` needs from a scheduler."""

    name: str

    def lookup(self, job_id: str) -> SchedulerJob | None:
        """The scheduler's job for a ranksight job id (None: it lists none); raises `SchedulerActionError`
        when the id cannot name a job here or the scheduler does not answer."""
        ...

    def describe(self, action: Action, job: SchedulerJob) -> str:
        """What `act` would do, in words (dry runs record it)."""
        ...

    def act(self, action: Action, job: SchedulerJob) -> str:
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
    return done.stdout


def _last_line(out: str) -> str:
    return (out.strip() or "ok").splitlines()[-1]


class SlurmActions:
    """`squeue --json` to look a job up; `scancel` and `scontrol requeue` to act."""

    name = "slurm"

    def __init__(self, *, runner: Runner = _run) -> None:
        self._runner = runner

    def lookup(self, job_id: str) -> SchedulerJob | None:
        """The Slurm job whose id is exactly `job_id`, as slurmctld reports it; None when it lists none."""
        import json

        from producers.scheduler.slurm import observation_from_slurm

        target = slurm_job_id(job_id)
        try:
            text = self._runner(["squeue", "--json", "--jobs", target])
        except SchedulerActionError as exc:
            if "Invalid job id" in str(exc):
                return None  # purged, or never existed
            raise
        try:
            entries = json.loads(text).get("jobs") or []
        except (json.JSONDecodeError, AttributeError):
            raise SchedulerActionError(
                "`squeue --json` did not print JSON; is this Slurm 21.08 or newer?"
            ) from None
        # `squeue --json --jobs` of Slurm 22.05 ignores --jobs (it lists every job): keep the one job
        # whose own id is the one asked for, and nothing that merely resembles it.
        matches = [entry for entry in entries if isinstance(entry, dict) and target in _slurm_names(entry)]
        if not matches:
            return None
        if len(matches) > 1:
            raise SchedulerActionError(f"squeue lists {len(matches)} jobs with id {target}; expected one")
        entry = matches[0]
        obs = observation_from_slurm(entry)
        if obs is None:
            return SchedulerJob(target, target, "unknown", str(entry.get("job_state") or ""))
        return SchedulerJob(
            job_id=target,
            target=target,
            state=obs.state,
            native_state=obs.native_state,
            user=obs.owner,
            account=obs.account,
            cluster=obs.cluster or "",
            start_ts=obs.start_ts,
        )

    def _argv(self, action: Action, target: str) -> list[str]:
        target = slurm_job_id(target)  # again, right before the command line
        return ["scancel", target] if action == "cancel" else ["scontrol", "requeue", target]

    def describe(self, action: Action, job: SchedulerJob) -> str:
        """The command that would run."""
        return " ".join(self._argv(action, job.target))

    def act(self, action: Action, job: SchedulerJob) -> str:
        """Run the command; its output ("ok" when silent, as scancel is)."""
        out = self._runner(self._argv(action, job.target))
        return f"{self.describe(action, job)}: {_last_line(out)}"


def _slurm_names(entry: Mapping[str, Any]) -> set[str]:
    """The ids Slurm answers to for one squeue entry: its job id, and `<array job>_<task>` for an array task."""

    def number(value: Any) -> int | None:
        if isinstance(value, dict):  # 23.02+: {"set": .., "number": ..}
            value = value.get("number") if value.get("set", True) else None
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    names = set()
    job, array_job = number(entry.get("job_id")), number(entry.get("array_job_id"))
    task = number(entry.get("array_task_id"))
    if job is not None:
        names.add(str(job))
    if array_job and task is not None and task < 4294967294:  # NO_VAL and the like: not a task
        names.add(f"{array_job}_{task}")
    return names


class KubernetesActions:
    """Look up a batch/v1 Job in the configured namespaces; suspend it and delete its Pods."""

    name = "kubernetes"

    def __init__(self, *, namespaces: Sequence[str], cluster: str = "", api_client: Any = None) -> None:
        try:
            from kubernetes import client, config
        except ImportError:
            raise SchedulerActionError(
                "the Kubernetes client is not installed; pip install 'ranksight[kubernetes]'"
            ) from None
        if not namespaces:
            raise SchedulerActionError("name the namespaces remediate may act in (--namespace, repeatable)")
        for ns in namespaces:
            if not _K8S_NAME.fullmatch(ns):
                raise SchedulerActionError(f"{ns!r} is not a Kubernetes namespace name")
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
        self.namespaces = tuple(namespaces)
        self._cluster = cluster
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

    def _inside(self, namespace: str, job_id: str) -> None:
        if namespace not in self.namespaces:
            raise SchedulerActionError(
                f"job {job_id!r} is in namespace {namespace!r}; remediate acts only in "
                f"{', '.join(self.namespaces)} (--namespace)"
            )

    def lookup(self, job_id: str) -> SchedulerJob | None:
        """The Job named `namespace/name`, or labelled `ranksight.dev/job-id=<job id>`, in the configured namespaces."""
        if "/" in job_id:
            namespace, _, name = job_id.partition("/")
            self._inside(namespace, job_id)
            if not _K8S_NAME.fullmatch(name):
                raise SchedulerActionError(f"job {job_id!r} does not name a Kubernetes Job")
            found = self._call(
                "list Jobs",
                self._batch.list_namespaced_job,
                namespace,
                field_selector=f"metadata.name={name}",
            )
            jobs = [j for j in found.items if j.metadata.name == name and j.metadata.namespace == namespace]
        else:
            if not _LABEL_VALUE.fullmatch(job_id) or len(job_id) > 63:
                raise SchedulerActionError(
                    f"job {job_id!r} cannot be a {JOB_ID_LABEL} label value: no Kubernetes Job is labelled with it"
                )
            selector = f"{JOB_ID_LABEL}={job_id}"
            jobs = []
            for namespace in self.namespaces:
                found = self._call(
                    "list Jobs", self._batch.list_namespaced_job, namespace, label_selector=selector
                )
                jobs += [
                    j
                    for j in found.items
                    if j.metadata.namespace == namespace
                    and (j.metadata.labels or {}).get(JOB_ID_LABEL) == job_id
                ]
        if not jobs:
            return None
        if len(jobs) > 1:
            names = ", ".join(f"{j.metadata.namespace}/{j.metadata.name}" for j in jobs)
            raise SchedulerActionError(
                f"{len(jobs)} Kubernetes Jobs answer to job {job_id!r} ({names}); expected one"
            )
        job = jobs[0]
        namespace, name = job.metadata.namespace, job.metadata.name
        pods = self._call(
            "list the Job's Pods",
            self._core.list_namespaced_pod,
            namespace,
            label_selector=f"job-name={name}",
        )
        obs = observation_from_job(job, list(pods.items))
        return SchedulerJob(
            job_id=obs.job_id,  # its label, else namespace/name: what it answers to
            target=f"{namespace}/{name}",
            state=obs.state,
            native_state=obs.native_state,
            user=obs.owner,
            account=namespace,
            cluster=self._cluster,  # never the Job's own label: rate limits are keyed on it
            start_ts=obs.start_ts,
            labels=dict(job.metadata.labels or {}),
        )

    def describe(self, action: Action, job: SchedulerJob) -> str:
        """What would be done to the Job."""
        pods = f"delete the Pods of Job {job.target} (label job-name)"
        return f"suspend Job {job.target}, then {pods}" if action == "cancel" else pods

    def act(self, action: Action, job: SchedulerJob) -> str:
        """Suspend (cancel only) and delete the Job's Pods; names the Pods deleted."""
        namespace, _, name = job.target.partition("/")
        self._inside(namespace, job.job_id)  # again, right before the writes
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
        return f"Job {job.target}: {done}deleted {len(deleted)} Pods ({', '.join(deleted) or 'none'})"
