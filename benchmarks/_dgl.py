"""DGL as a baseline of ``benchmarks/sampler.py`` and ``loader.py``: the same graph as a DGL graph.

Benchmarks run as scripts (``python benchmarks/NAME.py``), so this module is imported as ``_dgl``.
"""

from __future__ import annotations

import types

import torch

from graphrl.graph import CSCGraph
from samplers.protocol import edges_by_id

__all__ = ["to_dgl"]


def to_dgl(dgl: types.ModuleType, graph: CSCGraph):
    """``graph`` as a DGL graph with the same edge ids (`samplers.protocol.edges_by_id`: edge ``e`` is
    ``src[e] -> dst[e]``), all sparse formats built up front; ``dgl`` from `graphrl.dglshim.import_dgl`."""
    src, dst = edges_by_id(graph)
    g = dgl.graph((torch.from_numpy(src), torch.from_numpy(dst)), num_nodes=graph.num_nodes)
    g.create_formats_()
    return g
