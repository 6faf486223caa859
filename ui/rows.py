"""The rows of a job page's heatmaps: one per rank, or, for a job with many ranks, one per node or group of nodes.

A 16,384-rank job has more ranks than a heatmap has pixels (and 16,384 x 180 cells are millions of
values to query, send and draw). Up to `MAX_RANK_ROWS` ranks a page draws one row per rank; beyond,
one row per node, or per group of consecutive nodes when there are more than `TARGET_GROUP_ROWS`
nodes. A row's cell is its worst rank's value in the bucket (the slowest window, the least busy GPU),
so a straggler still shows as one stripe, on its node's row; the page then drills down to that
node's ranks (`?node=<name>`, repeatable), where each rank has its own row again.

Pure: the layout is worked out from the job's rank bindings; the SQL maps a rank (or a node) to
its row with `transform` over the arrays given here as query parameters.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["MAX_RANK_ROWS", "TARGET_GROUP_ROWS", "RowLayout", "row_layout"]

MAX_RANK_ROWS = 512
TARGET_GROUP_ROWS = 256


@dataclass(frozen=True)
class RowLayout:
    """How the ranks of a page map to heatmap rows.

    `kind`: "rank" (one row per rank, of a drill-down: `labels` name them), "node" or "node group".
    `nodes`: per row, the nodes it holds (empty lists for rank rows). `rank_keys` and `rank_rows`:
    each rank and its row (the arrays `transform(rank, ...)` takes); `node_keys` and `node_rows` the
    same for nodes. `ranks`: how many ranks the job has, `drill`: the nodes a drill-down shows.
    """

    kind: str
    labels: list[str]
    nodes: list[list[str]]
    rank_keys: list[int]
    rank_rows: list[int]
    node_keys: list[str]
    node_rows: list[int]
    ranks: int
    drill: list[str]

    @property
    def ranks_per_row(self) -> int | None:
        """k when every rank's row is `rank // k` (ranks placed on nodes in order: the usual case), else None.

        The SQL then maps a rank to its row with `intDiv`: a 16,384-element array parameter costs
        tens of milliseconds to send and parse per query, a tuple array ten times more.
        """
        if not self.grouped or not self.rank_keys:
            return None
        k = self.rank_rows.count(0)
        ok = k > 0 and all(row == rank // k for rank, row in zip(self.rank_keys, self.rank_rows, strict=True))
        return k if ok else None

    @property
    def grouped(self) -> bool:
        """True when a row holds several ranks (a node or a group of nodes)."""
        return self.kind != "rank"

    def as_dict(self) -> dict[str, Any]:
        """What the page script needs: the rows' kind, labels and nodes, the job's rank count, the drill-down."""
        return {
            "kind": self.kind,
            "labels": self.labels,
            "nodes": self.nodes,
            "ranks": self.ranks,
            "drill": self.drill,
        }


def row_layout(
    ranks: Sequence[dict[str, Any]],
    drill: Sequence[str] = (),
    *,
    max_rank_rows: int = MAX_RANK_ROWS,
    target_rows: int = TARGET_GROUP_ROWS,
) -> RowLayout | None:
    """The rows of a page over `ranks` (dicts with `rank` and `node`), None for the plain per-rank page.

    `drill`: the nodes a drill-down asked for; their ranks get one row each (labelled), whatever
    the job's size (grouped again when they are more than `max_rank_rows`). Without it a job of at
    most `max_rank_rows` ranks keeps one row per rank.
    """
    total = len(ranks)
    wanted = set(drill)
    kept = (
        sorted((r for r in ranks if r["node"] in wanted), key=lambda r: int(r["rank"]))
        if drill
        else list(ranks)
    )
    if drill and len(kept) <= max_rank_rows:
        return RowLayout(
            kind="rank",
            labels=[f"r{r['rank']} {r['node']}/{_gpu(r)}" for r in kept],
            nodes=[[] for _ in kept],
            rank_keys=[int(r["rank"]) for r in kept],
            rank_rows=list(range(len(kept))),
            node_keys=[],
            node_rows=[],
            ranks=total,
            drill=sorted(wanted),
        )
    if not drill and total <= max_rank_rows:
        return None
    # Nodes in the order of their lowest rank: a row's nodes hold neighbouring ranks.
    first: dict[str, int] = {}
    for r in kept:
        rank, node = int(r["rank"]), str(r["node"])
        first[node] = min(rank, first.get(node, rank))
    ordered = sorted(first, key=lambda n: (first[n], n))
    per_row = max(1, math.ceil(len(ordered) / max(1, target_rows)))
    groups = [ordered[i : i + per_row] for i in range(0, len(ordered), per_row)]
    row_of_node = {node: i for i, group in enumerate(groups) for node in group}
    node_of_rank = {int(r["rank"]): str(r["node"]) for r in kept}
    keys = sorted(node_of_rank)
    return RowLayout(
        kind="node" if per_row == 1 else "node group",
        labels=[g[0] if len(g) == 1 else f"{g[0]} … {g[-1]}" for g in groups],
        nodes=groups,
        rank_keys=keys,
        rank_rows=[row_of_node[node_of_rank[k]] for k in keys],
        node_keys=ordered,
        node_rows=[row_of_node[n] for n in ordered],
        ranks=total,
        drill=sorted(wanted),
    )


def _gpu(rank: dict[str, Any]) -> str:
    gpu = rank.get("gpu_index")
    return "?" if gpu is None else str(gpu)
