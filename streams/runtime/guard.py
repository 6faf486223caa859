"""The wall-clock guard: event time for an engine whose input stopped while it was live, and the one
alert (`input_silent`) for when every input stopped.

Pure: the worker asks them on every tick with the wall clock and the engines' times.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from streams.alerting.lifecycle import DEFAULT_REFRESH_MIN_CHANGE, DEFAULT_REFRESH_MS, AlertTracker
from streams.detectors.base import Finding, Topology

__all__ = ["InputSilence", "WallClockGuard"]


class WallClockGuard:
    """Decides when an engine whose input went silent may advance event time with the wall clock.

    Only for live data: the engine's newest event must be within `live_ms` of the wall clock, so a
    historical replay never has time invented for it. Returns the watermark to advance to.
    """

    def __init__(self, guard_s: float = 120.0, live_ms: int = 600_000, lateness_ms: int = 5_000) -> None:
        self.guard_s = guard_s
        self.live_ms = live_ms
        self.lateness_ms = lateness_ms

    def watermark(
        self, now_ms: int, silent_s: float, max_ts: int | None, current_wm: int | None
    ) -> int | None:
        """The watermark to advance to now, or None (input not silent long enough, not live, or no gain)."""
        if self.guard_s <= 0 or max_ts is None or silent_s < self.guard_s:
            return None
        if now_ms - max_ts > self.live_ms:
            return None  # historical data: the wall clock says nothing about its event time
        target = now_ms - self.lateness_ms
        if current_wm is not None and target <= current_wm:
            return None
        return target


class InputSilence:
    """Every source input of a worker silent while its data was live: one platform alert, not a stall per job.

    When every producer stops at once (a simulation ends, a cluster's telemetry or the network to
    Kafka goes), each job looks stalled to an engine whose event time the guard moves on: every job
    would page `job_stall` or `evaluation_stuck`. That says nothing about the jobs; it says no record
    comes. So the worker raises `input_silent` once (category platform, critical) and holds the
    guard while it fires; the first record of any source resolves it and the guard works again.
    Pure: the worker passes the wall clock, the silence and its engines' newest event time.
    """

    RULE = "input_silent"

    def __init__(
        self,
        guard: WallClockGuard,
        app_id: str,
        runbook_base_url: str,
        *,
        refresh_every_ms: int = DEFAULT_REFRESH_MS,
        refresh_min_change: float = DEFAULT_REFRESH_MIN_CHANGE,
    ) -> None:
        self.guard = guard
        # While it fires the alert is refreshed as the silence grows (on the wall clock: the silence
        # is of the input itself), like every lasting condition.
        self.tracker = AlertTracker(
            runbook_base_url, refresh_every_ms=refresh_every_ms, refresh_min_change=refresh_min_change
        )
        self.key = (app_id,)  # one fingerprint per worker group: "input_silent/<app id>"
        self.since_ms: int | None = None  # wall time of the last source record, while the alert fires
        # Other workers' firing alerts taken over with their partitions ({"since", "tracker"}):
        # resolved with this one.
        self.inherited: list[dict[str, Any]] = []

    @property
    def holding(self) -> bool:
        """True while the alert fires: the guard must not move any engine's event time."""
        return self.since_ms is not None

    def state(self) -> dict[str, Any] | None:
        """What a worker restarted during the silence needs to go on with the alert (None while it
        does not fire): carried in every partition's checkpoint."""
        if self.since_ms is None:
            return None
        return {"since": self.since_ms, "tracker": self.tracker.state(), "inherited": list(self.inherited)}

    def adopt(self, state: dict[str, Any] | None) -> None:
        """Go on from a restored `state()`: the alert fires, the guard holds, and the first record
        resolves it (a worker killed while it fired would otherwise leave it firing for good).

        Firing already (another worker's partitions taken over, its own alert with its own id):
        that alert is kept too and resolved with this worker's."""
        if not state:
            return
        if self.since_ms is None:
            self.since_ms = state["since"]
            self.tracker.load_state(state["tracker"])
        known = {self.since_ms, *(i["since"] for i in self.inherited)}
        for other in [{"since": state["since"], "tracker": state["tracker"]}, *state["inherited"]]:
            if other["since"] not in known:
                known.add(other["since"])
                self.inherited.append(other)

    def is_silent(self, silent_s: float | None, last_input_ms: int | None, newest_ts: int | None) -> bool:
        """Every source silent for `guard_s`, and the data live when it stopped (its newest event time
        within `live_ms` of the wall clock at the last record): a historical replay never raises it."""
        if self.guard.guard_s <= 0 or silent_s is None or last_input_ms is None or newest_ts is None:
            return False
        return silent_s >= self.guard.guard_s and last_input_ms - newest_ts <= self.guard.live_ms

    def check(
        self, now_ms: int, silent_s: float | None, last_input_ms: int | None, newest_ts: int | None
    ) -> list[dict[str, Any]]:
        """The Alert records (not yet routed) this moment calls for: a firing when silence begins,
        its refresh as the silence grows (`AlertTracker`'s pace), a resolution when a source speaks
        again; [] otherwise. `silent_s`: since the last record of any source (None: none yet);
        `last_input_ms`: that record's wall time."""
        silent = self.is_silent(silent_s, last_input_ms, newest_ts)
        if silent and self.since_ms is None:
            assert last_input_ms is not None and silent_s is not None
            self.since_ms = last_input_ms
            return self.tracker.observe(self._finding(now_ms, last_input_ms, silent_s), Topology())
        if silent and silent_s is not None and self.since_ms is not None:
            return self.tracker.observe(self._finding(now_ms, self.since_ms, silent_s), Topology())
        if (
            self.since_ms is not None
            and silent_s is not None
            and (silent_s < self.guard.guard_s or self.guard.guard_s <= 0)
        ):
            # A record came: silence only ends that way (it never grows shorter otherwise). A
            # restored alert also ends so when this worker runs with the guard off.
            since, self.since_ms = self.since_ms, None
            out = self._resolve(self.tracker, since, now_ms, silent_s)
            for other in self.inherited:
                tracker = AlertTracker(self.tracker.runbook_base_url)
                tracker.load_state(other["tracker"])
                out += self._resolve(tracker, int(other["since"]), now_ms, silent_s)
            self.inherited = []
            return out
        return []

    def _resolve(
        self, tracker: AlertTracker, since: int, now_ms: int, silent_s: float
    ) -> list[dict[str, Any]]:
        back = max(since, now_ms - int(silent_s * 1000))
        summary = (
            f"records flow again since {_utc(back)} after {(back - since) / 1000:.0f} s "
            "without any: the stall, hang and missing-telemetry rules judge every job again"
        )
        finding = Finding(self.RULE, self.key, False, max(now_ms, back), summary=summary)
        return tracker.observe(finding, Topology())

    def _finding(self, now_ms: int, since_ms: int, silent_s: float) -> Finding:
        return Finding(
            self.RULE,
            self.key,
            True,
            now_ms,
            category="platform",
            severity="critical",
            since=since_ms,
            invariant=f"some producer sends a record at least every {self.guard.guard_s:g} s while data is live",
            observed=round(silent_s, 1),
            expected=self.guard.guard_s,
            summary=(
                f"no records from any producer since {_utc(since_ms)} ({silent_s:.0f} s): every job's "
                "stall, hang and missing-telemetry rules are on hold"
            ),
            suspected_layer="telemetry",
        )


def _utc(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
