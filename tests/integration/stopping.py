"""Start a `ranksight` command as scripts do, wait for its readiness line, signal it, time its stop.

`cmd &` in a non-interactive shell (and nohup) starts a program with SIGINT ignored; Python then
never raises KeyboardInterrupt. `Running.start(..., ignore_sigint=True)` reproduces that with a
`preexec_fn`, so a command that relies on KeyboardInterrupt is caught ignoring Ctrl-C.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["RANKSIGHT", "Running", "Stopped"]

RANKSIGHT = str(Path(sys.executable).with_name("ranksight"))


@dataclass(frozen=True)
class Stopped:
    """How a signalled command ended: exit status, seconds from the signal to its exit, its output."""

    code: int
    seconds: float
    output: str


class Running:
    """One command started for a stop test; its stdout and stderr go to one log file."""

    def __init__(self, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.proc = proc
        self.log = log

    @classmethod
    def start(cls, args: list[str], *, env: dict[str, str], log: Path, ignore_sigint: bool) -> Running:
        """Start `ranksight ARGS` with SIGINT ignored (as `cmd &` does) or with the default disposition."""

        def preexec() -> None:
            signal.signal(signal.SIGINT, signal.SIG_IGN if ignore_sigint else signal.SIG_DFL)

        with log.open("wb") as out:
            proc = subprocess.Popen(
                [RANKSIGHT, *args],
                env={**os.environ, **env},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=preexec,
                cwd=log.parent,
            )
        return cls(proc, log)

    def output(self) -> str:
        """Everything the command printed so far."""
        return self.log.read_text(errors="replace")

    def wait_for(self, pattern: str, timeout: float = 180.0) -> re.Match[str]:
        """Block until the output matches `pattern` (a regex); fail when the command exits first."""
        deadline = time.monotonic() + timeout
        compiled = re.compile(pattern, re.MULTILINE)
        while True:
            found = compiled.search(self.output())
            if found is not None:
                return found
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"exited ({self.proc.returncode}) before printing {pattern!r}:\n{self.output()[-4000:]}"
                )
            if time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"no {pattern!r} within {timeout:.0f} s:\n{self.output()[-4000:]}")
            time.sleep(0.05)

    def stop(self, sig: signal.Signals, timeout: float = 30.0) -> Stopped:
        """Send `sig` and wait for the exit (a generous `timeout`: the caller judges the seconds)."""
        began = time.monotonic()
        self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"still running {timeout:.0f} s after {sig.name}:\n{self.output()[-4000:]}"
            ) from None
        return Stopped(code, time.monotonic() - began, self.output())

    def kill(self) -> None:
        """SIGKILL the command (cleanup of a failed test)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)
