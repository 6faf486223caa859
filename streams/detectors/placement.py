"""Where a rank runs: its node and GPU from the shared topology, so a rank alert always names both.

Helpers for the rules, not a rule: every rank-level finding fills `node`, `gpu_uuid` and
`gpu_index` from the rank's RankBound binding (a RankFault's own `node` when there is no binding).
"""

from __future__ import annotations

from dataclasses import dataclass

from streams.detectors.base import Topology

__all__ = ["Place", "rank_place", "ranks_text", "short_host"]


@dataclass(frozen=True, slots=True)
class Place:
    """A rank's node and GPU (None where unknown)."""

    node: str | None = None
    gpu_uuid: str | None = None
    gpu_index: int | None = None

    def words(self) -> str:
        """`node-02 GPU 3`, `node-02`, or empty."""
        if self.node is None:
            return ""
        return f"{self.node} GPU {self.gpu_index}" if self.gpu_index is not None else self.node


def rank_place(topology: Topology, job_id: str, rank: int | None, node: str | None = None) -> Place:
    """The node and GPU a rank of a job is bound to; `node` (e.g. a RankFault's) when it is not bound."""
    if rank is None:
        return Place(node)
    binding = topology.bindings.get((job_id, int(rank)))
    if binding is None:
        return Place(node)
    return Place(binding.node, binding.gpu_uuid, binding.gpu_index)


def short_host(name: str) -> str:
    """A host name compared across sources: lower case, without the domain (`Node-02.dc1` -> `node-02`)."""
    return name.strip().lower().split(".", 1)[0]


def ranks_text(ranks: list[int]) -> str:
    """`0-3, 7`: ranks as ranges."""
    out: list[str] = []
    start = prev = None
    for r in sorted(ranks):
        if start is None:
            start = prev = r
        elif prev is not None and r == prev + 1:
            prev = r
        else:
            out.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = prev = r
    if start is not None:
        out.append(f"{start}" if start == prev else f"{start}-{prev}")
    return ", ".join(out)
