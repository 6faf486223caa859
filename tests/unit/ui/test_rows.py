"""The heatmap rows of a job page (`ui.rows`): ranks up to 512, then nodes, then groups of nodes; drill-downs."""

from __future__ import annotations

from typing import Any

from ui.rows import MAX_RANK_ROWS, row_layout


def _ranks(count: int, per_node: int = 8, shuffle_nodes: bool = False) -> list[dict[str, Any]]:
    out = []
    for rank in range(count):
        node = rank // per_node
        if shuffle_nodes:
            node = (node * 7) % (count // per_node)  # nodes named out of rank order
        out.append({"rank": rank, "node": f"n{node:05d}", "gpu_index": rank % per_node})
    return out


def test_a_job_of_512_ranks_keeps_one_row_per_rank() -> None:
    """Up to MAX_RANK_ROWS ranks the page is unchanged (no layout)."""
    assert row_layout(_ranks(MAX_RANK_ROWS)) is None


def test_2048_ranks_get_one_row_per_node_in_rank_order() -> None:
    """256 nodes of 8: one row each, labelled by node, every rank on its node's row (rank // 8)."""
    layout = row_layout(_ranks(2048))
    assert layout is not None and layout.kind == "node" and layout.grouped
    assert len(layout.labels) == 256 and layout.labels[17] == "n00017" and layout.nodes[17] == ["n00017"]
    assert layout.ranks_per_row == 8
    assert dict(zip(layout.rank_keys, layout.rank_rows, strict=True))[137] == 17


def test_16384_ranks_get_groups_of_nodes_and_a_straggler_keeps_its_row() -> None:
    """2,048 nodes: groups of 8 nodes (256 rows of 64 ranks); rank 137 is on row 2 with its node."""
    layout = row_layout(_ranks(16384))
    assert layout is not None and layout.kind == "node group"
    assert len(layout.labels) == 256 and all(len(nodes) == 8 for nodes in layout.nodes)
    assert layout.ranks_per_row == 64 and layout.ranks == 16384
    row = dict(zip(layout.rank_keys, layout.rank_rows, strict=True))[137]
    assert row == 2 and "n00017" in layout.nodes[row] and layout.labels[row] == "n00016 … n00023"
    assert dict(zip(layout.node_keys, layout.node_rows, strict=True))["n00017"] == row


def test_nodes_named_out_of_rank_order_follow_their_ranks_and_need_the_lookup_table() -> None:
    """Rows follow the nodes' lowest ranks; when a row is not rank // k the SQL must use the arrays."""
    ranks = _ranks(1024, shuffle_nodes=True)
    layout = row_layout(ranks)
    assert layout is not None and layout.kind == "node"
    # Row i holds the node of ranks 8i..8i+7, whatever its name.
    assert layout.nodes[3] == [ranks[24]["node"]]
    assert layout.ranks_per_row == 8
    uneven = [r for r in _ranks(1024) if r["rank"] != 5]  # a node of 7 ranks: no rank // k any more
    assert row_layout(uneven) is not None and row_layout(uneven).ranks_per_row is None  # type: ignore[union-attr]


def test_a_drill_down_gives_each_rank_of_the_nodes_a_labelled_row() -> None:
    """?node=n00017 on a 16k-rank job: 8 rows, r136..r143, labelled with node and GPU."""
    layout = row_layout(_ranks(16384), ["n00017"])
    assert layout is not None and layout.kind == "rank" and not layout.grouped
    assert layout.rank_keys == list(range(136, 144)) and layout.rank_rows == list(range(8))
    assert layout.labels[1] == "r137 n00017/1" and layout.drill == ["n00017"] and layout.ranks == 16384


def test_a_drill_down_of_too_many_nodes_is_grouped_again() -> None:
    """Asking for 100 nodes (800 ranks) gives node rows, not 800 rank rows."""
    nodes = [f"n{i:05d}" for i in range(100)]
    layout = row_layout(_ranks(16384), nodes)
    assert layout is not None and layout.kind == "node" and len(layout.labels) == 100
    assert layout.drill == nodes
