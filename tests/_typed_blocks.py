"""Shared assertions for typed (heterogeneous) blocks: `same_blocks` compares two lists of
`samplers.HeteroBlock` field by field (node ids per type, CSC per relation, edge ids, edge weights)."""

from __future__ import annotations

import torch

FIELDS = ("src_nodes", "dst_nodes", "indptr", "indices", "edge_ids", "edge_weights")


def same_blocks(got: list, want: list) -> None:
    """Every field of every typed block equal (node types, relations, edge weights where present)."""
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        for field in FIELDS:
            u, v = getattr(a, field), getattr(b, field)
            assert (u is None) == (v is None), field
            if u is not None:
                assert u.keys() == v.keys(), field
                assert all(torch.equal(u[k], v[k]) for k in u), field
