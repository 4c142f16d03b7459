"""Shared assertions for typed (heterogeneous) blocks: `same_blocks` compares two lists of
`samplers.HeteroBlock` field by field (node ids per type, CSC per relation, edge ids, edge weights)."""

from __future__ import annotations

import torch

FIELDS = ("src_nodes", "dst_nodes", "indptr", "indices", "edge_ids", "edge_weights")


def same_blocks(got: list, want: list, what: object = None) -> None:
    """Every field of every typed block equal, dtypes included (node types, relations, edge weights where
    present); ``what`` names the comparison in a failure's message."""
    assert len(got) == len(want), what
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        for field in FIELDS:
            u, v = getattr(a, field), getattr(b, field)
            assert (u is None) == (v is None), (what, i, field)
            if u is not None:
                assert u.keys() == v.keys(), (what, i, field)
                for k in u:
                    assert u[k].dtype == v[k].dtype, (what, i, field, k, u[k].dtype, v[k].dtype)
                    assert torch.equal(u[k], v[k]), (what, i, field, k, u[k], v[k])
