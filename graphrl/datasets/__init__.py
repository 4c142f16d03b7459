"""Loaders for the real data sets (Gowalla, Cora, CiteSeer, LastFM) and seeded synthetic generators.

Every loader takes ``root=None``: the folder holding ``gowalla/``, ``cora_citeseer/`` and
``lastfm/``, by default ``$GRAPHRL_DATA`` (see `data_root`). A missing folder or file raises
`FileNotFoundError` naming the path and what to put there. The folder's README lists the counts the
loaders reproduce.
"""

from graphrl.datasets.base import InteractionDataset, NodeDataset, data_root
from graphrl.datasets.gowalla import load_gowalla
from graphrl.datasets.lastfm import load_lastfm
from graphrl.datasets.planetoid import load_planetoid
from graphrl.datasets.synthetic import synthetic_bipartite, synthetic_communities, synthetic_graph
from graphrl.datasets.validation import ValidationSplit, holdout_validation

__all__ = [
    "load_gowalla",
    "load_planetoid",
    "load_lastfm",
    "synthetic_graph",
    "synthetic_bipartite",
    "synthetic_communities",
    "InteractionDataset",
    "NodeDataset",
    "data_root",
    "holdout_validation",
    "ValidationSplit",
]
