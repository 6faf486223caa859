"""Scheduler truth: job states from Slurm or Kubernetes, published as JobStateChanged.

A pending job has no training process, so pending, preemption, requeue, exit codes and queue
time come from the scheduler: a source polls it (`slurm.SlurmSource`, `kubernetes.KubernetesSource`),
`tracker.StateTracker` publishes each change once, `follow.follow` is the loop.
"""

from producers.scheduler.errors import SchedulerError, SchedulerUnavailableError, TeamMapError
from producers.scheduler.follow import follow, poll_once
from producers.scheduler.teams import TeamMap
from producers.scheduler.tracker import JobObservation, StateTracker

__all__ = [
    "JobObservation",
    "SchedulerError",
    "SchedulerUnavailableError",
    "StateTracker",
    "TeamMap",
    "TeamMapError",
    "follow",
    "poll_once",
]
