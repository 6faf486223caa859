"""Rule `network_degradation`: the job's intrinsic communication time grew against its own normal.

Decided per summary bucket over the windows of `windows.py`; `imbalance.py` describes the rules together.
"""

from __future__ import annotations

import math
from typing import Any

from streams.detectors.base import Finding, JobInfo
from streams.detectors.catalogue import catalogued
from streams.detectors.gpu_imbalance import GpuImbalanceRule
from streams.detectors.stats import MAD_TO_SIGMA, finite, mad, mean, median
from streams.detectors.windows import _history, _named_outlier

__all__ = ["NETWORK_DEGRADATION", "NetworkDegradationRule"]

NETWORK_DEGRADATION = catalogued("network_degradation")


class NetworkDegradationRule(GpuImbalanceRule):
    """`network_degradation`: per bucket, the job's communication against its own normal."""

    # -- network -----------------------------------------------------------------------
    def _net_bucket(
        self,
        job_id: str,
        job: dict[str, Any],
        by_rank: dict[int, list[Any]],
        info: JobInfo | None,
        start: int,
        end: int,
    ) -> list[Finding]:
        """The job's intrinsic communication time of one bucket against its learned normal (a CUSUM of its log growth)."""
        comms = finite(r[5] for r in by_rank.values())
        if len(comms) < max(2, len(by_rank) // 2):
            return []
        intrinsic = min(comms)
        net = job["net"]
        net["n"] += 1
        if net["n"] <= self.net_skip:
            return []  # warm-up
        job["net_hist"] = [*job["net_hist"], [end, round(intrinsic, 6)]][-self.bucket_history_points :]
        if net["normal"] is None:
            net["learn"].append(round(intrinsic, 6))
            if len(net["learn"]) >= self.net_learn:
                normal = median(net["learn"])
                assert normal is not None
                logs = [math.log(max(x, 1e-9) / normal) for x in net["learn"]] if normal > 0 else [0.0]
                spread = 3.0 * MAD_TO_SIGMA * (mad(logs) or 0.0)
                net.update(
                    normal=normal,
                    k=max(self.net_slack, spread),
                    # Half the slack's noise floor (1.5 sigma; h 0.6 is still ~8 sigma): the host's
                    # errors are the other half of the evidence.
                    kc=max(self.net_c_slack, spread / 2),
                    learn=[],
                )
            return []
        normal = float(net["normal"])
        if normal <= 0:
            return []  # a job whose ranks never wait in a collective: nothing to compare
        growth = math.log(max(intrinsic, 1e-9) / normal)
        step = min(growth - float(net["k"]), self.net_max_step)
        more = intrinsic - normal >= self.net_min_inc
        degraded = intrinsic > normal * self.net_ratio and more
        if job["net_active"] is None:
            if net["s"] == 0.0:
                net["start"] = start
            net["s"] = round(max(0.0, net["s"] + step), 6)
            if net["s"] == 0.0:
                net["start"] = None
            # The corroborated test: less evidence, paged only with a node at fault (older
            # snapshots learned no kc: they use k).
            c_step = min(growth - float(net.get("kc", net["k"])), self.net_c_max_step)
            if net.get("c", 0.0) == 0.0:
                net["c_start"] = start
            net["c"] = round(max(0.0, net.get("c", 0.0) + c_step), 6)
            if net["c"] == 0.0:
                net["c_start"] = None
            if net["s"] >= self.net_h and degraded:
                node, signal = self._network_node(info, end - self.window_ms, end)
                job["net_active"] = [net["start"], node, signal, self.net_ratio]
            elif net["c"] >= self.net_c_h and more and intrinsic > normal * self.net_c_ratio:
                node, signal = self._network_node(info, end - self.window_ms, end)
                if node is None:
                    return []
                job["net_active"] = [net["c_start"], node, signal, self.net_c_ratio]
            else:
                return []
            net["ok"] = 0
            return [self._net_finding(job_id, job, intrinsic, end, True)]
        # Held at the ratio it fired at (a corroborated alert at its lower one: no flapping).
        ratio = float(job["net_active"][3]) if len(job["net_active"]) > 3 else self.net_ratio
        degraded = intrinsic > normal * ratio and more
        if degraded:
            net["ok"] = 0
            net["s"] = round(min(2 * self.net_h, net["s"] + max(step, 0.0)), 6)
            if job["net_active"][1] is None:
                node, signal = self._network_node(info, end - self.window_ms, end)
                if node is not None:
                    job["net_active"][1:3] = [node, signal]
            return [self._net_finding(job_id, job, intrinsic, end, True)]
        net["ok"] += 1
        if net["ok"] < self.clear_buckets:
            return [self._net_finding(job_id, job, intrinsic, end, True)]
        finding = self._net_finding(job_id, job, intrinsic, end, False)
        job["net_active"] = None
        net.update(s=0.0, start=None, ok=0, c=0.0, c_start=None)
        return [finding]

    def _network_node(self, info: JobInfo | None, start: int, end: int) -> tuple[str | None, str]:
        """The job's node whose network looks at fault: InfiniBand port errors first, then TCP retransmits."""
        nodes = sorted(
            set(info.nodes if info and info.nodes else [])
            | {b.node for b in (self.topology.ranks_of(info.job_id) if info else [])}
        )
        ib = self._ib_node(nodes, start, end)
        if ib is not None:
            return ib, "InfiniBand port errors"
        return self._retrans_node(nodes, start, end), "TCP retransmits elevated"

    def _ib_node(self, nodes: list[str], start: int, end: int) -> str | None:
        # Error counters of a healthy fabric stay at zero: the one node counting errors while its
        # peers count (almost) none is the suspect.
        errors: dict[str, float] = {}
        for node in nodes:
            vals = finite(h[2] for h in self.hosts.get(node, []) if len(h) > 2 and start <= h[0] < end)
            if vals:
                errors[node] = sum(vals)
        return _named_outlier(errors, self.retrans_factor, self.ib_min_errors)

    def _retrans_node(self, nodes: list[str], start: int, end: int) -> str | None:
        rates: dict[str, float] = {}
        for node in nodes:
            m = mean(finite(h[1] for h in self.hosts.get(node, []) if start <= h[0] < end))
            if m is not None:
                rates[node] = m
        return _named_outlier(rates, self.retrans_factor, self.retrans_min)

    def _net_finding(
        self, job_id: str, job: dict[str, Any], intrinsic: float, end: int, active: bool
    ) -> Finding:
        since, node, *rest = job["net_active"]
        signal = rest[0] if rest else "TCP retransmits elevated"
        ratio = float(rest[1]) if len(rest) > 1 else self.net_ratio
        normal = float(job["net"]["normal"] or 0.0)
        return NETWORK_DEGRADATION.finding(
            (job_id,),
            active,
            end,
            job_id=job_id,
            node=node,
            since=since,
            invariant=NETWORK_DEGRADATION.says(ratio=ratio)
            + (" while a job node shows network errors" if ratio < self.net_ratio else ""),
            observed=intrinsic,
            expected=normal,
            summary=(
                f"job {job_id}: communication {intrinsic:.3f} s per step vs {normal:.3f} s normal"
                + (
                    f"; {signal} on {node}"
                    if node
                    else "; no node shows InfiniBand errors or elevated TCP retransmits"
                )
                if active
                else f"job {job_id}: communication back to normal ({intrinsic:.3f} s per step)"
            ),
            history_metric="comm_s",
            history=_history(job["net_hist"]),
        )
