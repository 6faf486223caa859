"""deploy/slurm's prolog and epilog bind a job's GPUs for the agent, in a real Slurm (issue 36.3).

A Slurm of its own (the session one has no prolog): the same single node on loopback, with two
GPUs declared as generic resources (device files that are plain files: no GPU here) and
deploy/slurm/prolog.sh and epilog.sh as Prolog and Epilog. A job that asks for one GPU runs; while it
runs, the node agent's attribution (`producers.agent.attribution.Attributor`, reading bindings like
the agent does) names the job for that GPU's UUID and no job for the other, with no process of
the job on the GPU; after the job, the bindings and their holder process are gone.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from producers.agent.attribution import Attributor
from tests.integration.scheduler.conftest import _BINARIES, SlurmCluster, _conf, _stop, _unavailable

ROOT = Path(__file__).resolve().parents[3]
UUIDS = {0: "GPU-00000000-1111-2222-3333-444444444444", 1: "GPU-55555555-6666-7777-8888-999999999999"}


def _wait(what: str, check, timeout: float = 60.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def slurm_with_prolog(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SlurmCluster, Path]]:
    """A Slurm whose slurmd runs deploy/slurm's prolog and epilog, with two (fake) GPUs; its runtime dir."""
    missing = [b for b in _BINARIES if shutil.which(b) is None and not Path("/usr/sbin", b).exists()]
    if missing:
        _unavailable(f"{', '.join(missing)} not installed")
    if os.geteuid() != 0:
        _unavailable("the daemons must run as root and this is not root")
    root = Path(tmp_path_factory.mktemp("slurmp"))
    for sub in ("munge", "state", "spool", "log", "dev", "runtime"):
        (root / sub).mkdir()
    (root / "munge").chmod(0o700)
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    for index in UUIDS:  # slurmd wants character devices: links to /dev/null stand in for GPUs
        (root / "dev" / f"nvidia{index}").symlink_to("/dev/null")
    (root / "gpus.csv").write_text("".join(f"{i}, {u}\n" for i, u in UUIDS.items()))
    # slurmd runs the prolog with a bare environment: the wrappers point it at this test's files.
    env = root / "slurm.env"
    env.write_text(f"RANKSIGHT_RUNTIME_DIR={root}/runtime\nRANKSIGHT_GPU_UUIDS={root}/gpus.csv\n")
    for script in ("prolog", "epilog"):
        wrapper = root / f"{script}.sh"
        wrapper.write_text(
            f"#!/bin/sh\nenv > {root}/log/{script}-env.txt\n"
            f"RANKSIGHT_SLURM_ENV={env} exec {ROOT}/deploy/slurm/{script}.sh\n"
        )
        wrapper.chmod(0o755)
    conf = _conf(root).replace("State=UNKNOWN", "Gres=gpu:2 State=UNKNOWN")
    conf += f"GresTypes=gpu\nProlog={root}/prolog.sh\nEpilog={root}/epilog.sh\n"
    (root / "slurm.conf").write_text(conf)
    (root / "gres.conf").write_text(f"NodeName=localhost Name=gpu File={root}/dev/nvidia[0-1]\n")
    cluster = SlurmCluster(root, root / "slurm.conf")
    sbin = lambda name: shutil.which(name) or f"/usr/sbin/{name}"  # noqa: E731
    commands = [
        [sbin("munged"), f"--socket={root}/munge/munge.socket", f"--key-file={key}",
         f"--pid-file={root}/munge/munged.pid", f"--log-file={root}/log/munged.log",
         f"--seed-file={root}/munge/seed", "--force"],
        [sbin("slurmctld"), "-i"],
        [sbin("slurmd"), "-N", "localhost"],
    ]  # fmt: skip
    try:
        for argv in commands:
            done = subprocess.run(
                argv, env=cluster.env, capture_output=True, text=True, timeout=60, check=False
            )
            if done.returncode != 0:
                _unavailable(
                    f"`{' '.join(argv)}` exited {done.returncode}: {done.stderr.strip()}\n{cluster.logs()}"
                )

        def idle() -> bool:
            done = subprocess.run(
                ["sinfo", "-h", "-n", "localhost", "-o", "%t"],
                env=cluster.env,
                capture_output=True,
                text=True,
            )
            return done.stdout.strip() == "idle"

        try:
            _wait("the node to become idle", idle, 90)
        except AssertionError:
            _unavailable(f"the node did not become idle within 90 s\n{cluster.logs()}")
        yield cluster, root / "runtime"
    finally:
        subprocess.run(
            ["scancel", "--full", "--user=root"], env=cluster.env, capture_output=True, check=False
        )
        for pid_file in (root / "slurmd.pid", root / "slurmctld.pid", root / "munge" / "munged.pid"):
            _stop(pid_file)


def test_prolog_binds_the_jobs_gpu_and_epilog_unbinds_it(
    slurm_with_prolog: tuple[SlurmCluster, Path],
) -> None:
    """While a one-GPU job runs, its GPU is attributed to it (no process on the GPU); after it, nothing is."""
    cluster, runtime = slurm_with_prolog
    bindings = runtime / "bindings"
    release = cluster.root / "release"
    job = cluster.sbatch("--gres=gpu:1", "--wrap", f"while [ ! -e {release} ]; do sleep 0.2; done")
    try:
        files = _wait("the prolog's binding", lambda: sorted(bindings.glob(f"slurm-{job}-gpu*.json")))
    except AssertionError:
        prolog_env = cluster.root / "log" / "prolog-env.txt"
        seen = prolog_env.read_text() if prolog_env.exists() else "(the prolog did not run)"
        raise AssertionError(
            f"no binding for job {job}; prolog environment:\n{seen}\n{cluster.logs()}"
        ) from None
    assert len(files) == 1, files
    attributor = Attributor(bindings=[bindings])
    answer = attributor.refresh([(uuid, []) for uuid in UUIDS.values()])
    held = [uuid for uuid, ref in answer.items() if ref.job_id == job]
    assert len(held) == 1 and answer[held[0]].run_id == "" and answer[held[0]].source == "sdk", answer
    assert len(answer) == 1, "the GPU the job does not hold stays unattributed"
    holder = int((bindings / f".slurm-{job}.holder").read_text())
    release.touch()
    _wait("the epilog", lambda: not list(bindings.glob(f"slurm-{job}-*.json")))
    _wait("the holder to end", lambda: not Path(f"/proc/{holder}").exists() or _zombie(holder))
    assert Attributor(bindings=[bindings]).refresh([(uuid, []) for uuid in UUIDS.values()]) == {}


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True
