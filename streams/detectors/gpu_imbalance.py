"""Rule `gpu_imbalance`: one GPU of a job out of line with its peers (activity, power, memory) per window.

Over the windows of `windows.py`; `imbalance.py` describes the rules together.
"""

from __future__ import annotations

from typing import Any

from streams.detectors.base import Finding
from streams.detectors.catalogue import catalogued
from streams.detectors.stats import median, robust_scorer
from streams.detectors.windows import ImbalanceWindows, _history

__all__ = ["GPU_IMBALANCE", "GpuImbalanceRule"]

GPU_IMBALANCE = catalogued("gpu_imbalance")


class GpuImbalanceRule(ImbalanceWindows):
    """`gpu_imbalance`: per closed window, a GPU out of line with its peers."""

    # -- GPU imbalance -----------------------------------------------------------------
    def _imbalance(
        self, job_id: str, job: dict[str, Any], stats: dict[int, dict[str, Any]], end: int
    ) -> list[Finding]:
        out: list[Finding] = []
        field_of = {"gpu_util_pct": "util", "power_w": "power", "mem_used_frac": "mem"}
        bound = {r: self.topology.bindings.get((job_id, r)) for r in sorted(stats)}
        flagged: dict[str, tuple[int, str, float, float]] = {}
        for metric in self.imb_metrics:
            name = field_of.get(metric)
            if name is None:
                continue
            values = {r: v[name] for r, v in stats.items() if v[name] is not None}
            if len(values) < self.imb_min_gpus:
                continue
            peers = list(values.values())
            mid = median(peers)
            assert mid is not None
            floor = max(abs(mid) * self.imb_rel / 3.0, 1e-9)
            z_of = robust_scorer(peers, min_scale=floor)
            assert z_of is not None
            for rank in sorted(values):
                x = values[rank]
                z = z_of(x)
                if abs(z) < self.imb_z or abs(x - mid) < self.imb_rel * abs(mid):
                    continue
                b = bound.get(rank)
                uuid = b.gpu_uuid if b and b.gpu_uuid else f"rank{rank}"
                if uuid not in flagged:
                    flagged[uuid] = (rank, metric, x, mid)
        hists: dict[str, list[list[Any]]] = job.setdefault("imb_hist", {})
        for uuid in sorted(set(job["imb"]) | set(flagged)):
            if uuid in flagged:
                job["imb"][uuid] = job["imb"].get(uuid, 0) + 1
                x = flagged[uuid][2]
                hists[uuid] = [*hists.get(uuid, []), [end, round(x, 6)]][-self.history_points :]
                if job["imb"][uuid] >= self.imb_windows:
                    job["imb_active"].setdefault(uuid, end)
                    out.append(
                        self._imb_finding(
                            job_id, uuid, flagged[uuid], end, True, job["imb_active"][uuid], hists[uuid]
                        )
                    )
            else:
                job["imb"].pop(uuid, None)
                hist = hists.pop(uuid, [])
                if uuid in job["imb_active"]:
                    rank = next((r for r, b in bound.items() if b and b.gpu_uuid == uuid), -1)
                    out.append(
                        self._imb_finding(
                            job_id, uuid, (rank, "", 0.0, 0.0), end, False, job["imb_active"].pop(uuid), hist
                        )
                    )
        return out

    def _imb_finding(
        self,
        job_id: str,
        uuid: str,
        what: tuple[int, str, float, float],
        end: int,
        active: bool,
        since: int,
        hist: list[list[Any]],
    ) -> Finding:
        rank, metric, x, mid = what
        b = self.topology.bindings.get((job_id, rank))
        return GPU_IMBALANCE.finding(
            (job_id, uuid),
            active,
            end,
            job_id=job_id,
            node=b.node if b else None,
            rank=rank if rank >= 0 else None,
            gpu_uuid=b.gpu_uuid if b else None,
            gpu_index=b.gpu_index if b else None,
            since=since,
            observed=x if active else None,
            expected=mid if active else None,
            summary=(
                f"GPU {uuid} (rank {rank}) of job {job_id}: {metric} {x:.1f} vs {mid:.1f} on its peers"
                if active
                else f"GPU {uuid} of job {job_id} is in line with its peers again"
            ),
            # The GPU's value of the metric that put it out of line, per window while it was.
            history_metric=metric,
            history=_history(hist) if metric else (),
        )
