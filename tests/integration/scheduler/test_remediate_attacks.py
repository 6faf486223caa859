"""The attacks of issue 32 on `ranksight remediate --slurm --execute`, replayed against a real Slurm.

Each is made of records a training job may publish (JobStarted with its labels, training events)
and the alerts the worker would raise from them. Slurm runs someone else's job (account
`physics`, not opted in), the attacker's job and five more of the attacker's (account `research`,
opted in; the test's jobs all run as root, so the policy selects by Slurm account). One
remediate run reads everything; afterwards Slurm is asked what happened to each job:

- a JobStarted label `ranksight.dev/scheduler-job-id` naming the victim, its own opt-in label and a
  collective timeout of 0: remediate acts on the attacker's own job (the alert's job, as Slurm
  names it), never on the victim, and the rank_hang waits the operator's collective timeout;
- forged JobStarted/JobStateChanged for the victim's id (an opted-in team, the opt-in label,
  running): Slurm says the victim is an account `physics` job, not opted in: nothing is done;
- the victim's id with a trailing newline, or in Arabic-Indic digits: no Slurm command is run;
- five jobs claiming five made-up clusters against max_actions_per_hour 3: Slurm names one
  cluster, so 3 actions in all.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import yaml
from confluent_kafka import Producer

from schemas.codec import Codec
from schemas.records import Event
from schemas.topics import ACTIONS, ALERTS, TRAINING_EVENTS, key_for
from tests.integration.scheduler.conftest import SlurmCluster
from tests.integration.scheduler.test_remediate_slurm import _actions, _slurm_state, _wait_state, started_ms
from tests.unit.streams.builders import job_started, job_state

RANKSIGHT = str(Path(sys.executable).with_name("ranksight"))
CODEC = Codec()
ARABIC_INDIC = str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩")


def _alert(rule: str, job: str, ts: int, **kw: object) -> Event:
    return Event(
        "Alert",
        {
            "alert_id": f"{rule}-{job!r}-{ts}",
            "fingerprint": f"{rule}/{job!r}",
            "rule": rule,
            "category": "platform",
            "severity": "critical",
            "status": "firing",
            "ts": ts,
            "starts_at": ts,
            "ends_at": None,
            "team": "platform",
            "receiver": "platform-pager",
            "summary": f"{rule} on {job!r}",
            "owner": "",
            "job_id": job,
            "run_id": "",
            "model_version": "",
            "dataset_version": "",
            "workload_family": "",
            "cluster": str(kw.pop("cluster", "")),
            "invariant": "",
            "suspected_layer": "platform",
            "history_metric": "",
            "history": [],
            "runbook_url": f"docs/runbooks/{rule}",
            "labels": {},
            **kw,
        },
    )


def test_records_cannot_make_remediate_act_on_a_job_that_did_not_raise_the_alert(
    slurm: SlurmCluster, kafka_bootstrap: str, topics: dict[str, str], topic_prefix: str, tmp_path: Path
) -> None:
    share = ("--oversubscribe", "--cpus-per-task=1", "--wrap", "sleep 600")
    victim = slurm.sbatch("--account=physics", *share)
    attacker = slurm.sbatch("--account=research", *share)
    five = [slurm.sbatch("--account=research", *share) for _ in range(5)]
    jobs = [victim, attacker, *five]
    try:
        for job in jobs:
            _wait_state(slurm, job, "RUNNING")
        # Every record is stamped after Slurm started the jobs (an alert from before a run began
        # was not raised by it), and the alerts are in the past when remediate reads them.
        now = max(started_ms(slurm, job) for job in jobs) + 3000
        time.sleep(max(0.0, now / 1000 - time.time()))
        opted = {"ranksight.dev/remediate": "true"}
        events: list[Event] = [
            # The attacker's own job claims the victim as its scheduler job, opts itself in and
            # sets its collective timeout to 0.
            job_started(
                attacker,
                now - 2000,
                team="llm",
                checkpoint_max_age_s=None,
                labels={
                    "ranksight.dev/scheduler-job-id": victim,
                    "ranksight.dev/collective-timeout-s": "0",
                    **opted,
                },
            ),
            # Forged records for the victim's id: an opted-in team, the opt-in label, running.
            job_started(victim, now - 2000, team="llm", checkpoint_max_age_s=None, labels=opted),
            job_state(victim, now - 1500, "running"),
            # Ids that only look like the victim's.
            job_started(victim + "\n", now - 2000, team="llm", checkpoint_max_age_s=None, labels=opted),
            job_started(victim.translate(ARABIC_INDIC), now - 2000, team="llm", checkpoint_max_age_s=None),
        ]
        for i, job in enumerate(five):
            claim = job_started(job, now - 2000, team="llm", checkpoint_max_age_s=None)
            claim.record["cluster"] = f"made-up-{i}"
            events.append(claim)
        alerts = [
            _alert("rank_hang", attacker, now - 1000, rank=0),  # decided first: oldest
            _alert("zombie_job", attacker, now - 900),
            _alert("zombie_job", victim, now - 800),
            _alert("zombie_job", victim + "\n", now - 700),
            _alert("zombie_job", victim.translate(ARABIC_INDIC), now - 600),
            *(_alert("zombie_job", job, now - 500 + i, cluster=f"made-up-{i}") for i, job in enumerate(five)),
        ]
        producer = Producer({"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True})
        for event in [*events, *alerts]:
            canonical = ALERTS if event.type == "Alert" else TRAINING_EVENTS
            producer.produce(
                topics[canonical], key=key_for(canonical, event.record), value=CODEC.encode(event)
            )
        assert producer.flush(30) == 0

        policy = tmp_path / "policy.yaml"
        policy.write_text(
            yaml.safe_dump(
                {
                    "rules": {
                        "zombie_job": {"action": "cancel", "min_firing_s": 0},
                        "rank_hang": {"action": "requeue", "min_firing_s": 0, "collective_timeout_s": 600},
                    },
                    "opt_in": {"accounts": ["research"], "label": "ranksight.dev/remediate"},
                    "max_actions_per_hour": 3,
                    "job_cooldown_s": 3600,
                }
            )
        )
        done = subprocess.run(
            [RANKSIGHT, "remediate", "--policy", str(policy), "--slurm", "--execute", "--idle-exit", "4"],
            env={
                **slurm.env,
                "KAFKA_BOOTSTRAP": kafka_bootstrap,
                "RANKSIGHT_TOPIC_PREFIX": topic_prefix,
                "RANKSIGHT_HOME": str(tmp_path),
            },
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        decisions = _actions(kafka_bootstrap, topics[ACTIONS])
        acted = [r for r in decisions if r["decision"] == "acted"]
        # What Slurm says happened: the victim runs; three of the attacker's jobs were cancelled.
        assert _slurm_state(slurm, victim) == "RUNNING", done.stdout
        for record in acted:
            _wait_state(slurm, record["target"], "CANCELLED")
        states = Counter(_slurm_state(slurm, job) for job in [attacker, *five])
        assert states == Counter({"CANCELLED": 3, "RUNNING": 3}), (states, done.stdout)
        # Each action's target is the alert's own job, as Slurm names it, on Slurm's one cluster.
        assert len(acted) == 3 and all(r["target"] == r["job_id"] for r in acted), acted
        assert {r["cluster"] for r in acted} == {"ranksight"}
        assert acted[0]["job_id"] == attacker and acted[0]["detail"] == f"scancel {attacker}: ok"
        by_alert = {(r["rule"], r["job_id"]): r for r in decisions}
        hang = [r for r in decisions if r["rule"] == "rank_hang"]
        assert hang[0]["reason_code"] == "within_collective_timeout" and "(600 s)" in hang[0]["reason"]
        assert {r["decision"] for r in hang} == {"skipped"}  # later: the job was acted on (zombie)
        forged = by_alert[("zombie_job", victim)]
        assert forged["reason_code"] == "not_opted_in" and "account physics" in forged["reason"]
        for fake in (victim + "\n", victim.translate(ARABIC_INDIC)):
            record = by_alert[("zombie_job", fake)]
            assert (
                record["reason_code"] == "scheduler_refused" and "is not a Slurm job id" in record["reason"]
            )
        limited = [r for r in decisions if r["reason_code"] == "rate_limited"]
        assert len(limited) == 3 and all("cluster ranksight" in r["reason"] for r in limited)
    finally:
        slurm.run("scancel", *jobs)
