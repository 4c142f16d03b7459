"""The layer loop: any sampling mode over plain and typed graphs, on the CPU and on CUDA.

A graph is a set of relations (a plain graph is one relation between nodes of one type). One layer
asks each relation's `samplers.modes.Mode` for the in-edges of the layer's destinations of the
relation's destination type (`LayerLoop.sample_relation`, the per-layer entry point), then relabels per
node type: the sources of type S are the layer's destinations of type S followed by the new nodes of
type S drawn through any relation, in first-occurrence order (relations in the graph's order); they
are the next layer's destinations. With times (temporal sampling) sources are (node, time) pairs and
take the time of the row that drew them. `LayerLoop.run` runs every layer, innermost first, and
returns the layers outermost first (`TypedLayer`; the samplers wrap them into blocks). On CUDA, a typed
graph given a `samplers.kernels.cuda.typed.TypedCsc` samples its uniform and weighted relations in one
launch per kernel and layer over all of them (`sample_typed_layer`), the others relation by relation.
Successive CUDA layers whose outputs are bounded (the modes' ``bounded_cuda``: uniform, temporal,
weighted at fanout >= 0 and LABOR layers) chain on the device: their sizes stay there and are
read back once, when the chain ends (counted in `traffic`). A typed graph's chained layer runs in one
launch per kernel where the `TypedCsc` takes every relation, else relation by relation
(`samplers.kernels.cuda.relation_chain`).

Keys: relation r of layer l of call c has the key ``mix(layer_key(seed, c, l) ^ (r + 1))`` (plain
graphs: ``layer_key(seed, c, l)``); the per-source variates of source type S (LABOR) use
``mix(base ^ ((S + 1) * GOLDEN))`` with ``base = layer_key(seed, c, l)`` (``l = 0`` with layer
dependency; plain graphs: ``base``), so every relation out of S shares them.

>>> loop = LayerLoop({rel: arrays}, {"n": num_nodes}, {rel: UniformMode()}, "cpu", typed=False)
>>> layers = loop.run({"n": seeds}, {rel: [10, 5]}, seed=0, call=0)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from samplers._csc import cuda_to_torch, edge_pairs
from samplers.block import Block, Blocks
from samplers.kernels import cpu
from samplers.kernels.reference import GOLDEN, MASK64, layer_key, mix
from samplers.modes.base import LayerEdges, LayerRequest, Mode

__all__ = ["PLAIN_NODE", "PLAIN_RELATION", "LayerLoop", "TypedLayer", "plain_blocks"]

PLAIN_NODE = "_N"
"""The node type of a plain graph seen as a typed one."""
PLAIN_RELATION = (PLAIN_NODE, "_E", PLAIN_NODE)
"""The one relation of a plain graph seen as a typed one."""


@dataclass
class TypedLayer:
    """One sampled layer, relabelled: torch tensors on the sampling device.

    Attributes
    ----------
    src_nodes : dict[str, Tensor int64 [S_t]]; dst_nodes : dict[str, Tensor int64 [D_t]] (prefixes)
    indptr : dict[Relation, Tensor int64 [D_dst + 1]]; indices : dict[Relation, Tensor int64 [nnz]]
    (local source positions); edge_ids : dict[Relation, Tensor int64 [nnz]]
    edge_weights : dict[Relation, Tensor float32 [nnz]] or None (modes that weight edges)
    src_times : dict[str, Tensor] or None (temporal sampling)
    """

    src_nodes: dict
    dst_nodes: dict
    indptr: dict
    indices: dict
    edge_ids: dict
    edge_weights: dict | None = None
    src_times: dict | None = None


def plain_blocks(layers: list[TypedLayer]) -> Blocks:
    """The `Blocks` of a plain graph's layers (`PLAIN_NODE`, `PLAIN_RELATION`)."""
    n, r = PLAIN_NODE, PLAIN_RELATION
    out = Blocks()
    for x in layers:
        out.append(Block(src_nodes=x.src_nodes[n], dst_nodes=x.dst_nodes[n], indptr=x.indptr[r],
                         indices=x.indices[r], edge_ids=x.edge_ids[r],
                         src_times=None if x.src_times is None else x.src_times[n],
                         edge_weights=None if x.edge_weights is None else x.edge_weights[r]))
    return out


class LayerLoop:
    """Sample layers of a (typed) graph with one mode per relation, on ``device``.

    Parameters
    ----------
    relations : mapping Relation -> RelationArrays
        The sampled relations, in the graph's order (a plain graph: one relation).
    num_nodes : mapping str -> int
        Nodes per type.
    modes : mapping Relation -> Mode
        Each relation's mode.
    device : str
        ``"cpu"`` or ``"cuda"`` (the relations then carry their `CudaGraph`).
    typed : bool
        Derive keys per relation and per source type (False: a plain graph's keys, see the module).
    relation_index : mapping Relation -> int or None
        The position of each relation among all of the graph's (its key); default the order given.
    typed_csc : samplers.kernels.cuda.typed.TypedCsc or None
        CUDA, typed graphs: the concatenated CSC of the relations (uniform or weighted modes, as its
        ``weighted`` says) that a layer samples in one launch per kernel.

    Raises
    ------
    ValueError
        ``typed_csc`` on the CPU or a plain graph, or with a relation whose mode is not uniform (weighted:
        not weighted) or not among ``relations``.
    """

    def __init__(self, relations: Mapping, num_nodes: Mapping[str, int], modes: Mapping[Any, Mode],
                 device: str, typed: bool = True, relation_index: Mapping | None = None,
                 typed_csc: Any = None) -> None:
        self.relations = dict(relations)
        self.num_nodes = dict(num_nodes)
        self.modes = dict(modes)
        self.device = device
        self.typed = bool(typed)
        self.index = dict(relation_index) if relation_index is not None else \
            {rel: r for r, rel in enumerate(self.relations)}
        self.type_index = {t: i for i, t in enumerate(self.num_nodes)}
        if device == "cpu":  # the CPU gather's (source, edge id) pairs, once (8 bytes per edge)
            for arr in self.relations.values():
                if arr.pairs is None:  # else handed in: a pickled sampler's, or another loop's
                    arr.pairs = edge_pairs(arr.indices, arr.edge_ids, arr.num_src)
        self.states = {rel: self.modes[rel].prepare(arr, device) for rel, arr in self.relations.items()}
        self.maps: dict[str, np.ndarray] = {}
        """CPU relabelling maps per node type (int32 [N_t], all -1 between layers), made on first use."""
        self.workspace = None
        """A plain graph's CPU `samplers.kernels.cpu.Workspace` (fused layers relabel through it)."""
        if device == "cpu" and not typed:
            (arr,) = self.relations.values()
            self.workspace = cpu.Workspace(next(iter(self.num_nodes.values())), arr.indices.dtype)
        self.traffic = None
        """On CUDA: the `samplers.kernels.cuda.workspace.HostTraffic` of this loop's chained layers
        (read-backs, allocations, copies), counted by its workspaces, one per stream it ran on."""
        self.cuda_workspaces: dict[int, Any] = {}
        if device == "cuda":
            from samplers.kernels.cuda.workspace import HostTraffic

            self.traffic = HostTraffic()
        self.sampled_edges = 0
        """Edges sampled by this loop so far."""
        self.typed_csc = typed_csc
        if typed_csc is not None:
            self._check_typed_csc(typed_csc)
        self.launches: Counter = Counter()
        """Launches of the fused typed path so far, by kernel (``"plan"``, ``"scan"``, ``"rows"``)."""

    def _check_typed_csc(self, csc: Any) -> None:
        if self.device != "cuda" or not self.typed:
            raise ValueError(f"typed_csc is for typed graphs on CUDA, got device={self.device!r}, "
                             f"typed={self.typed}")
        for rel in csc.relations:
            want = "weighted" if csc.weighted[rel] else "uniform"
            got = self.modes[rel].name if rel in self.modes else None
            if got != want:
                raise ValueError(f"typed_csc: relation {rel!r} is {want} in the concatenated CSC but its "
                                 f"mode is {got!r}")

    # ------------------------------------------------------------------------------------------------
    # keys

    def relation_key(self, rel, seed: int, call: int, layer: int) -> int:
        """The key of relation ``rel``'s rows at (call, layer)."""
        base = layer_key(seed, call, layer)
        return mix(base ^ (self.index[rel] + 1)) if self.typed else base

    def variate_key(self, src_type: str, seed: int, call: int, layer: int) -> int:
        """The key of the per-source variates of ``src_type`` at (call, layer)."""
        base = layer_key(seed, call, layer)
        return mix(base ^ (((self.type_index[src_type] + 1) * GOLDEN) & MASK64)) if self.typed else base

    # ------------------------------------------------------------------------------------------------
    # one relation, one layer: the per-layer entry point

    def sample_relation(self, rel, request: LayerRequest) -> LayerEdges:
        """The sampled in-edges of ``request.dst`` through relation ``rel`` (not relabelled): host arrays
        on the CPU, device arrays on CUDA."""
        mode = self.modes[rel]
        if self.device == "cpu":
            return mode.sample_cpu(self.relations[rel], self.states[rel], request)
        return mode.sample_cuda(self.relations[rel], self.states[rel], request)

    # ------------------------------------------------------------------------------------------------
    # every layer

    def run(self, seeds: Mapping[str, Any], fanouts: Mapping[Any, list[int]], seed: int, call: int, *,
            excluded: Mapping | None = None, seed_times: Mapping | None = None, threads: int = 1,
            layer_dependency: bool = False) -> list[TypedLayer]:
        """Sample ``len(fanouts[rel])`` layers for ``seeds`` (per type; host int64 arrays, or device arrays
        on CUDA), outermost first.

        ``excluded`` maps relations to sorted CSC positions never drawn (host or device arrays; on CUDA
        copied to the device once per call); ``seed_times`` maps types to the seeds' times (temporal
        sampling; -0.0 folded into 0.0 by the caller). On CUDA, a chain whose layer kept more edges than
        its capacity (`samplers.kernels.cuda.layer.ChainOverflow`: a chained LABOR layer) is sampled
        again without chaining, the same edges (counted in ``traffic.chain_overflows``).
        """
        args = (seeds, fanouts, seed, call, excluded, seed_times, threads, layer_dependency)
        if self.device != "cuda":
            return self._run(*args, chain=False)
        from samplers.kernels.cuda.layer import ChainOverflow

        before = self.sampled_edges
        try:
            return self._run(*args, chain=True)
        except ChainOverflow:
            self.sampled_edges = before
            self.traffic.chain_overflows += 1
            return self._run(*args, chain=False)

    def _run(self, seeds: Mapping[str, Any], fanouts: Mapping[Any, list[int]], seed: int, call: int,
             excluded: Mapping | None, seed_times: Mapping | None, threads: int, layer_dependency: bool, *,
             chain: bool) -> list[TypedLayer]:
        """`run`; ``chain``: bounded CUDA layers chain on the device (else each reads its sizes back)."""
        num_layers = len(next(iter(fanouts.values())))
        dst = {t: seeds[t] for t in self.num_nodes}
        times = None if seed_times is None else {t: seed_times[t] for t in self.num_nodes}
        excluded = excluded or {}
        fused_excluded = None
        if self.device == "cuda" and excluded:  # on the device once per call (host arrays staged page-locked)
            ws = self.cuda_workspace()
            if self.typed_csc is not None:
                fused_excluded = self.typed_csc.excluded(excluded, ws)  # concatenated positions
            excluded = {rel: ws.device_ids(pos, f"excluded_{rel}") for rel, pos in excluded.items()}
        if self.typed_csc is not None and fused_excluded is None:
            fused_excluded = self.typed_csc.excluded({})
        out = []
        pending: list = []  # CUDA layers chained on the device, their sizes not read yet
        for layer in range(num_layers - 1, -1, -1):
            vlayer = 0 if layer_dependency else layer

            def request(rel, dst=dst, times=times, layer=layer, vlayer=vlayer) -> LayerRequest:
                rel_times = None if times is None or self.relations[rel].times is None else times[rel[2]]
                key = self.relation_key(rel, seed, call, layer)  # a plain graph's variates share it
                return LayerRequest(dst=dst[rel[2]], fanout=fanouts[rel][layer], key=key,
                                    variate_key=key if vlayer == layer and not self.typed else
                                    self.variate_key(rel[0], seed, call, vlayer),
                                    excluded=excluded.get(rel), dst_times=rel_times, threads=threads,
                                    next_fanout=fanouts[rel][layer - 1] if layer else None)

            if self.workspace is not None:  # a plain graph on the CPU: the mode's fused pass, if it has one
                (rel,) = self.relations
                fused = self.modes[rel].sample_block_cpu(self.relations[rel], self.states[rel], request(rel),
                                                         self.workspace)
                if fused is not None:
                    block, dst, times = self._fused_layer(rel, dst[rel[2]].shape[0], fused)
                    out.append(block)
                    continue
            if chain and self.typed and self.device == "cuda":  # a typed graph on CUDA: chained if bounded
                block = self._typed_chain_layer(dst, times, pending, fanouts, layer, seed, call, request,
                                                fused_excluded)
                if block is not None:
                    pending.append(block)
                    dst = block.next_rows
                    times = None if times is None else {t: r.times for t, r in dst.items()}
                    continue
                if pending:  # the chain before this layer is read first: its rows' counts are needed here
                    dst, times = self._read_typed(pending, out)
            if not self.typed and self.traffic is not None:  # a plain graph on CUDA: the mode's fused layer
                (rel,) = self.relations
                ws = self.cuda_workspace()
                if chain and self.modes[rel].bounded_cuda(self.relations[rel], fanouts[rel][layer]):
                    req = request(rel)
                    if not pending:  # a chain starts: the rows' count goes to the device
                        from samplers.kernels.cuda.layer import start_rows

                        req = replace(req, dst=start_rows(req.dst, ws, layer + 1, req.dst_times))
                    pending.append(self.modes[rel].sample_block_cuda(self.relations[rel], self.states[rel],
                                                                     req, ws))
                    dst = {rel[2]: pending[-1].next_rows}
                    times = None if times is None else {rel[2]: pending[-1].src_times}
                    continue
                if pending:  # the chain before this layer is read first: its rows' count is needed here
                    dst, times = self._read_pending(rel, pending, ws, out)
                fused = self.modes[rel].sample_block_cuda(self.relations[rel], self.states[rel],
                                                          request(rel, dst, times), ws)
                if fused is not None:
                    block, dst, times = self._fused_cuda_layer(rel, int(dst[rel[2]].shape[0]), fused)
                    out.append(block)
                    continue
            fused, joined = self._sample_fused(dst, fanouts, layer, seed, call, fused_excluded)
            sampled = {rel: fused[rel] if rel in fused else
                       self.sample_relation(rel, request(rel, dst, times)) for rel in self.relations}
            block, dst, times = self._relabel(dst, times, sampled, joined)
            out.append(block)
        if pending and self.typed:
            self._read_typed(pending, out)  # (the last layer's sources are not needed)
        elif pending:
            (rel,) = self.relations
            self._read_pending(rel, pending, self.cuda_workspace(), out)
        out.reverse()
        return out

    def _typed_requests(self, fanouts: Mapping, layer: int, seed: int, call: int) -> list:
        """The `samplers.kernels.cuda.typed.TypedRequest` of each relation of the typed CSC that takes
        this layer's fanout, grouped by source type (graph order within a type)."""
        from samplers.kernels.cuda.typed import TypedRequest

        csc = self.typed_csc
        requests = [TypedRequest(rel, fanouts[rel][layer], self.relation_key(rel, seed, call, layer),
                                 self.modes[rel].replace)
                    for rel in csc.relations if csc.fits(rel, fanouts[rel][layer], self.modes[rel].replace)]
        requests.sort(key=lambda req: self.type_index[req.relation[0]])  # stable: graph order within a type
        return requests

    def _typed_chain_layer(self, dst: dict, times: dict | None, pending: list, fanouts: Mapping, layer: int,
                           seed: int, call: int, request: Any, excluded: Any) -> Any:
        """A typed layer chained on the device, or None where one of its relations cannot chain: in one
        launch per kernel where the typed CSC takes every relation (`samplers.kernels.cuda.typed.
        sample_typed_bounded`), else relation by relation through the modes (`samplers.kernels.cuda.
        relation_chain`). ``dst`` (and ``times``) the seeds' when the chain starts, else the previous
        layer's rows."""
        from samplers.kernels.cuda.relation_chain import sample_relations_bounded
        from samplers.kernels.cuda.typed import sample_typed_bounded
        from samplers.kernels.cuda.typed_chain import start_typed_rows

        csc, requests = self.typed_csc, None
        if csc is not None and times is None:
            requests = self._typed_requests(fanouts, layer, seed, call)
            if len(requests) != len(self.relations) or not all(
                    csc.bounded(r.relation, r.fanout, r.replace) for r in requests):
                requests = None
        rels = sorted(self.relations, key=lambda rel: self.type_index[rel[0]])  # stable: graph order by type
        if requests is None and not all(  # a relation of the typed CSC chains only where the CSC bounds it
                csc.bounded(rel, fanouts[rel][layer], self.modes[rel].replace)
                if csc is not None and rel in csc.relations
                else self.modes[rel].bounded_cuda(self.relations[rel], fanouts[rel][layer]) for rel in rels):
            return None
        ws = self.cuda_workspace()
        if not pending:  # a chain starts: the rows' counts go to the device
            dst = start_typed_rows({t: dst[t] for t in self.num_nodes}, ws, len(self.relations), layer + 1,
                                   None if times is None else {t: times[t] for t in self.num_nodes})
            at = len(self.num_nodes)
        else:
            at = pending[-1].end
        if requests is not None:
            return sample_typed_bounded(csc, dst, requests, excluded, ws, at, self.launches)

        def sample(k: int, rel: Any, scratch: str) -> Any:
            req = replace(request(rel), dst=dst[rel[2]])
            return self.modes[rel].sample_edges_cuda(self.relations[rel], self.states[rel], req, ws, scratch)

        return sample_relations_bounded(rels, sample, dst, ws, at)

    def _read_typed(self, pending: list, out: list) -> tuple[dict, dict | None]:
        """The chained typed layers, their sizes read back in one copy, appended to ``out`` (pending
        emptied); returns the next layer's destinations (device ids per type) and their times or None."""
        from samplers.kernels.cuda.typed_chain import read_typed

        dst, times = {}, None
        for src_nodes, count, indptr, local, eids, src_times, weights in read_typed(pending,
                                                                                     self.cuda_workspace()):
            self.sampled_edges += sum(int(v.shape[0]) for v in local.values())
            nodes = {t: cuda_to_torch(v) for t, v in src_nodes.items()}
            out.append(TypedLayer(src_nodes=nodes, dst_nodes={t: v[:count[t]] for t, v in nodes.items()},
                                  indptr={rel: cuda_to_torch(v) for rel, v in indptr.items()},
                                  indices={rel: cuda_to_torch(v) for rel, v in local.items()},
                                  edge_ids={rel: cuda_to_torch(v) for rel, v in eids.items()},
                                  edge_weights=None if weights is None else
                                  {rel: cuda_to_torch(v).to(torch.float32) for rel, v in weights.items()},
                                  src_times=None if src_times is None else
                                  {t: cuda_to_torch(v) for t, v in src_times.items()}))
            dst, times = src_nodes, src_times
        pending.clear()
        return dst, times

    def _read_pending(self, rel, pending: list, ws: Any, out: list) -> tuple[dict, dict | None]:
        """The chained layers' blocks, their sizes read back in one copy, appended to ``out`` (pending
        emptied); returns the next layer's destinations and their times (temporal) or None."""
        from samplers.kernels.cuda.layer import read_blocks

        dst = times = None
        for block in read_blocks(pending, ws):
            layer, dst, times = self._fused_cuda_layer(rel, int(block[0].shape[0]) - 1, block)
            out.append(layer)
        pending.clear()
        return dst, times

    def _sample_fused(self, dst: dict, fanouts: Mapping, layer: int, seed: int, call: int,
                      excluded: Any) -> tuple[dict, dict]:
        """The relations of one layer that the typed CSC takes, sampled in one launch per kernel: their
        `LayerEdges`, and per source type the relations whose sources are joined in one view (requests
        grouped by source type, in the graph's order within a type)."""
        csc = self.typed_csc
        if csc is None:
            return {}, {}
        from samplers.kernels.cuda.typed import sample_typed_layer

        requests = self._typed_requests(fanouts, layer, seed, call)
        if not requests:
            return {}, {}
        out = sample_typed_layer(csc, dst, requests, excluded, self.launches, self.cuda_workspace())
        return {rel: LayerEdges(*edges) for rel, edges in out.edges.items()}, out.sources

    def cuda_workspace(self) -> Any:
        """A plain graph on CUDA: this loop's `samplers.kernels.cuda.workspace.CudaWorkspace` for torch's
        current stream (made on first use, its regions from the graph's `CudaMemory`; scratch is reused
        only by work ordered on one stream)."""
        from samplers.kernels.cuda.launch import kernel_stream, stream_handle
        from samplers.kernels.cuda.workspace import CudaWorkspace

        stream = kernel_stream()
        handle = stream_handle(stream) if hasattr(stream, "handle") or isinstance(stream, int) else id(stream)
        ws = self.cuda_workspaces.get(handle)
        if ws is None:
            if len(self.cuda_workspaces) >= 4:  # the oldest goes (its scratch regions are freed with it)
                del self.cuda_workspaces[next(iter(self.cuda_workspaces))]
            graphs = [arr.cuda for arr in self.relations.values() if arr.cuda is not None]
            graph = self.typed_csc.graph if self.typed_csc is not None else graphs[0] if graphs else None
            memory = None if graph is None else graph.memory
            ws = self.cuda_workspaces[handle] = CudaWorkspace(self.traffic, memory)
        return ws

    def _fused_cuda_layer(self, rel, d_count: int, fused: tuple) -> tuple:
        """A plain graph's layer of ``d_count`` rows from a mode's fused CUDA layer (``(out_indptr,
        src_nodes, local, eids)``, then ``src_times`` or None and device float64 edge weights or None):
        (the layer, next destinations, their times or None)."""
        out_indptr, src_nodes, local, eids, *rest = fused
        src_times = rest[0] if rest else None
        weights = rest[1] if len(rest) > 1 else None
        t = rel[0]
        self.sampled_edges += int(local.shape[0])
        nodes = cuda_to_torch(src_nodes)
        layer = TypedLayer(src_nodes={t: nodes}, dst_nodes={t: nodes[:d_count]},
                           indptr={rel: cuda_to_torch(out_indptr)}, indices={rel: cuda_to_torch(local)},
                           edge_ids={rel: cuda_to_torch(eids)},
                           edge_weights=None if weights is None else
                           {rel: cuda_to_torch(weights).to(torch.float32)},
                           src_times=None if src_times is None else {t: cuda_to_torch(src_times)})
        return layer, {t: src_nodes}, None if src_times is None else {t: src_times}

    def _fused_layer(self, rel, d_count: int, fused: tuple) -> tuple:
        """A plain graph's layer of ``d_count`` rows from a mode's fused CPU pass: (the layer, next
        destinations, times). The destinations wrap the sources' host prefix view (the same memory)."""
        out_indptr, src_nodes, local, eids, src_times = fused
        t = rel[0]
        self.sampled_edges += local.shape[0]
        wrap = torch.from_numpy
        layer = TypedLayer(src_nodes={t: wrap(src_nodes)}, dst_nodes={t: wrap(src_nodes[:d_count])},
                           indptr={rel: wrap(out_indptr)}, indices={rel: wrap(local)},
                           edge_ids={rel: wrap(eids)},
                           src_times=None if src_times is None else {t: wrap(src_times)})
        return layer, {t: src_nodes}, None if src_times is None else {t: src_times}

    def _relabel(self, dst: dict, times: dict | None, sampled: dict[Any, LayerEdges],
                 joined: Mapping | None = None) -> tuple:
        """Relabel one layer per source type: (the layer, next destinations, their times or None).
        ``joined`` maps a source type to (relations, their sources in one view): used as they are when
        the relations are the type's (CUDA)."""
        on_cpu = self.device == "cpu"
        as_torch = torch.from_numpy if on_cpu else cuda_to_torch
        if not on_cpu:
            from samplers.kernels import cuda as ck
        src_nodes, src_times, local, next_dst, next_times = {}, {}, {}, {}, {}
        for t in self.num_nodes:
            rels = [rel for rel in sampled if rel[0] == t]
            parts = [sampled[rel].src for rel in rels]
            sizes = [int(p.shape[0]) for p in parts]
            if on_cpu:
                flat = np.concatenate(parts) if parts else np.empty(0, np.int64)
                if times is None:
                    if t not in self.maps:
                        self.maps[t] = np.full(self.num_nodes[t], -1, dtype=np.int32)
                    nodes, loc = cpu.relabel(dst[t], flat, self.maps[t])
                else:  # a source takes the time of the row (of the relation's destination type) that drew it
                    tk = [np.repeat(cpu.time_keys(times[rel[2]]), np.diff(sampled[rel].indptr))
                          for rel in rels]
                    flat_tk = np.concatenate(tk) if tk else np.empty(0, np.int64)
                    nodes, tkeys, loc = cpu.relabel_pairs(dst[t], cpu.time_keys(times[t]), flat, flat_tk)
                    next_times[t] = cpu.from_time_keys(tkeys, times[t].dtype)
            else:
                if joined and t in joined and joined[t][0] == tuple(rels):
                    flat = joined[t][1]  # the fused layer's sources of this type, one view
                else:
                    flat = ck.concat(parts, parts[0].dtype if parts else np.int64)
                if times is None:
                    nodes, loc = ck.relabel_cuda(dst[t], flat)
                else:
                    tkeys = ck.empty(sum(sizes), np.int64)
                    at = 0
                    for rel, n in zip(rels, sizes, strict=True):
                        ck.edge_time_keys_cuda(sampled[rel].indptr, times[rel[2]], tkeys[at:at + n])
                        at += n
                    nodes, next_times[t], loc = ck.relabel_pairs_cuda(dst[t], times[t], flat, tkeys)
            if times is not None:
                src_times[t] = as_torch(next_times[t])
            next_dst[t] = nodes
            src_nodes[t] = as_torch(nodes)
            loc_t = as_torch(loc)
            at = 0
            for rel, n in zip(rels, sizes, strict=True):
                local[rel] = loc_t[at:at + n]
                at += n
        self.sampled_edges += sum(int(v.src.shape[0]) for v in sampled.values())
        weights = {rel: as_torch(v.weights).to(torch.float32) for rel, v in sampled.items()
                   if v.weights is not None}
        layer = TypedLayer(src_nodes=src_nodes,
                           dst_nodes={t: src_nodes[t][: int(dst[t].shape[0])] for t in src_nodes},
                           indptr={rel: as_torch(v.indptr) for rel, v in sampled.items()},
                           indices=local,
                           edge_ids={rel: as_torch(v.edge_ids) for rel, v in sampled.items()},
                           edge_weights=weights or None,
                           src_times=None if times is None else src_times)
        return layer, next_dst, None if times is None else next_times
