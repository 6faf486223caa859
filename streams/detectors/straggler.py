"""Rule `straggler`: a rank (or a node's ranks) slower than its peers, decided per summary bucket by
the threshold path and the change-point (CUSUM) path.

Over the windows of `windows.py`; `imbalance.py` describes the rules together.
"""

from __future__ import annotations

import math
from typing import Any

from streams.detectors.base import Finding
from streams.detectors.catalogue import catalogued
from streams.detectors.network_degradation import NetworkDegradationRule
from streams.detectors.stats import MAD_TO_SIGMA, finite, mad, median, stat_mean
from streams.detectors.windows import (
    _G_CLOCK,
    _G_POWER,
    _G_RANK,
    _G_REASONS,
    _G_TS,
    _after_pre_sync,
    _evidence_start,
    _has_evidence,
    _history,
    _median_without,
    _new_seq,
    _note,
    _out_of_line,
    _pre_sync,
    _rank_list,
    _row_gpu_busy,
    _throttle_names,
    _unoverlapped,
)

__all__ = ["STRAGGLER", "StragglerRule"]

STRAGGLER = catalogued("straggler")


class StragglerRule(NetworkDegradationRule):
    """`straggler`: per bucket, ranks and nodes slower than their peers (threshold and change point)."""

    # -- straggler and network, per summary bucket ----------------------------------------
    def _decide(
        self, job_id: str, job: dict[str, Any], start: int, end: int, rows: list[list[Any]]
    ) -> list[Finding]:
        """One bucket of the job decided: every rank's and node's sequential test, and the network's."""
        out: list[Finding] = []
        info = self.topology.jobs.get(job_id)
        run = info.run_id if info else ""
        if run != job["run"]:
            if job["run"]:
                # A new run warms up again (and may place ranks elsewhere): its tests start afresh.
                out.extend(self._end_run(job_id, job, end))
            job["run"] = run
        by_rank: dict[int, list[Any]] = {}
        for row in rows:
            if row[2] is not None and row[2] > 0:
                by_rank[int(row[0])] = row
        # A bucket that a step boundary split (most ranks' step landed in the next one) says little.
        if len(by_rank) < max(2, len(self.topology.ranks_of(job_id)) // 2):
            return out
        job_busy = median([r[2] for r in by_rank.values()])
        assert job_busy is not None
        comms = [r[5] for r in by_rank.values() if r[5] is not None]
        job_comm = median(comms) if 2 * len(comms) >= len(by_rank) else None
        # A job that times its collective (comm_s) shows who waits for whom there: the busy score
        # is complete. One that does not (DDP: the wait hides in backward) is also scored on the
        # work before the first wait.
        untimed = job_comm is None
        held = self._node_bucket(job_id, job, by_rank, start, end, out, untimed)
        peers: dict[str, Any] = {
            "busy": job_busy,
            "compute": median(finite(r[3] for r in by_rank.values())),
            "wait": median(finite(r[4] for r in by_rank.values())),
            "pre_sync": None,
            "after": None,
        }
        if untimed:
            pre_syncs = finite(_pre_sync(r) for r in by_rank.values())
            if 2 * len(pre_syncs) >= len(by_rank):
                peers["pre_sync"] = median(pre_syncs)
                peers["after"] = median(finite(_after_pre_sync(r) for r in by_rank.values()))
            peers["cross"] = self._cross_peers(by_rank)
        for rank in sorted(by_rank):
            row = by_rank[rank]
            key = str(rank)
            score = job_busy / row[2]
            waited = True
            if job_comm is not None and row[5] is not None and row[2] > job_busy:
                # Synchronous training: the ranks wait in the collective for the slow one.
                waited = job_comm - row[5] >= self.waited_share * (row[2] - job_busy)
            early = self._pre_sync_score(row, peers)
            by_pre_sync = early is not None and (early < score or not waited)
            if by_pre_sync:
                score, waited = early, True
            st = job["seq"].get(key)
            if st is None:
                st = job["seq"][key] = _new_seq(self.cusum)
            verdict = self._judge(st, score, start, end, waited, int(row[7]))
            cross = self._cross_rank(st, row, peers, start)
            _note(st, end, score, row, peers, self.bucket_history_points)
            if st["since"] is None:
                if not (verdict or cross) or self._node_of(job_id, rank) in held:
                    if not _has_evidence(st):
                        st.pop("hist", None)  # a healthy rank keeps no history: snapshots stay small
                        st.pop("why", None)
                    continue
                st["path"] = self._path(st, score, verdict)
                st["since"] = st["xfrom"] if st["path"] == "cross-rank" else _evidence_start(st, start, end)
                if st["path"] == "cross-rank" and st.get("xsig"):
                    _, own, ref = st["xsig"]
                    score = min(score, float(ref) / float(own))
                st["summary"] = self._straggler_summary(
                    job_id, job, rank, st, score, row, peers, end, by_pre_sync or st["path"] == "cross-rank"
                )
                out.append(self._straggler_finding(job_id, rank, st, score, end, True))
            elif verdict or (cross and st.get("path") == "cross-rank"):
                out.append(self._straggler_finding(job_id, rank, st, score, end, True))
            else:
                out.append(self._straggler_finding(job_id, rank, st, score, end, False))
                st["since"] = None
                st.pop("hist", None)
                st.pop("why", None)
        out.extend(self._net_bucket(job_id, job, by_rank, info, start, end))
        return out

    def _cross_peers(self, by_rank: dict[int, list[Any]]) -> dict[str, Any]:
        """The peers' side of the cross-rank path, per signal: every rank's value (sorted) and the
        robust spread between them, known from `cross_rank_min_ranks` ranks (None below: a MAD of a
        few values is itself noise, and of 2-3 it can be 0). Signals: the work DDP does not overlap
        (data wait + forward + optimizer) and the GPU-busy time per step (GPM SM activity x step
        time); "after": every rank's backward + communication, where the peers wait."""
        out: dict[str, Any] = {}
        for name, value_of in (("work", _unoverlapped), ("gpu", _row_gpu_busy)):
            values = sorted(finite(value_of(r) for r in by_rank.values()))
            if len(values) >= 2 and 2 * len(values) >= len(by_rank):
                spread = MAD_TO_SIGMA * (mad(values) or 0.0) if len(values) >= self.cross_min_ranks else None
                out[name] = (values, spread)
        out["after"] = sorted(finite(_after_pre_sync(r) for r in by_rank.values()))
        return out

    def _cross_signal(self, row: list[Any], cross: dict[str, Any]) -> list[Any] | None:
        """[signal, the rank's value, its peers' median] of the first signal on which the rank is out
        of line with its peers (`_out_of_line`), or None. The work DDP does not overlap counts while
        the peers wait for it (their backward + comm longer than its own by `waited_for_share` of
        its extra); the GPU-busy time is that wait seen from the GPUs (the peers' SMs idle while
        they wait), and counts unless the rank's timed work is below its peers'."""
        work, gpu = (
            v if v is not None and math.isfinite(v) else None
            for v in (_unoverlapped(row), _row_gpu_busy(row))
        )
        if work is not None and "work" in cross:
            values, spread = cross["work"]
            ref = _out_of_line(values, work, spread, self.cross_excess, self.cross_z)
            if ref is not None and self._waited_for(row, cross["after"], work - ref):
                return ["work", work, ref]
        if gpu is not None and "gpu" in cross:
            values, spread = cross["gpu"]
            ref = _out_of_line(values, gpu, spread, self.cross_excess, self.cross_z)
            if ref is not None:
                peers_work = (
                    _median_without(cross["work"][0], [work])
                    if work is not None and "work" in cross
                    else None
                )
                if peers_work is None or work is None or work >= peers_work:
                    return ["gpu", gpu, ref]
        return None

    def _waited_for(self, row: list[Any], after: list[float], extra: float) -> bool:
        """Whether the rank's peers wait for it: the median of the others' backward + communication
        exceeds the rank's own by `waited_for_share` of its `extra` work."""
        own = _after_pre_sync(row)
        if own is None or not math.isfinite(own):
            return False
        others = _median_without(after, [own])
        return others is not None and others - own >= self.waited_share * extra

    def _cross_rank(self, st: dict[str, Any], row: list[Any], peers: dict[str, Any], start: int) -> bool:
        """The cross-rank path: is the rank out of line with its peers on a signal DDP does not hide
        (`_cross_signal`) in `cross_rank_buckets` buckets? A GPU slow from the first step has no
        normal of its own for the change point to leave, and at 1.2-1.3x its score stays above the
        threshold; its peers are the reference. Out of line: at least `cross_rank_excess` above the
        median of the others and, with `cross_rank_min_ranks` ranks or more, `cross_rank_z` robust
        sigmas of their spread. It needs 2 ranks (a peer, and its wait to say which of the two is
        slow). It holds until 3 buckets are back in line."""
        cross = peers.get("cross")
        hit = self._cross_signal(row, cross) if cross else None
        if hit is not None:
            if not st.get("x"):
                st["xfrom"] = start
            st["x"], st["xok"] = int(st.get("x", 0)) + 1, 0
            st["xsig"] = [hit[0], round(float(hit[1]), 6), round(float(hit[2]), 6)]
        elif st.get("x"):
            st["xok"] = int(st.get("xok", 0)) + 1
            if st["xok"] >= 3:
                for k in ("x", "xok", "xfrom", "xsig"):
                    st.pop(k, None)
        return int(st.get("x", 0)) >= self.cross_buckets

    def _path(self, st: dict[str, Any], score: float, verdict: bool) -> str:
        """Which path decided a straggler: the threshold on the bucket score, the change point (a
        rank that left its own normal), or the cross-rank comparison (a rank slow against its peers)."""
        if not verdict:
            return "cross-rank"
        return "change-point" if st["c"].get("alarm") and score >= self.threshold else "threshold"

    def _pre_sync_score(self, row: list[Any], peers: dict[str, Any]) -> float | None:
        """The rank's score on its work before the first wait (job median / its data wait + forward).

        DDP overlaps the gradient all-reduce with backward: a fast rank's backward timer runs
        until the slow rank's gradients arrive, so busy times even out and the busy score sees
        little of a slow GPU or loader. The data wait and the forward pass come before any wait on
        every rank and still differ. The score counts only when the peers' time after it
        (backward + communication) is longer than the rank's by `waited_for_share` of its extra:
        they wait for it, inside backward (DDP) or in the collective. None when it does not apply.
        """
        own, ref = _pre_sync(row), peers["pre_sync"]
        if own is None or ref is None or own <= ref or peers["after"] is None:
            return None
        after = _after_pre_sync(row)
        if after is None or peers["after"] - after < self.waited_share * (own - ref):
            return None
        return float(ref / own)

    def _judge(
        self, st: dict[str, Any], score: float, start: int, end: int, evidence: bool, steps: int
    ) -> bool:
        """One bucket's score into a rank's (or node's) sequential test; True while it says straggler.

        Two paths: the threshold (`straggler_buckets` low buckets in a row, a verdict that clears
        after `clear_buckets` buckets back above it holding `min_steps` steps: a job of long steps
        reports one step a bucket, and a rank hovering at the threshold must not flap) and the CUSUM against the rank's own normal
        (`self.cusum`, with the same hysteresis). A bucket that is not `evidence` (nobody waited
        for the rank) counts as an ordinary one for both, except while the CUSUM still learns.
        """
        c = st["c"]
        learning = c["ref"] is None
        warm = learning and c.get("skip", 0) < self.cusum.skip_windows
        drift = self.cusum.update(c, score if learning or evidence else max(score, 1.0), end)
        # Warm-up (compilation, first batches) teaches and raises nothing; a verdict carried over
        # from a restored snapshot still clears.
        if not warm and evidence and score < self.threshold:
            if st["low"] == 0:
                st["from"] = start
            st["low"] += 1
            st["ok"], st["ok_steps"] = 0, 0
            if st["low"] >= self.straggler_buckets:
                st["t"] = True
        else:
            st["low"] = 0
            if st["t"]:
                st["ok"] += 1
                st["ok_steps"] = st.get("ok_steps", 0) + steps
                if st["ok"] >= self.clear_buckets and st["ok_steps"] >= self.min_steps:
                    st["t"], st["ok"], st["ok_steps"] = False, 0, 0
        return bool(st["t"] or drift)

    def _node_of(self, job_id: str, rank: int) -> str | None:
        b = self.topology.bindings.get((job_id, rank))
        return b.node if b else None

    def _node_bucket(
        self,
        job_id: str,
        job: dict[str, Any],
        by_rank: dict[int, list[Any]],
        start: int,
        end: int,
        out: list[Finding],
        untimed: bool = False,
    ) -> set[str]:
        """A node whose every rank is slow (its storage, host, NIC): one straggler for the node.

        A per-rank score is judged against the job median, which a node holding half the job's
        ranks drags along (8 slow ranks of 16 score ~0.8, not 0.5). Here each node's *fastest*
        rank is compared with the median of the ranks on the job's other nodes: only when even
        that rank is slow is the fault the node's, not one GPU's (a node needs two ranks or more).
        Returns the nodes on which no new per-rank straggler may be raised (the node's own test
        is accumulating evidence or firing: one incident, one alert).
        """
        by_node: dict[str, list[tuple[int, list[Any]]]] = {}
        for rank in sorted(by_rank):
            node = self._node_of(job_id, rank)
            if node is not None:
                by_node.setdefault(node, []).append((rank, by_rank[rank]))
        states: dict[str, dict[str, Any]] = job["node_seq"]
        held: set[str] = set()
        if len(by_node) < 2:
            return held
        everyone = sorted(row[2] for own in by_node.values() for _, row in own)
        # Under DDP the node's work before its first wait (data wait + forward), as per rank:
        # rank -> (data wait + forward, backward + comm), when every rank has both; and both
        # sorted over the job, sorted once for every node's median of the others.
        early: dict[int, tuple[float, float]] | None = None
        if untimed:
            pairs = {rank: (_pre_sync(row), _after_pre_sync(row)) for rank, row in by_rank.items()}
            if all(p is not None and a is not None for p, a in pairs.values()):
                early = {rank: (float(p or 0.0), float(a or 0.0)) for rank, (p, a) in pairs.items()}
                job_pre = sorted(p for p, _ in early.values())
                job_after = sorted(a for _, a in early.values())
        for node in sorted(by_node):
            own = by_node[node]
            if len(own) < 2:
                continue  # one rank is the rank's straggler, not its node's
            ref = _median_without(everyone, sorted(row[2] for _, row in own))
            if not ref:
                continue
            fastest = min(row[2] for _, row in own)
            score = ref / fastest
            if early is not None:
                own_early = [early[rank] for rank, _ in own]
                score = min(score, self._node_pre_sync_score(own_early, job_pre, job_after))
            st = states.get(node)
            if st is None:
                st = states[node] = _new_seq(self.cusum)
            verdict = self._judge(st, score, start, end, True, min(int(row[7]) for _, row in own))
            if _has_evidence(st) or st["since"] is not None:
                held.add(node)
                st["hist"] = [*st.get("hist", []), [end, round(score, 4)]][-self.bucket_history_points :]
            if st["since"] is None:
                if verdict:
                    st["since"] = _evidence_start(st, start, end)
                    out.append(self._node_finding(job_id, node, st, own, by_rank, score, end, True))
                elif not _has_evidence(st):
                    st.pop("hist", None)
            elif verdict:
                out.append(self._node_finding(job_id, node, st, own, by_rank, score, end, True))
            else:
                out.append(self._node_finding(job_id, node, st, own, by_rank, score, end, False))
                st["since"] = None
                st.pop("hist", None)
        return held

    def _node_pre_sync_score(
        self, own: list[tuple[float, float]], job_pre: list[float], job_after: list[float]
    ) -> float:
        """A node's fastest rank's data wait + forward against the other nodes' median (1.0 unless
        the other nodes' ranks wait for it: their backward + comm longer by half its extra).
        `own`: the node's ranks' (data wait + forward, backward + comm); `job_pre`, `job_after`:
        every rank's, sorted."""
        own_pre = sorted(p for p, _ in own)
        ref = _median_without(job_pre, own_pre)
        if not ref or own_pre[0] <= ref:
            return 1.0
        others_after = _median_without(job_after, sorted(a for _, a in own))
        own_after = median([a for _, a in own])
        if others_after is None or own_after is None:
            return 1.0
        if others_after - own_after < self.waited_share * (own_pre[0] - ref):
            return 1.0
        return ref / own_pre[0]

    def _node_finding(
        self,
        job_id: str,
        node: str,
        st: dict[str, Any],
        own: list[tuple[int, list[Any]]],
        by_rank: dict[int, list[Any]],
        score: float,
        end: int,
        active: bool,
    ) -> Finding:
        ranks = [r for r, _ in own]
        layer = "unknown"
        if active:
            mine = set(ranks)
            peers = [row for r, row in by_rank.items() if r not in mine]
            d_wait = (median(finite(row[4] for _, row in own)) or 0.0) - (
                median(finite(row[4] for row in peers)) or 0.0
            )
            own_compute = median(finite(row[3] for _, row in own))
            peer_compute = median(finite(row[3] for row in peers))
            d_compute = (
                own_compute - peer_compute if own_compute is not None and peer_compute is not None else None
            )
            if d_compute is None:
                layer = "data" if d_wait > 0 else "unknown"
            else:
                layer = "data" if d_wait > d_compute else "gpu"
            layer = st.setdefault("layer", layer)  # the alert keeps the layer it fired with
            what = {
                "data": f"its data path (the node's storage, cache or loader host): data wait "
                f"{d_wait:+.3f} s per step against the ranks on the job's other nodes",
                "gpu": f"the node's GPUs or host: compute {d_compute or 0.0:+.3f} s per step against the "
                "ranks on the job's other nodes",
            }.get(layer, "an unknown layer")
            summary = (
                f"node {node} of job {job_id} is a straggler: all its {len(ranks)} ranks "
                f"({_rank_list(ranks)}) run slower than the job's ranks on its other nodes "
                f"(score {score:.2f}); suspect {what}"
            )
        else:
            st.pop("layer", None)
            summary = f"node {node} of job {job_id} keeps pace again (score {score:.2f})"
        return self._score_finding(
            (job_id, f"node:{node}"),
            st,
            score,
            end,
            active,
            layer,
            summary,
            job_id=job_id,
            node=node,
            invariant=(
                "every node's fastest rank scores >= "
                f"{self.threshold} against the median rank on the job's other nodes"
            ),
        )

    def _score_finding(
        self,
        key: tuple[str, ...],
        st: dict[str, Any],
        score: float,
        end: int,
        active: bool,
        layer: str,
        summary: str,
        **where: Any,
    ) -> Finding:
        """A rank's or a node's straggler finding: its score against the threshold, since when, with
        the score's history; `where`: its identity (and a node's own invariant)."""
        return STRAGGLER.finding(
            key,
            active,
            end,
            category="data" if layer == "data" else "platform",
            since=st["since"],
            observed=score,
            expected=self.threshold,
            summary=summary,
            suspected_layer=layer,
            history_metric="straggler_score",
            history=_history(st.get("hist", [])),
            **{"invariant": STRAGGLER.says(threshold=self.threshold), **where},
        )

    def _gpu_detail(self, job: dict[str, Any], rank: int, end: int) -> tuple[str, int]:
        """The rank's GPU over the last window next to its peers' (clocks, throttle reasons, power)."""
        clocks: dict[int, list[Any]] = {}  # rank -> its samples' Stats
        powers: dict[int, list[Any]] = {}
        reasons = 0
        for g in job["gpu"]:
            if not end - self.window_ms <= g[_G_TS] < end:
                continue
            r = int(g[_G_RANK])
            if g[_G_CLOCK] is not None:
                clocks.setdefault(r, []).append(g[_G_CLOCK])
            if g[_G_POWER] is not None:
                powers.setdefault(r, []).append(g[_G_POWER])
            if r == rank:
                reasons |= int(g[_G_REASONS] or 0)
        own_clock, job_clock = (
            stat_mean(clocks.get(rank, [])),
            median(finite(stat_mean(v) for v in clocks.values())),
        )
        own_power, job_power = (
            stat_mean(powers.get(rank, [])),
            median(finite(stat_mean(v) for v in powers.values())),
        )
        parts = []
        if own_clock is not None and job_clock:
            parts.append(f"SM clock {own_clock:.0f} MHz vs {job_clock:.0f} MHz on its peers")
        if reasons:
            parts.append("throttle reasons " + ",".join(_throttle_names(reasons) or [hex(reasons)]))
        if own_power is not None and job_power:
            parts.append(f"power {own_power:.0f} W vs {job_power:.0f} W")
        return "; ".join(parts), reasons

    def _straggler_summary(
        self,
        job_id: str,
        job: dict[str, Any],
        rank: int,
        st: dict[str, Any],
        score: float,
        row: list[Any],
        peers: dict[str, Any],
        end: int,
        by_pre_sync: bool,
    ) -> str:
        """The firing alert's text, fixed when it fires; sets the state's suspected layer.
        `by_pre_sync`: the score is the work-before-the-first-wait one (DDP)."""
        why = st.get("why") or []
        d_wait = median([w[0] for w in why]) if why else None
        d_compute = median(finite(w[1] for w in why)) if why else None
        if d_compute is None:
            layer = "data" if d_wait is not None and d_wait > 0 and row[4] is not None else "unknown"
        else:
            layer = "data" if (d_wait or 0.0) > d_compute else "gpu"
        signal = st.get("xsig") if st.get("path") == "cross-rank" else None
        if signal is not None:
            # Slow against its peers from the start: on its GPU's busy time, its GPU; on its timed
            # work, whichever of its data wait and its forward + optimizer is further above theirs.
            extra_wait = float(row[4] or 0.0) - float(peers["wait"] or 0.0)
            extra = float(signal[1]) - float(signal[2])
            layer = "gpu" if signal[0] == "gpu" or extra_wait <= extra - extra_wait else "data"
        st["layer"] = layer
        what = "data loading" if layer == "data" else "its GPU" if layer == "gpu" else "an unknown layer"
        summary = f"rank {rank} of job {job_id} is a straggler (score {score:.2f}): suspect {what}"
        if row[4] is not None and row[3] is not None:
            summary += (
                f"; compute {row[3]:.3f} s, data wait {row[4]:.3f} s per step"
                f" (its peers: {peers['compute'] or 0.0:.3f} s, {peers['wait'] or 0.0:.3f} s)"
            )
        if by_pre_sync and signal is None and peers.get("pre_sync") is not None:
            summary += (
                f"; data wait + forward {_pre_sync(row) or 0.0:.3f} s vs {peers['pre_sync']:.3f} s on its peers,"
                " who wait for it inside backward (the all-reduce overlaps it, as in DDP)"
            )
        c = st["c"]
        if c.get("alarm") and score >= self.threshold:
            summary += "; " + self.cusum.describe(c)
        path = st.get("path") or "threshold"
        summary += {
            "threshold": "; decided by the threshold path (score below "
            f"{self.threshold:.2f} in {self.straggler_buckets} buckets)",
            "change-point": "; decided by the change-point path (it left its own normal)",
            "cross-rank": "; decided by the cross-rank path (slow against its peers since "
            f"{self.cross_buckets} buckets, by {self.cross_excess + 1:.2f}x or more)",
        }[path]
        if signal is not None:
            what = {"work": "data wait + forward + optimizer", "gpu": "GPU busy (SM active) time"}[signal[0]]
            summary += f": {what} {signal[1]:.3f} s per step vs {signal[2]:.3f} s on its peers"
            if signal[0] == "work":
                summary += ", who wait for it inside backward (the all-reduce overlaps it, as in DDP)"
        if layer == "gpu":
            detail, _ = self._gpu_detail(job, rank, end)
            if detail:
                summary += f"; {detail}"
        return summary

    def _straggler_finding(
        self, job_id: str, rank: int, st: dict[str, Any], score: float, end: int, active: bool
    ) -> Finding:
        b = self.topology.bindings.get((job_id, rank))
        layer = st.get("layer", "unknown") if active else "unknown"
        summary = (
            st["summary"] if active else f"rank {rank} of job {job_id} keeps pace again (score {score:.2f})"
        )
        return self._score_finding(
            (job_id, str(rank)),
            st,
            score,
            end,
            active,
            layer,
            summary,
            job_id=job_id,
            node=b.node if b else None,
            rank=rank,
            gpu_uuid=b.gpu_uuid if b else None,
            gpu_index=b.gpu_index if b else None,
        )

    def _end_run(self, job_id: str, job: dict[str, Any], end: int) -> list[Finding]:
        """Resolve what the previous run left firing and forget its tests (a restart is a new run)."""
        out: list[Finding] = []
        for key in sorted(job["seq"], key=int):
            st = job["seq"][key]
            if st["since"] is not None:
                out.append(self._straggler_finding(job_id, int(key), st, 1.0, end, False))
        for node in sorted(job["node_seq"]):
            st = job["node_seq"][node]
            if st["since"] is not None:
                out.append(self._node_finding(job_id, node, st, [], {}, 1.0, end, False))
        if job["net_active"] is not None:
            out.append(self._net_finding(job_id, job, job["net"]["normal"] or 0.0, end, False))
        job["seq"], job["node_seq"], job["net_active"], job["net_hist"] = {}, {}, None, []
        job["net"] = {"n": 0, "learn": [], "normal": None, "k": None, "s": 0.0, "start": None, "ok": 0}
        return out
