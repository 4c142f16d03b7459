"""What `samplers.PygSampler` reads from a PyG graph: `PygGraph` and `read_pyg_graph`.

`read_pyg_graph` takes what PyG's ``NeighborSampler`` takes: a ``Data``, a ``HeteroData`` or a
``(FeatureStore, GraphStore)`` pair, and returns its edges per edge type (edge ``j`` of a type is
column ``j`` of the type's COO ``edge_index``, as PyG's own samplers number edges), node counts, the
``weight_attr`` weights and the ``time_attr`` times, node-level or edge-level, with PyG's rules for
telling them apart (a ``Data``: ``is_node_attr`` / ``is_edge_attr``; a ``HeteroData``: which stores
hold it, never both; a ``(FeatureStore, GraphStore)``: attribute ``'time'`` is node-level on a
homogeneous store, a group name that is a node type (str) or an edge type (tuple) on a
heterogeneous one). A ``Data`` without ``edge_index`` is a graph without edges, as for PyG. A
homogeneous graph is one edge type, `HOMO`, between nodes of type ``"node"``.

References
----------
PyG 2.8's ``torch_geometric.sampler.NeighborSampler.__init__`` (the rules above).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

import torch

from samplers._optional import import_pyg
from samplers._stamp import TensorStamp

__all__ = ["HOMO", "PygGraph", "SourceStamps", "graph_sources", "read_pyg_graph", "snapshot", "weights_named"]

HOMO = ("node", "to", "node")
"""The one edge type of a homogeneous graph (node type ``"node"``)."""


@dataclass
class PygGraph:
    """A PyG graph's edges, node counts, weights and times, per edge type (`read_pyg_graph`).

    Attributes
    ----------
    hetero : bool
        Whether the input was heterogeneous (``HeteroData``, or a store with edge types).
    node_types : list of str
        ``["node"]`` for a homogeneous graph.
    edge_types : list of (str, str, str)
        In PyG's order (``data.metadata()``); ``[HOMO]`` for a homogeneous graph.
    num_nodes : dict str -> int
    edges : dict edge type -> (torch.Tensor int64 [E_r], torch.Tensor int64 [E_r])
        Source and destination ids; column j is edge j.
    weights : dict edge type -> torch.Tensor float [E_r]
        The ``weight_attr`` of the edge types that have it.
    node_time : dict str -> torch.Tensor [N_t], or None
        Node-level times (``time_attr`` on nodes).
    edge_time : dict edge type -> torch.Tensor [E_r], or None
        Edge-level times (``time_attr`` on edges).
    weight_attr : str or None
        The attribute ``weights`` were read from (named by their errors: `weights_named`).
    """

    hetero: bool
    node_types: list
    edge_types: list
    num_nodes: dict
    edges: dict
    weights: dict
    node_time: dict | None = None
    edge_time: dict | None = None
    weight_attr: str | None = None


@contextmanager
def weights_named(graph: PygGraph) -> Iterator[None]:
    """Build a draw of ``graph`` in this block: a ValueError about its weights (the graph's checks call them
    ``weights``) names the ``weight_attr`` tensor instead (``data['w']``), at the sampler's build and after
    an in-place write; the weights are read once, by the draw."""
    weight_attr = graph.weight_attr
    try:
        yield
    except ValueError as err:
        if weight_attr is None or not graph.weights or not str(err).startswith("weights"):
            raise
        where = "data[edge type]" if graph.hetero else "data"
        raise ValueError(f"{where}[{weight_attr!r}] (weight_attr={weight_attr!r}): {err}") from err


def graph_sources(graph: PygGraph) -> tuple[torch.Tensor, ...]:
    """The user's tensors a sampler of ``graph`` draws from, in a fixed order: each edge type's weights, then
    each node type's and each edge type's times (`samplers.PygSampler` stamps them, `samplers._stamp`)."""
    parts = (graph.weights, graph.node_time or {}, graph.edge_time or {})
    return tuple(t for part in parts for t in part.values() if isinstance(t, torch.Tensor))


@dataclass(frozen=True)
class SourceStamps:
    """The stamps (`samplers._stamp.TensorStamp`) of a graph's `graph_sources` when a draw was read from
    them: `matches` says whether none was replaced or written in place since.

    Attributes
    ----------
    stamps : tuple of TensorStamp
        In `graph_sources` order; ``()`` matches no graph with weights or times (a draw to rebuild).
    """

    stamps: tuple = ()

    @staticmethod
    def of(graph: PygGraph) -> SourceStamps:
        """The stamps of ``graph``'s tensors now (take them before reading the tensors, so that a write
        during the reads is seen by the next `matches`)."""
        return SourceStamps(tuple(TensorStamp.of(t) for t in graph_sources(graph)))

    def matches(self, graph: PygGraph) -> bool:
        """Whether ``graph``'s tensors are the stamped ones, none written in place since."""
        sources = graph_sources(graph)
        return len(sources) == len(self.stamps) and all(
            st.matches(t) for st, t in zip(self.stamps, sources, strict=True))


def snapshot(graph: PygGraph) -> PygGraph:
    """``graph`` with copies of its node times (CPU, one read of each): what one draw of a sampler reads for
    its seeds' own times, its neighbours' and its negatives', per batch and at its build; the weights and edge
    times stay the user's tensors, read once when the draw is built (`samplers.pyg_draw.PygDraw`)."""
    if graph.node_time is None:
        return graph
    return replace(graph, node_time={t: torch.as_tensor(v).detach().to("cpu", copy=True)
                                     for t, v in graph.node_time.items()})


def _time_kind(in_nodes: bool, in_edges: bool, time_attr: str) -> str:
    if in_nodes and in_edges:
        raise ValueError(f"The time attribute '{time_attr}' holds both node-level and edge-level "
                         f"information")
    if not in_nodes and not in_edges:
        raise ValueError(f"The time attribute '{time_attr}' is neither a node-level or edge-level attribute")
    return "node" if in_nodes else "edge"


def _edge_index(name: str, edge_index) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(edge_index, torch.Tensor) or edge_index.dim() != 2 or edge_index.shape[0] != 2:
        shape = tuple(edge_index.shape) if isinstance(edge_index, torch.Tensor) else type(edge_index)
        raise ValueError(f"{name} must be a [2, E] tensor (row 0 source, row 1 target), got shape {shape}")
    return edge_index[0].to(torch.int64), edge_index[1].to(torch.int64)


def read_pyg_graph(data, time_attr: str | None = None, weight_attr: str | None = None) -> PygGraph:
    """Read a ``Data``, ``HeteroData`` or ``(FeatureStore, GraphStore)`` into a `PygGraph`.

    Raises
    ------
    TypeError
        ``data`` is none of these; boolean or complex times.
    ValueError
        An ``edge_index`` not shaped [2, E]; a node type without ``num_nodes``; ``time_attr`` on no
        store or on both nodes and edges (PyG's wording), or not one time per node / edge;
        ``weight_attr`` on no edge type.
    NotImplementedError
        A ``weight_attr`` with a ``(FeatureStore, GraphStore)`` (PyG's error and wording).
    """
    pyg = import_pyg()
    if isinstance(data, pyg.data.Data):
        out = _read_data(data, time_attr, weight_attr)
    elif isinstance(data, pyg.data.HeteroData):
        out = _read_hetero(data, time_attr, weight_attr)
    elif (isinstance(data, (tuple, list)) and len(data) == 2 and isinstance(data[0], pyg.data.FeatureStore)
            and isinstance(data[1], pyg.data.GraphStore)):
        if weight_attr is not None:  # PyG's error and wording
            raise NotImplementedError("'weight_attr' argument not yet supported within 'PygSampler' for "
                                      "'(FeatureStore, GraphStore)' inputs")
        out = _read_stores(data[0], data[1], time_attr)
    else:
        raise TypeError(f"data must be a torch_geometric.data.Data, HeteroData or (FeatureStore, "
                        f"GraphStore), got {type(data).__name__}")
    _check_times(out, time_attr)
    return replace(out, weight_attr=weight_attr)


def _check_times(graph: PygGraph, time_attr: str | None) -> None:
    """Each time tensor integer or float, one time per node (node-level) or edge (edge-level)."""
    wanted = {t: graph.num_nodes[t] for t in graph.node_time or {}}
    wanted.update({et: int(graph.edges[et][0].shape[0]) for et in graph.edge_time or {}})
    for key, times in {**(graph.node_time or {}), **(graph.edge_time or {})}.items():
        times = torch.as_tensor(times)
        if tuple(times.shape) != (wanted[key],):
            per = "node" if key in (graph.node_time or {}) else "edge"
            raise ValueError(f"time_attr={time_attr!r} of {key!r} must have shape [{wanted[key]}], one time "
                             f"per {per}, got {list(times.shape)}")
        if times.dtype == torch.bool or times.is_complex():
            raise TypeError(f"time_attr={time_attr!r} of {key!r} must hold integer or float times, got "
                            f"{times.dtype}")


def _read_data(data, time_attr, weight_attr) -> PygGraph:
    num_nodes = int(data.num_nodes or 0)
    if data.edge_index is None:  # no edges: every seed samples nothing, as in PyG
        src = dst = torch.empty(0, dtype=torch.int64)
    else:
        src, dst = _edge_index("data.edge_index", data.edge_index)
    weights = {}
    if weight_attr is not None:
        if not (isinstance(weight_attr, str) and weight_attr in data and data.is_edge_attr(weight_attr)):
            raise ValueError(f"weight_attr={weight_attr!r} names no edge attribute of data "
                             f"(edge attributes: {sorted(data.edge_attrs())})")
        weights[HOMO] = data[weight_attr]
    out = PygGraph(False, ["node"], [HOMO], {"node": num_nodes}, {HOMO: (src, dst)}, weights)
    if time_attr is not None:
        known = time_attr in data
        kind = _time_kind(known and data.is_node_attr(time_attr), known and data.is_edge_attr(time_attr),
                          time_attr)
        if kind == "node":
            out.node_time = {"node": data[time_attr]}
        else:
            out.edge_time = {HOMO: data[time_attr]}
    return out


def _read_hetero(data, time_attr, weight_attr) -> PygGraph:
    node_types, edge_types = (list(x) for x in data.metadata())
    if not node_types and not edge_types:
        raise ValueError("data (HeteroData) has neither node nor edge types: nothing to sample")
    num_nodes, edges, weights = {}, {}, {}
    for t in node_types:
        if data[t].num_nodes is None:
            raise ValueError(f"data[{t!r}] has no num_nodes (set data[{t!r}].num_nodes or node features)")
        num_nodes[t] = int(data[t].num_nodes)
    for et in edge_types:
        store = data[et]
        if "edge_index" not in store:
            raise ValueError(f"data[{et!r}] has no edge_index: PygSampler samples a graph's edges")
        edges[et] = _edge_index(f"data[{et!r}].edge_index", store.edge_index)
        if weight_attr is not None and weight_attr in store:
            weights[et] = store[weight_attr]
    if weight_attr is not None and not weights:
        raise ValueError(f"weight_attr={weight_attr!r} names no edge attribute of any edge type of data")
    out = PygGraph(True, node_types, edge_types, num_nodes, edges, weights)
    if time_attr is not None:
        kind = _time_kind(any(time_attr in data[t] for t in node_types),
                          any(time_attr in data[et] for et in edge_types), time_attr)
        if kind == "node":
            out.node_time = {t: data[t][time_attr] for t in node_types if time_attr in data[t]}
        else:
            out.edge_time = {et: data[et][time_attr] for et in edge_types if time_attr in data[et]}
    return out


def _read_stores(feature_store, graph_store, time_attr) -> PygGraph:
    pyg = import_pyg()
    edge_attrs = graph_store.get_all_edge_attrs()
    if not edge_attrs:
        raise ValueError("graph_store holds no edge_index: PygSampler samples a graph's edges")
    tensor_attrs = feature_store.get_all_tensor_attrs()
    times = []
    if time_attr is not None:
        times = [attr for attr in tensor_attrs if attr.attr_name == time_attr]
        if not times:
            raise ValueError(f"The time attribute '{time_attr}' is neither a node-level or edge-level "
                             f"attribute")

    def full(attr):
        attr = type(attr)(attr.group_name, attr.attr_name, None)
        return feature_store.get_tensor(attr)

    if all(attr.edge_type is None for attr in edge_attrs):
        attr = edge_attrs[0]
        row, col, _ = graph_store.coo()
        size = attr.size
        if size is not None:
            num_nodes = max(size)
        else:
            num_nodes = int(max(row.max(), col.max())) + 1 if row.numel() else 0
        out = PygGraph(False, ["node"], [HOMO], {"node": int(num_nodes)},
                       {HOMO: (row.to(torch.int64), col.to(torch.int64))}, {})
        if times:  # PyG's rule for stores: attribute 'time' is node-level, any other name edge-level
            if time_attr == "time":
                out.node_time = {"node": full(times[0])}
            else:
                out.edge_time = {HOMO: full(times[0])}
        return out
    rows, cols, _ = graph_store.coo()
    edge_types = [attr.edge_type for attr in edge_attrs]
    node_types = sorted({g for g in (a.group_name for a in tensor_attrs) if isinstance(g, str)}
                        | {t for et in edge_types for t in (et[0], et[-1])})
    size = pyg.data.remote_backend_utils.size
    num_nodes = {t: int(size(feature_store, graph_store, t)) for t in node_types}
    edges = {et: (rows[et].to(torch.int64), cols[et].to(torch.int64)) for et in edge_types}
    out = PygGraph(True, node_types, edge_types, num_nodes, edges, {})
    if times:
        groups = [attr.group_name for attr in times]
        if all(isinstance(g, str) for g in groups):
            out.node_time = {attr.group_name: full(attr) for attr in times}
        elif all(isinstance(g, tuple) for g in groups):
            out.edge_time = {attr.group_name: full(attr) for attr in times}
        else:
            raise ValueError(f"Found time attribute '{time_attr}' for both node-level and edge-level types")
    return out
