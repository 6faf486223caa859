"""A restore test as a scheduler job: a Slurm batch script or a Kubernetes Job that restores a
checkpoint with the team's own command and reports the verdict as a RestoreTest record.

`ranksight checkpoint restore-job` renders one (issue 35.4): run it on a timer (a cron'd `sbatch`,
a Kubernetes CronJob around the Job's template) and whenever `restore_test_stale` says the job's
code, runtime, configuration or checkpoint format changed since its last passing test. The
rendered job runs the restore command; its exit status is the verdict, and `ranksight checkpoint
restore-test` publishes it with the identity the test ran with, so the detector can tell that
this restore proves the current job restorable.

Every value is quoted for the shell (`shlex.quote`) and the Job is YAML written by a YAML writer:
a job id or a command cannot break out of the script or the manifest.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import Any

import yaml

from producers.errors import ProducerError

__all__ = ["RestoreJob", "kubernetes_job", "slurm_script"]

_K8S_NAME = re.compile(r"[^a-z0-9-]+")


@dataclass(frozen=True)
class RestoreJob:
    """What to restore, how, and with which identity the result is reported."""

    job_id: str
    checkpoint_id: str
    command: str  # the team's restore-and-resume command, run by a shell
    restored: str = "model,optimizer,scheduler,data"
    steps_resumed: int = 10
    code_version: str = ""
    runtime_version: str = ""
    config_hash: str = ""
    checkpoint_format: str = ""
    env: dict[str, str] = field(default_factory=dict)  # e.g. KAFKA_BOOTSTRAP for the report
    to: str = "kafka"  # where the verdict goes: Kafka (KAFKA_BOOTSTRAP), or file:///path.avro

    def __post_init__(self) -> None:
        if not self.job_id or not self.checkpoint_id or not self.command.strip():
            raise ProducerError("a restore job needs --job, --checkpoint and --command")
        for name in self.env:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise ProducerError(f"environment variable name {name!r} is not valid")

    def report_argv(self, verdict: str) -> list[str]:
        """`ranksight checkpoint restore-test ...` with this job's identity and a verdict flag."""
        argv = [
            "ranksight",
            "checkpoint",
            "restore-test",
            "--job",
            self.job_id,
            "--checkpoint",
            self.checkpoint_id,
            "--restored",
            self.restored,
            "--steps-resumed",
            str(self.steps_resumed),
            "--to",
            self.to,
            verdict,
        ]
        for flag, value in (
            ("--code-version", self.code_version),
            ("--runtime-version", self.runtime_version),
            ("--config-hash", self.config_hash),
            ("--checkpoint-format", self.checkpoint_format),
        ):
            if value:
                argv += [flag, value]
        return argv

    def shell(self) -> str:
        """The script body: run the restore command, then report passed or failed with its status."""
        passed = shlex.join(self.report_argv("--passed"))
        failed = shlex.join([*self.report_argv("--failed"), "--error"])
        return "\n".join(
            [
                "set -u",
                *(f"export {k}={shlex.quote(v)}" for k, v in sorted(self.env.items())),
                f"if sh -c {shlex.quote(self.command)}; then",
                f"  exec {passed}",
                "else",
                "  status=$?",
                f'  exec {failed} "restore command exited with status $status"',
                "fi",
                "",
            ]
        )


def slurm_script(job: RestoreJob, *, partition: str = "", time_limit: str = "01:00:00", gpus: int = 1) -> str:
    """A Slurm batch script (`sbatch` it) that runs the restore test and reports its verdict."""
    name = _K8S_NAME.sub("-", f"restore-test-{job.job_id}".lower())[:60].strip("-")
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={name}",
        f"#SBATCH --time={shlex.quote(time_limit)}",
    ]
    if gpus:
        lines.append(f"#SBATCH --gpus={int(gpus)}")
    if partition:
        lines.append(f"#SBATCH --partition={shlex.quote(partition)}")
    lines.append("# Rendered by `ranksight checkpoint restore-job --slurm` (docs/acceptance.md).")
    return "\n".join(lines) + "\n" + job.shell()


def kubernetes_job(
    job: RestoreJob, *, image: str, namespace: str = "default", gpus: int = 1, service_account: str = ""
) -> str:
    """A Kubernetes Job manifest (`kubectl apply -f`) that runs the restore test and reports its verdict."""
    if not image:
        raise ProducerError("a Kubernetes restore job needs --image (the training image)")
    name = _K8S_NAME.sub("-", f"restore-test-{job.job_id}-{job.checkpoint_id}".lower())[:63].strip("-")
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [
            {
                "name": "restore-test",
                "image": image,
                "command": ["/bin/sh", "-c", job.shell()],
                "resources": {"limits": {"nvidia.com/gpu": int(gpus)}} if gpus else {},
            }
        ],
    }
    if service_account:
        spec["serviceAccountName"] = service_account
    manifest = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name or "restore-test",
            "namespace": namespace,
            "labels": {"app.kubernetes.io/name": "ranksight-restore-test"},
        },
        "spec": {"backoffLimit": 0, "ttlSecondsAfterFinished": 86400, "template": {"spec": spec}},
    }
    return yaml.safe_dump(manifest, sort_keys=False)
