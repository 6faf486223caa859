"""The data path: a loader that repeats the same batches, and loader errors that do not stop.

Rules (category `data`, identity per job and rank):

- `repeated_data`: over the last `window_steps` steps of a rank (one run), fewer than
  `min_distinct_ratio` of the steps carried a batch fingerprint not seen earlier in the window:
  the loader is cycling through the same few batches while the GPU keeps computing on them. A
  multi-epoch run without shuffling repeats a batch only once per epoch, so as long as an epoch is
  longer than the window it never fires; a restart (new run id) starts a fresh window, because
  resuming from a checkpoint legitimately replays data. Resolves once the window is diverse again.
- `data_errors`: DataLoaderSamples of a rank report loader errors (or file-open failures) in
  `errors_sustain_samples` samples in a row; resolves after `errors_resolve_samples` clean ones.

Steps without a fingerprint (an SDK that cannot hash the batch) are ignored by `repeated_data`.
"""

from __future__ import annotations

from typing import Any, ClassVar

from schemas.records import Event
from streams.detectors.base import Finding, PerJobDetector, Topology
from streams.detectors.placement import rank_place

__all__ = ["DEFAULTS", "DatapathDetector"]

_POINTS = 10  # metric history carried on a finding

DEFAULTS: dict[str, Any] = {
    "window_steps": 64,  # fingerprints remembered per rank (must be shorter than an epoch, in batches)
    "min_distinct_ratio": 0.5,  # fewer distinct batches than this fraction of the window is repetition
    "errors_sustain_samples": 3,  # loader samples in a row with errors before data_errors fires
    "errors_resolve_samples": 2,  # clean samples in a row before it resolves
    "reemit_s": 60.0,  # re-report an active condition at most this often (event time)
}


class DatapathDetector(PerJobDetector):
    """Repeated batches and sustained loader errors, per rank."""

    rules: ClassVar[tuple[str, ...]] = ("repeated_data", "data_errors")

    def __init__(self, topology: Topology, params: dict[str, Any] | None = None) -> None:
        super().__init__(topology, params)
        p = {**DEFAULTS, **self.params}
        self._window = max(2, int(p["window_steps"]))
        self._min_distinct = float(p["min_distinct_ratio"])
        self._err_sustain = max(1, int(p["errors_sustain_samples"]))
        self._err_resolve = max(1, int(p["errors_resolve_samples"]))
        self._reemit_ms = int(float(p["reemit_s"]) * 1000)

    def new_job_state(self) -> dict[str, Any]:
        """The state of a job seen for the first time: per-rank windows and error runs."""
        return {"ranks": {}}

    def observe(self, event: Event) -> list[Finding]:
        """Fingerprints from StepCompleted, error counts from DataLoaderSample."""
        r = event.record
        if event.type == "StepCompleted":
            fp = r.get("batch_fingerprint")
            return self._fingerprint(r, fp) if fp else []
        if event.type == "DataLoaderSample":
            return self._errors(r)
        return []

    def _rank(self, r: dict[str, Any]) -> dict[str, Any]:
        ranks = self._job(r["job_id"])["ranks"]
        key = str(r["rank"])
        rank = ranks.get(key)
        if rank is None:
            rank = ranks[key] = {
                "run": r.get("run_id", ""),
                "fps": [],
                "repeat": None,
                "err_run": 0,
                "clean_run": 0,
                "errors": None,
                "ratio_points": [],
                "error_points": [],
            }
        return rank

    def _fingerprint(self, r: dict[str, Any], fp: str) -> list[Finding]:
        rank = self._rank(r)
        run = r.get("run_id", "")
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
        points: list[list[Any]] = rank.setdefault("ratio_points", [])
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
            return [self._repeat_finding(r, distinct, len(fps), cond["since"], True, points)]
        if cond is not None:
            rank["repeat"] = None
            return [self._repeat_finding(r, distinct, len(fps), cond["since"], False, points)]
        return []

    def _errors(self, r: dict[str, Any]) -> list[Finding]:
        rank = self._rank(r)
        n = max(int(r.get("errors") or 0), int(r.get("file_open_errors") or 0))
        ts = r["ts"]
        cond = rank["errors"]
        points: list[list[Any]] = rank.setdefault("error_points", [])
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
            return [self._errors_finding(r, n, cond, True)]
        rank["err_run"] = 0
        rank["clean_run"] += 1
        if cond is not None and rank["clean_run"] >= self._err_resolve:
            rank["errors"] = None
            return [self._errors_finding(r, 0, cond, False)]
        return []

    def _repeat_finding(
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
        return Finding(
            rule="repeated_data",
            key=(job_id, str(rank)),
            active=active,
            ts=r["ts"],
            category="data",
            severity="warning",
            job_id=job_id,
            node=place.node,
            rank=rank,
            gpu_uuid=place.gpu_uuid,
            gpu_index=place.gpu_index,
            since=since,
            invariant=f"at least {self._min_distinct:.0%} of a rank's last {window} batches are distinct",
            observed=distinct / window,
            expected=self._min_distinct,
            summary=summary,
            suspected_layer="data",
            history_metric="distinct_batch_ratio",
            history=tuple((int(t), float(v)) for t, v in points),
            sustain_ms=0,
        )

    def _errors_finding(self, r: dict[str, Any], n: int, cond: dict[str, Any], active: bool) -> Finding:
        job_id, rank = r["job_id"], int(r["rank"])
        place = rank_place(self.topology, job_id, rank)
        points = self._rank(r)["error_points"]
        opens = int(r.get("file_open_errors") or 0)
        detail = f" ({opens} failed file opens)" if opens else ""
        summary = (
            f"the data loader of rank {rank} of job {job_id} reported {n} errors in the last "
            f"{r['interval_s']:g}s{detail}, {cond['total']} since errors became sustained"
            if active
            else f"the data loader of rank {rank} of job {job_id} runs without errors again"
        )
        return Finding(
            rule="data_errors",
            key=(job_id, str(rank)),
            active=active,
            ts=r["ts"],
            category="data",
            severity="warning",
            job_id=job_id,
            node=place.node,
            rank=rank,
            gpu_uuid=place.gpu_uuid,
            gpu_index=place.gpu_index,
            since=cond["since"],
            invariant=f"a data loader does not report errors in {self._err_sustain} samples in a row",
            observed=float(n),
            expected=0.0,
            summary=summary,
            suspected_layer="data",
            history_metric="loader_errors",
            history=tuple((int(t), float(v)) for t, v in points),
            sustain_ms=0,
        )
