"""Rule `repeated_data`: a rank's data loader cycles through the same few batches.

Category `data`, warning, one identity per job and rank. Over the last `window_steps` steps of a
rank (one run), fewer than `min_distinct_ratio` of the steps carried a batch fingerprint
(StepCompleted `batch_fingerprint`) not seen earlier in the window: the loader is repeating data
while the GPU keeps computing on it. A multi-epoch run without shuffling repeats a batch only once
per epoch, so as long as an epoch is longer than the window it never fires; a restart (new run id)
starts a fresh window, because resuming from a checkpoint legitimately replays data. Steps without
a fingerprint (an SDK that cannot hash the batch) are ignored. Re-reported at most every
`reemit_s`; resolves once the window is diverse again.
"""

from __future__ import annotations

from typing import Any, ClassVar

from schemas.records import Event
from streams.detectors.base import Finding, PerJobDetector
from streams.detectors.catalogue import catalogued
from streams.detectors.placement import rank_place

__all__ = ["DEFAULTS", "RepeatedDataDetector"]

DEFAULTS: dict[str, Any] = {
    "window_steps": 64,  # fingerprints remembered per rank (must be shorter than an epoch, in batches)
    "min_distinct_ratio": 0.5,  # fewer distinct batches than this fraction of the window is repetition
    "reemit_s": 60.0,  # re-report an active condition at most this often (event time)
}

_POINTS = 10  # metric history carried on a finding


REPEATED_DATA = catalogued("repeated_data")


class RepeatedDataDetector(PerJobDetector, rule=REPEATED_DATA, stage="rank", section="datapath"):
    """Repeated batches, per rank."""

    reads: ClassVar[frozenset[str] | None] = frozenset({"StepCompleted"})

    def configure(self, p: dict[str, Any]) -> None:
        """The knobs (DEFAULTS under the configured values) and empty state."""
        self._window = max(2, int(p["window_steps"]))
        self._min_distinct = float(p["min_distinct_ratio"])
        self._reemit_ms = int(float(p["reemit_s"]) * 1000)

    def new_job_state(self) -> dict[str, Any]:
        """Per rank: its run, its window of fingerprints, the distinct ratios, the open condition."""
        return {"ranks": {}}

    def observe(self, event: Event) -> list[Finding]:
        """Take the batch fingerprint of a StepCompleted."""
        if event.type != "StepCompleted":
            return []
        fp = event.record.get("batch_fingerprint")
        return self._fingerprint(event.record, fp) if fp else []

    def _fingerprint(self, r: dict[str, Any], fp: str) -> list[Finding]:
        ranks = self._job(r["job_id"])["ranks"]
        run = r.get("run_id", "")
        rank = ranks.get(str(r["rank"]))
        if rank is None:
            rank = ranks[str(r["rank"])] = {"run": run, "fps": [], "repeat": None, "ratio_points": []}
        if rank["run"] != run:
            rank["run"], rank["fps"] = run, []
        fps: list[str] = rank["fps"]
        fps.append(fp)
        if len(fps) > self._window:
            del fps[0]
        if len(fps) < self._window:
            return []
        distinct = len(set(fps))
        ratio = distinct / len(fps)
        points: list[list[Any]] = rank["ratio_points"]
        points.append([r["ts"], ratio])
        del points[:-_POINTS]
        cond = rank["repeat"]
        ts = r["ts"]
        if ratio < self._min_distinct:
            if cond is None:
                cond = rank["repeat"] = {"since": ts, "emit": ts, "step": r["step"]}
            elif ts - cond["emit"] < self._reemit_ms:
                return []
            cond["emit"] = ts
            return [self._finding(r, distinct, len(fps), cond["since"], True, points)]
        if cond is not None:
            rank["repeat"] = None
            return [self._finding(r, distinct, len(fps), cond["since"], False, points)]
        return []

    def _finding(
        self, r: dict[str, Any], distinct: int, window: int, since: int, active: bool, points: list[list[Any]]
    ) -> Finding:
        job_id, rank = r["job_id"], int(r["rank"])
        place = rank_place(self.topology, job_id, rank)
        summary = (
            f"rank {rank} of job {job_id} trained on only {distinct} distinct batches in its last {window} "
            f"steps (up to step {r['step']}): the data loader is repeating the same data"
            if active
            else f"rank {rank} of job {job_id} gets distinct batches again ({distinct} of the last {window})"
        )
        return REPEATED_DATA.for_rank(
            job_id,
            rank,
            place,
            active,
            r["ts"],
            since=since,
            invariant=REPEATED_DATA.says(min_distinct=self._min_distinct, window=window),
            observed=distinct / window,
            expected=self._min_distinct,
            summary=summary,
            history_metric="distinct_batch_ratio",
            history=tuple((int(t), float(v)) for t, v in points),
            sustain_ms=0,
        )
