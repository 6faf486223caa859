"""A real single-node Slurm (Debian's slurm-wlm + munge) on loopback, started for the session.

The fixture writes a minimal slurm.conf for `localhost`, starts munged on its own socket, then
slurmctld and slurmd as root, and waits until the node is idle. Where Slurm cannot start, the
tests fail with the reason when RANKSIGHT_REQUIRE_SLURM=1 (CI sets it) and skip otherwise.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

_BINARIES = ("munged", "slurmctld", "slurmd", "squeue", "sbatch", "scontrol", "sinfo")


def _unavailable(reason: str) -> None:
    if os.environ.get("RANKSIGHT_REQUIRE_SLURM") == "1":
        pytest.fail(f"a real Slurm is required here (RANKSIGHT_REQUIRE_SLURM=1) but {reason}", pytrace=False)
    pytest.skip(f"no local Slurm: {reason} (apt-get install slurm-wlm munge; run as root)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class SlurmCluster:
    """A running single-node Slurm: its config file and the environment its clients need."""

    root: Path
    conf: Path

    @property
    def env(self) -> dict[str, str]:
        """os.environ plus SLURM_CONF pointing at this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *argv: str) -> str:
        """Run a Slurm client command against this cluster; its stdout."""
        done = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=60, check=False)
        if done.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} failed: {done.stderr.strip()}")
        return done.stdout.strip()

    def sbatch(self, *args: str) -> str:
        """Submit a batch job; its job id."""
        return self.run("sbatch", "--parsable", f"--output={self.root}/job-%j.out", *args).split(";")[0]

    def logs(self) -> str:
        """The tail of every daemon log, for failure messages."""
        parts = []
        for log in sorted((self.root / "log").glob("*.log")):
            lines = log.read_text(errors="replace").splitlines()[-15:]
            parts.append(f"--- {log.name}\n" + "\n".join(lines))
        return "\n".join(parts)


def _conf(root: Path) -> str:
    return f"""ClusterName=ranksight
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={root}/munge/munge.socket
CredType=cred/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MinJobAge=600
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
MailProg=/bin/true
NodeName=localhost NodeAddr=127.0.0.1 CPUs=2 RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""


def _stop(pid_file: Path) -> None:
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """The session's Slurm: munged, slurmctld and slurmd on loopback; stopped at the end."""
    missing = [b for b in _BINARIES if shutil.which(b) is None and not Path("/usr/sbin", b).exists()]
    if missing:
        _unavailable(f"{', '.join(missing)} not installed")
    if os.geteuid() != 0:
        _unavailable("the daemons must run as root and this is not root")
    # A short path: munge's socket path must fit in sun_path (108 bytes).
    root = Path(tmp_path_factory.mktemp("slurm"))
    for sub in ("munge", "state", "spool", "log"):
        (root / sub).mkdir()
    (root / "munge").chmod(0o700)
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    conf = root / "slurm.conf"
    conf.write_text(_conf(root))
    cluster = SlurmCluster(root, conf)
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
        deadline = time.monotonic() + 90
        state = ""
        while time.monotonic() < deadline:
            done = subprocess.run(
                ["sinfo", "-h", "-n", "localhost", "-o", "%t"],
                env=cluster.env,
                capture_output=True,
                text=True,
                check=False,
            )
            state = done.stdout.strip()
            if state == "idle":
                break
            time.sleep(0.2)
        else:
            _unavailable(f"the node did not become idle within 90 s (state {state!r})\n{cluster.logs()}")
        yield cluster
    finally:
        subprocess.run(
            ["scancel", "--full", "--user=root"], env=cluster.env, capture_output=True, check=False
        )
        for pid_file in (root / "slurmd.pid", root / "slurmctld.pid", root / "munge" / "munged.pid"):
            _stop(pid_file)
