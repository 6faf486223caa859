"""Rule `data_errors`: a rank's data loader keeps reporting errors.

Category `data`, warning, one identity per job and rank. DataLoaderSamples of a rank report loader
errors (or file-open failures) in `errors_sustain_samples` samples in a row; re-reported at most
every `reemit_s` while errors continue; resolves after `errors_resolve_samples` clean samples.
"""

from __future__ import annotations

from typing import Any, ClassVar

from schemas.records import Event
from streams.detectors.base import Finding, PerJobDetector
from streams.detectors.catalogue import catalogued
from streams.detectors.placement import rank_place

__all__ = ["DEFAULTS", "DataErrorsDetector"]

DEFAULTS: dict[str, Any] = {
    "errors_sustain_samples": 3,  # loader samples in a row with errors before data_errors fires
    "errors_resolve_samples": 2,  # clean samples in a row before it resolves
    "reemit_s": 60.0,  # re-report an active condition at most this often (event time)
}

_POINTS = 10  # metric history carried on a finding


DATA_ERRORS = catalogued("data_errors")


class DataErrorsDetector(PerJobDetector, rule=DATA_ERRORS, stage="rank", section="datapath"):
    """Sustained data-loader errors, per rank."""

    reads: ClassVar[frozenset[str] | None] = frozenset({"DataLoaderSample"})

    def configure(self, p: dict[str, Any]) -> None:
        """The knobs (DEFAULTS under the configured values) and empty state."""
        self._err_sustain = max(1, int(p["errors_sustain_samples"]))
        self._err_resolve = max(1, int(p["errors_resolve_samples"]))
        self._reemit_ms = int(float(p["reemit_s"]) * 1000)

    def new_job_state(self) -> dict[str, Any]:
        """Per rank: runs of samples with and without errors, error counts, the open condition."""
        return {"ranks": {}}

    def observe(self, event: Event) -> list[Finding]:
        """Count the errors of a DataLoaderSample."""
        if event.type != "DataLoaderSample":
            return []
        r = event.record
        ranks = self._job(r["job_id"])["ranks"]
        rank = ranks.get(str(r["rank"]))
        if rank is None:
            rank = ranks[str(r["rank"])] = {"err_run": 0, "clean_run": 0, "errors": None, "error_points": []}
        n = max(int(r.get("errors") or 0), int(r.get("file_open_errors") or 0))
        ts = r["ts"]
        cond = rank["errors"]
        points: list[list[Any]] = rank["error_points"]
        points.append([ts, float(n)])
        del points[:-_POINTS]
        if n > 0:
            rank["err_run"] += 1
            rank["clean_run"] = 0
            if rank["err_run"] < self._err_sustain:
                return []
            if cond is None:
                cond = rank["errors"] = {"since": ts, "emit": ts, "total": 0}
                cond["total"] += n
            else:
                cond["total"] += n
                if ts - cond["emit"] < self._reemit_ms:
                    return []
            cond["emit"] = ts
            return [self._finding(r, n, cond, points, True)]
        rank["err_run"] = 0
        rank["clean_run"] += 1
        if cond is not None and rank["clean_run"] >= self._err_resolve:
            rank["errors"] = None
            return [self._finding(r, 0, cond, points, False)]
        return []

    def _finding(
        self, r: dict[str, Any], n: int, cond: dict[str, Any], points: list[list[Any]], active: bool
    ) -> Finding:
        job_id, rank = r["job_id"], int(r["rank"])
        place = rank_place(self.topology, job_id, rank)
        opens = int(r.get("file_open_errors") or 0)
        detail = f" ({opens} failed file opens)" if opens else ""
        summary = (
            f"the data loader of rank {rank} of job {job_id} reported {n} errors in the last "
            f"{r['interval_s']:g}s{detail}, {cond['total']} since errors became sustained"
            if active
            else f"the data loader of rank {rank} of job {job_id} runs without errors again"
        )
        return DATA_ERRORS.for_rank(
            job_id,
            rank,
            place,
            active,
            r["ts"],
            since=cond["since"],
            invariant=DATA_ERRORS.says(err_sustain=self._err_sustain),
            observed=float(n),
            expected=0.0,
            summary=summary,
            history_metric="loader_errors",
            history=tuple((int(t), float(v)) for t, v in points),
            sustain_ms=0,
        )
