"""pytest plugin: the peers' own loader tests run with our samplers in place of theirs.

Loaded by ``benchmarks/peer_suites.sh`` (``pytest -p peer_plugin``). Before the peers' test modules are
imported it replaces:

- PyG's ``NeighborSampler`` (in ``torch_geometric.sampler``, ``torch_geometric.sampler.neighbor_sampler``
  and the ``NeighborLoader`` / ``LinkNeighborLoader`` modules) by a factory that builds
  `samplers.PygSampler` with the same arguments; PyG's decorators and flags that skip a test without
  pyg-lib (``onlyNeighborSampler``, ``withPackage('pyg_lib')``, ``WITH_PYG_LIB``, ``WITH_TORCH_SPARSE``,
  ``WITH_WEIGHTED_NEIGHBOR_SAMPLE``, ``WITH_EDGE_TIME_NEIGHBOR_SAMPLE`` as the test modules read them):
  our sampler stands in for pyg-lib there;
- DGL's ``NeighborSampler`` / ``MultiLayerNeighborSampler`` (``dgl.dataloading``) by a factory that builds
  `samplers.DglSampler` (a fresh seed per sampler, as DGL's draw from its global stream).

``MultiLayerFullNeighborSampler`` is DGL's and stays DGL's (our ``-1`` fanouts are checked against it in
our own tests). Nothing is fetched: the peers' files are wherever the developer put them.
"""

from __future__ import annotations

import itertools
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

_PYG_FLAGS = ("WITH_PYG_LIB", "WITH_TORCH_SPARSE", "WITH_WEIGHTED_NEIGHBOR_SAMPLE",
              "WITH_EDGE_TIME_NEIGHBOR_SAMPLE")
_SEEDS = itertools.count(1)


class _Factory(type):
    """A stand-in class: calling it builds ours; ``isinstance`` asks whether an object is ours."""

    def __instancecheck__(cls, obj) -> bool:
        return isinstance(obj, cls.ours())


def _patch_pyg() -> None:
    try:
        import torch_geometric
    except ImportError:
        return
    import torch_geometric.loader.link_neighbor_loader as link_mod
    import torch_geometric.loader.neighbor_loader as node_mod
    import torch_geometric.sampler as sampler_pkg
    import torch_geometric.sampler.neighbor_sampler as sampler_mod
    import torch_geometric.testing as testing
    import torch_geometric.testing.decorators as decorators

    from samplers import PygSampler

    class NeighborSampler(metaclass=_Factory):
        ours = staticmethod(lambda: PygSampler)

        def __new__(cls, data, num_neighbors, subgraph_type="directional", replace=False, disjoint=False,
                    temporal_strategy="uniform", time_attr=None, weight_attr=None, is_sorted=False,
                    share_memory=False, directed=True, sample_direction="forward"):
            if not directed:
                subgraph_type = "induced"
            return PygSampler(data, num_neighbors, replace=replace, seed=next(_SEEDS),
                              weight_attr=weight_attr, subgraph_type=subgraph_type, disjoint=disjoint,
                              temporal_strategy=temporal_strategy, time_attr=time_attr,
                              sample_direction=sample_direction)

    for mod in (sampler_pkg, sampler_mod, node_mod, link_mod):
        mod.NeighborSampler = NeighborSampler
    testing.onlyNeighborSampler = decorators.onlyNeighborSampler = lambda func: func
    original = decorators.withPackage

    def with_package(*names):
        return original(*[n for n in names if n != "pyg_lib"])

    testing.withPackage = decorators.withPackage = with_package
    torch_geometric.peer_sampler = "PygSampler"


def _patch_dgl() -> None:
    try:
        from graphrl.dglshim import import_dgl

        dgl = import_dgl()
    except ImportError:
        return
    from samplers import DglSampler

    class NeighborSampler(metaclass=_Factory):
        ours = staticmethod(lambda: DglSampler)

        def __new__(cls, fanouts, edge_dir="in", prob=None, mask=None, replace=False,
                    prefetch_node_feats=None, prefetch_labels=None, prefetch_edge_feats=None,
                    output_device=None, fused=True):
            if edge_dir != "in":
                raise ValueError(f"DglSampler samples in-edges; edge_dir={edge_dir!r}")
            sampler = DglSampler(fanouts, replace=replace, seed=next(_SEEDS), prob=prob, mask=mask)
            sampler.output_device = output_device  # ours copies every feature: prefetch lists add nothing
            return sampler

    dgl.dataloading.NeighborSampler = NeighborSampler
    dgl.dataloading.MultiLayerNeighborSampler = NeighborSampler
    dgl.dataloading.neighbor_sampler.NeighborSampler = NeighborSampler
    dgl.dataloading.neighbor_sampler.MultiLayerNeighborSampler = NeighborSampler


_patch_pyg()
_patch_dgl()


def pytest_collection_modifyitems(items) -> None:
    """PyG's test modules read its extension flags at import: our sampler stands in for pyg-lib."""
    for item in items:
        module = getattr(item, "module", None)
        if module is None or not module.__name__.startswith("test_"):
            continue
        for flag in _PYG_FLAGS:
            if hasattr(module, flag):
                setattr(module, flag, True)
        for mark in list(item.iter_markers("skipif")):
            reason = str(mark.kwargs.get("reason", ""))
            if "pyg-lib" in reason or "neighbor sampler" in reason:
                item.own_markers.remove(mark) if mark in item.own_markers else None
                item.add_marker(pytest.mark.skipif(False, reason="our sampler stands in for pyg-lib"))
