"""SIGINT and SIGTERM stop every long-running command gracefully, whatever disposition it inherited.

A process started the way scripts and supervisors start programs (`cmd &` in a non-interactive
shell, `nohup`) inherits SIGINT *ignored*, and Python then never raises KeyboardInterrupt: a
command that relied on it could not be stopped with Ctrl-C or `kill -INT`, and one without a
SIGTERM handler was killed outright (exit -15, nothing flushed). Every long-running command
therefore sets its own handlers with `stop_signals(...)`, which replaces whatever it inherited:

    with stop_signals(on_stop=consumer_stop_event.set) as stop:
        run_until(stop)          # the loop ends when stop.requested; flush within stop.remaining()

- The first SIGINT or SIGTERM calls `on_stop` (it must return at once: set an event, ask a loop
  to end) and starts the stop budget: the command finishes within `grace_s` (5 s), sizing its
  flushes with `remaining()`. Loops that sleep use `stop.sleep(s)`, which returns early and raises
  `StopRequested` once a stop was asked for; `stop.check()` raises it between units of work.
- A second signal exits at once (status 128 + signal number), as does a stop still running
  `hard_after_s` (10 s) after the first signal: a wedged flush never keeps a process alive.
- Leaving the `with` block restores the previous handlers (commands run in-process in tests).

`StopRequested` is a KeyboardInterrupt, so code written for Ctrl-C (an `except KeyboardInterrupt`
around `serve_forever`) handles it unchanged: `interrupt=True` raises it from the handler in the
main thread, for a loop that has no stop flag, now also under SIGTERM and an inherited SIG_IGN.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

__all__ = [
    "HARD_EXIT_S",
    "STOP_GRACE_S",
    "StopRequested",
    "StopSignals",
    "install_stop_handlers",
    "run_main",
    "stop_signals",
]

# How long a command may take from the first signal to its exit, flushing included (issue 21.4).
STOP_GRACE_S = 5.0
# A stop still running this long after the first signal ends the process without further flushing.
HARD_EXIT_S = 10.0

_SIGNALS = (signal.SIGINT, signal.SIGTERM)

OnStop = Callable[[], Any]


class StopRequested(KeyboardInterrupt):
    """A stop was asked for (SIGINT or SIGTERM); raised where the command can stop cleanly."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(signal.Signals(signum).name)


def _say(text: str) -> None:
    # os.write, not print or rich: the handler may run while the main thread is inside a write to
    # stderr, and a buffered stream would raise "reentrant call" there.
    with contextlib.suppress(OSError):
        os.write(2, (text + "\n").encode(errors="replace"))


class StopSignals:
    """The SIGINT/SIGTERM handlers of one command: what the first signal does, and the deadlines."""

    def __init__(
        self,
        on_stop: OnStop | None = None,
        *,
        name: str = "ranksight",
        grace_s: float = STOP_GRACE_S,
        hard_after_s: float = HARD_EXIT_S,
        announce: bool = True,
        interrupt: bool = False,
    ) -> None:
        self.name = name
        self.grace_s = grace_s
        self.hard_after_s = max(hard_after_s, grace_s)
        self.event = threading.Event()
        self.signum: int | None = None
        self._on_stop = on_stop
        self._announce = announce
        self._interrupt = interrupt
        self._stopped_at: float | None = None
        self._previous: dict[int, Any] = {}
        self._watchdog: threading.Timer | None = None
        self._signalled = False

    # -- what the command asks --------------------------------------------------------------

    @property
    def requested(self) -> bool:
        """Whether a stop was asked for (a signal, or `request()`)."""
        return self.event.is_set()

    @property
    def exit_code(self) -> int:
        """128 + the signal number once stopped by a signal (the shell's convention), else 0."""
        return 128 + self.signum if self.signum is not None else 0

    @property
    def signal_name(self) -> str:
        """'SIGINT', 'SIGTERM', or '' before any signal."""
        return signal.Signals(self.signum).name if self.signum is not None else ""

    def remaining(self, floor: float = 0.0) -> float:
        """Seconds left of the stop budget (`grace_s` from the first signal); `grace_s` before any."""
        if self._stopped_at is None:
            return self.grace_s
        return max(floor, self.grace_s - (time.monotonic() - self._stopped_at))

    def check(self) -> None:
        """Raise `StopRequested` once a stop was asked for."""
        if self.event.is_set():
            raise StopRequested(self.signum or signal.SIGTERM)

    def sleep(self, seconds: float) -> None:
        """Sleep up to `seconds`, raising `StopRequested` as soon as a stop is asked for."""
        self.check()
        if seconds > 0 and self.event.wait(seconds):
            self.check()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until a stop is asked for or `timeout` passes; True when asked."""
        return self.event.wait(timeout)

    def request(self, signum: int = signal.SIGTERM) -> None:
        """Begin the stop as if `signum` had arrived (without the announcement); for tests and callers."""
        self._begin(signum)

    # -- installation -----------------------------------------------------------------------

    def install(self) -> StopSignals:
        """Set the handlers, whatever the inherited disposition (SIG_IGN included); main thread only."""
        if threading.current_thread() is not threading.main_thread():
            return self  # signal.signal would raise; a command run off the main thread has no signals
        for sig in _SIGNALS:
            self._previous[sig] = signal.getsignal(sig)
            signal.signal(sig, self._handle)
        return self

    def restore(self) -> None:
        """Put back the handlers found by `install` and cancel the hard-exit watchdog."""
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        for sig, previous in self._previous.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()

    def __enter__(self) -> StopSignals:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.restore()

    # -- the handler ------------------------------------------------------------------------

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        # Python runs a handler between bytecodes, also inside another handler: a second signal
        # may arrive while the first is being announced, so the first one marks itself at once.
        first = not self._signalled
        self._signalled = True
        if not first or self.event.is_set():
            _say(f"{self.name}: second {signal.Signals(signum).name}: exiting now")
            os._exit(128 + signum)
        if self._announce:
            _say(
                f"{self.name}: {signal.Signals(signum).name}: stopping"
                f" (within {self.grace_s:g} s; a second signal exits at once)"
            )
        self._begin(signum)
        if self._interrupt:
            raise StopRequested(signum)

    def _begin(self, signum: int) -> None:
        if self.event.is_set():
            return
        self.signum = signum
        self._stopped_at = time.monotonic()
        self.event.set()
        if self._previous and self._watchdog is None:
            self._watchdog = threading.Timer(self.hard_after_s, self._hard_exit, (signum,))
            self._watchdog.daemon = True
            self._watchdog.start()
        if self._on_stop is not None:
            self._on_stop()

    def _hard_exit(self, signum: int) -> None:
        _say(
            f"{self.name}: still stopping {self.hard_after_s:g} s after {signal.Signals(signum).name}: exiting now"
        )
        os._exit(128 + signum)


@contextlib.contextmanager
def stop_signals(
    on_stop: OnStop | None = None,
    *,
    name: str = "ranksight",
    grace_s: float = STOP_GRACE_S,
    hard_after_s: float = HARD_EXIT_S,
    announce: bool = True,
    interrupt: bool = False,
) -> Iterator[StopSignals]:
    """SIGINT and SIGTERM handlers for the block (see the module docstring); restored on exit."""
    stop = StopSignals(
        on_stop, name=name, grace_s=grace_s, hard_after_s=hard_after_s, announce=announce, interrupt=interrupt
    )
    with stop:
        yield stop


def install_stop_handlers(
    on_stop: OnStop | None = None,
    *,
    name: str = "ranksight",
    grace_s: float = STOP_GRACE_S,
    hard_after_s: float = HARD_EXIT_S,
    interrupt: bool = False,
) -> StopSignals:
    """Set the handlers for the rest of the process (call `restore()` to undo): for a main function.

    E.g. `ranksight ui`: `install_stop_handlers(server.stop)`, or `interrupt=True` to keep its
    `except KeyboardInterrupt` path."""
    return StopSignals(
        on_stop, name=name, grace_s=grace_s, hard_after_s=hard_after_s, interrupt=interrupt
    ).install()


def run_main(main: Callable[[], Any], *, name: str, hard_after_s: float = 60.0) -> None:
    """Run a script's `main` so that SIGINT and SIGTERM unwind it like Ctrl-C, whatever it
    inherited: its `finally` blocks and context managers stop what it started (a broker, worker
    processes) instead of leaving them running, and the process exits 128 + the signal number.

    For the benches and tools whose cleanup is `finally`/`with`; `hard_after_s` is long because
    stopping a local Kafka broker takes seconds."""
    with stop_signals(name=name, grace_s=hard_after_s, hard_after_s=hard_after_s, interrupt=True) as stop:
        try:
            main()
        except StopRequested:
            raise SystemExit(stop.exit_code) from None
