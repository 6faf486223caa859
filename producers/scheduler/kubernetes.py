"""Kubernetes as a source of job states: batch/v1 Jobs and their Pods, through the official client.

Install with `pip install 'ranksight[kubernetes]'`. Each poll lists the Jobs (one namespace or
all, optionally by label selector) and their Pods, and maps them:

- a suspended Job (how Kueue queues one) or one whose Pods are all unscheduled: `pending`;
- a Pod running: `running`; a Pod evicted for preemption with none running: `preempted`;
- condition `Complete`: `completed`; condition `Failed` (e.g. BackoffLimitExceeded): `failed`,
  with the exit code of the last terminated container.

Restarts are Pod attempts after the first plus container restarts. Queue time starts
at the Job's creation. The job id is the `ranksight.dev/job-id` label (set the same value as
RANKSIGHT_JOB_ID in the Pods) or else `<namespace>/<name>`; the owner is the
`ranksight.dev/owner` label; the namespace is the account the team map looks up.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from producers.scheduler.errors import SchedulerUnavailableError
from producers.scheduler.tracker import JobObservation

__all__ = ["CLUSTER_LABEL", "JOB_ID_LABEL", "OWNER_LABEL", "KubernetesSource", "observation_from_job"]

JOB_ID_LABEL = "ranksight.dev/job-id"
OWNER_LABEL = "ranksight.dev/owner"
# The API has no cluster name: a Job may carry it as a label, else `ranksight scheduler --cluster`.
CLUSTER_LABEL = "ranksight.dev/cluster"
_PREEMPTION_REASONS = frozenset(
    {"PreemptionByScheduler", "PreemptionByKubeScheduler", "EvictionByEvictionAPI", "TerminationByKubelet"}
)


def _ms(value: datetime | None) -> int | None:
    return int(value.timestamp() * 1000) if value is not None else None


def _condition(obj: Any, kind: str) -> Any:
    for cond in getattr(obj.status, "conditions", None) or []:
        if cond.type == kind and cond.status == "True":
            return cond
    return None


def _last_exit_code(pods: Sequence[Any]) -> int | None:
    latest: tuple[datetime, int] | None = None
    for pod in pods:
        for cs in pod.status.container_statuses or []:
            for st in (cs.state, cs.last_state):
                term: Any = getattr(st, "terminated", None) if st is not None else None
                finished = getattr(term, "finished_at", None)
                if finished is not None and (latest is None or finished > latest[0]):
                    latest = (finished, int(term.exit_code))
    return latest[1] if latest else None


def observation_from_job(job: Any, pods: Sequence[Any]) -> JobObservation:
    """A ranksight observation of one V1Job and its V1Pods."""
    meta = job.metadata
    labels = meta.labels or {}
    job_id = labels.get(JOB_ID_LABEL) or f"{meta.namespace}/{meta.name}"
    status = job.status
    # Attempts beyond the first are restarts: Pods the controller created (or, once they are
    # garbage-collected, the failed count, whose last failure ended a failed Job without a retry).
    failed_pods = int(status.failed or 0) - (1 if _condition(job, "Failed") is not None else 0)
    retries = max(len(pods) - 1, failed_pods, 0)
    container_restarts = sum(
        cs.restart_count or 0 for p in pods for cs in (p.status.container_statuses or [])
    )
    running = [p for p in pods if p.status.phase == "Running"]
    preempted = [
        p
        for p in pods
        if (getattr(p.status, "reason", None) == "Preempting")
        or any(
            c.type == "DisruptionTarget" and c.status == "True" and c.reason in _PREEMPTION_REASONS
            for c in (p.status.conditions or [])
        )
    ]
    complete, failed = _condition(job, "Complete"), _condition(job, "Failed")
    start_ts = min(
        (int(p.status.start_time.timestamp() * 1000) for p in running if p.status.start_time), default=None
    )
    end_ts = None
    if complete is not None or failed is not None:
        cond = complete or failed
        state, native, reason = ("completed" if complete else "failed"), cond.type, cond.reason
        end_ts = _ms(status.completion_time) or _ms(cond.last_transition_time)
    elif running:
        state, native, reason = "running", "Running", None
    elif preempted:
        state, native, reason = "preempted", "DisruptionTarget", "preempted by the scheduler"
        end_ts = max(
            (_ms(c.last_transition_time) or 0 for p in preempted for c in p.status.conditions or []),
            default=None,
        )
    else:
        state, native = "pending", "Suspended" if job.spec.suspend else "Pending"
        reasons = [
            c.reason
            for p in pods
            for c in (p.status.conditions or [])
            if c.type == "PodScheduled" and c.reason
        ]
        reason = reasons[0] if reasons else ("queued (suspended)" if job.spec.suspend else None)
    return JobObservation(
        job_id=job_id,
        state=state,
        native_state=native,
        reason=reason,
        exit_code=_last_exit_code(pods) if state in ("failed", "completed", "preempted") else None,
        restart_count=retries + container_restarts,
        owner=labels.get(OWNER_LABEL),
        account=meta.namespace,
        submit_ts=_ms(meta.creation_timestamp),
        start_ts=start_ts,
        end_ts=end_ts,
        cluster=labels.get(CLUSTER_LABEL) or None,
    )


class KubernetesSource:
    """Polls batch/v1 Jobs and their Pods in one namespace (or all) through the official client."""

    name = "kubernetes"

    def __init__(
        self,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        api_client: Any = None,
    ) -> None:
        try:
            from kubernetes import client, config
        except ImportError:
            raise SchedulerUnavailableError(
                "the Kubernetes client is not installed; pip install 'ranksight[kubernetes]'"
            ) from None
        if api_client is None:
            try:
                config.load_incluster_config()
            except config.ConfigException:
                try:
                    config.load_kube_config()
                except (config.ConfigException, OSError) as exc:
                    raise SchedulerUnavailableError(
                        f"no Kubernetes configuration found ({exc}); set KUBECONFIG"
                    ) from None
            api_client = client.ApiClient()
        self._batch = client.BatchV1Api(api_client)
        self._core = client.CoreV1Api(api_client)
        self._namespace = namespace
        self._selector = label_selector or ""
        self._api_exception = client.ApiException

    def _list(self, namespaced: Any, everywhere: Any, **kwargs: Any) -> list[Any]:
        try:
            if self._namespace:
                return list(namespaced(self._namespace, **kwargs).items)
            return list(everywhere(**kwargs).items)
        except self._api_exception as exc:
            raise SchedulerUnavailableError(
                f"the Kubernetes API refused the request: {exc.status} {exc.reason}"
            ) from None
        except OSError as exc:  # urllib3 connection errors derive from OSError
            raise SchedulerUnavailableError(f"the Kubernetes API does not answer: {exc}") from None

    def poll(self) -> list[JobObservation]:
        """Every Job listed now, with its Pods."""
        jobs = self._list(
            self._batch.list_namespaced_job,
            self._batch.list_job_for_all_namespaces,
            label_selector=self._selector,
        )
        selector = ",".join(s for s in (self._selector, "job-name") if s)
        pods = self._list(
            self._core.list_namespaced_pod, self._core.list_pod_for_all_namespaces, label_selector=selector
        )
        by_job: dict[tuple[str, str], list[Any]] = {}
        for pod in pods:
            name = (pod.metadata.labels or {}).get("job-name")
            if name:
                by_job.setdefault((pod.metadata.namespace, name), []).append(pod)
        return [
            observation_from_job(job, by_job.get((job.metadata.namespace, job.metadata.name), []))
            for job in sorted(jobs, key=lambda j: (j.metadata.namespace, j.metadata.name))
        ]

    def lookup(self, job_ids: list[str]) -> list[JobObservation]:
        """A deleted Job leaves no trace to look up."""
        return []
