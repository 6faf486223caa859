"""ranksight.signals: SIGINT/SIGTERM stop a command whatever disposition it inherited."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import pytest

from ranksight.signals import StopRequested, StopSignals, stop_signals

# A child that installs the handlers, says it is ready, and loops until asked to stop: the
# stop path prints "clean stop" and exits 0 after `on_stop` ran; `--hang` never stops by itself.
_CHILD = textwrap.dedent(
    """
    import sys, time
    from ranksight.signals import stop_signals

    hang = "--hang" in sys.argv
    calls = []
    with stop_signals(on_stop=lambda: calls.append(1), name="child", grace_s=1.0, hard_after_s=1.5) as stop:
        print("ready", flush=True)
        while hang or not stop.requested:
            time.sleep(0.01)
        print(f"clean stop on {stop.signal_name}, on_stop ran {len(calls)}x", flush=True)
    """
)


def _child(*args: str, ignore_sigint: bool) -> subprocess.Popen[str]:
    def preexec() -> None:
        # What `cmd &` in a non-interactive shell and nohup do to SIGINT.
        if ignore_sigint:
            signal.signal(signal.SIGINT, signal.SIG_IGN)

    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=preexec,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    return proc


@pytest.mark.parametrize("ignore_sigint", [True, False], ids=["SIGINT-ignored", "SIGINT-default"])
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_stops_cleanly_even_when_sigint_was_inherited_ignored(
    sig: signal.Signals, ignore_sigint: bool
) -> None:
    proc = _child(ignore_sigint=ignore_sigint)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert f"clean stop on {sig.name}, on_stop ran 1x" in out
    assert f"child: {sig.name}: stopping" in err


def test_a_second_signal_exits_at_once() -> None:
    proc = _child("--hang", ignore_sigint=True)
    proc.send_signal(signal.SIGTERM)
    # The first signal's announcement says the stop began; only then the second one.
    assert proc.stderr is not None
    assert "stopping" in proc.stderr.readline()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGINT
    assert "second SIGINT: exiting now" in err and "clean stop" not in out


def test_a_stop_that_hangs_ends_at_the_hard_deadline() -> None:
    proc = _child("--hang", ignore_sigint=False)
    began = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM
    assert "still stopping 1.5 s after SIGTERM: exiting now" in err
    assert time.monotonic() - began >= 1.4


def test_sleep_and_check_raise_once_a_stop_was_requested() -> None:
    stop = StopSignals()
    stop.sleep(0.0)
    stop.check()
    assert stop.remaining() == stop.grace_s and stop.exit_code == 0
    stop.request(signal.SIGINT)
    with pytest.raises(StopRequested):
        stop.sleep(60)  # returns at once: the stop was already asked for
    with pytest.raises(KeyboardInterrupt):  # code written for Ctrl-C handles it
        stop.check()
    assert stop.exit_code == 130 and stop.signal_name == "SIGINT"
    assert 0 < stop.remaining() <= stop.grace_s


def test_sleep_wakes_when_another_thread_requests_the_stop() -> None:
    import threading

    stop = StopSignals()
    threading.Timer(0.2, stop.request).start()
    began = time.monotonic()
    with pytest.raises(StopRequested):
        stop.sleep(30)
    assert time.monotonic() - began < 10


def test_leaving_the_block_restores_the_previous_handlers() -> None:
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    with stop_signals() as stop:
        assert signal.getsignal(signal.SIGTERM) == stop._handle
    assert {sig: signal.getsignal(sig) for sig in before} == before


def test_interrupt_raises_in_the_main_thread_like_ctrl_c() -> None:
    with pytest.raises(StopRequested), stop_signals(interrupt=True, announce=False):
        signal.raise_signal(signal.SIGTERM)
        time.sleep(5)  # not reached: the handler raised


_SCRIPT = textwrap.dedent(
    """
    import sys, time
    from ranksight.signals import run_main

    def main():
        try:
            print("ready", flush=True)
            time.sleep(60)
        finally:
            print("cleaned up", flush=True)

    run_main(main, name="script")
    """
)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_run_main_unwinds_a_script_through_its_finally_blocks(sig: signal.Signals) -> None:
    """What the benches rely on to stop the broker and workers they started (even from `nohup`)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _SCRIPT],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=30)
    assert "cleaned up" in out, err
    assert proc.returncode == 128 + sig, err
    assert "Traceback" not in err
