"""HongTu's per-layer choice for intermediate data: keep a layer's activations on the host, or recompute.

A full-graph layer over host-resident vertex data saves, for its backward pass, about two [N, width]
tensors (its propagated output and its activation). `intermediate_plan` keeps them for the first
layers while they fit half the free bytes of the `FullGraph`'s vertex tier (`FullGraph.vertex_tier`:
host on the staged path; the other half is left to the layer outputs being computed), and
marks the rest ``"recompute"``: those layers run under ``torch.utils.checkpoint`` (the forward pass
is run again in the backward, saving only the layer's input). The choice is noted on the `FullGraph`,
whose ``traffic()["intermediate"]`` reports it. `run_layer` applies a choice.

References
----------
Wang et al., "HongTu: Scalable Full-Graph GNN Training on Multiple GPUs", SIGMOD 2024 (the
recomputation-caching hybrid for intermediate data); Chen et al., "Training Deep Nets with Sublinear
Memory Cost", 2016 (gradient checkpointing).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch.utils.checkpoint import checkpoint

from samplers.full_graph import FullGraph

__all__ = ["MODES", "intermediate_plan", "run_layer"]

MODES = ("auto", "keep", "recompute")


def intermediate_plan(fg: FullGraph, widths: Sequence[int], mode: str = "auto",
                      itemsize: int = 4) -> list[str]:
    """``"keep"`` or ``"recompute"`` per layer of output ``widths`` over ``fg``'s N nodes.

    Parameters
    ----------
    fg : FullGraph
    widths : sequence of int
        Output width of each layer.
    mode : {"auto", "keep", "recompute"}
        ``"auto"``: by the vertex tier's free bytes (see the module); the others force every layer.
    itemsize : int
        Bytes per activation item.

    Returns
    -------
    list of str
        One choice per layer, also noted on ``fg`` (`FullGraph.note_intermediates`).

    Raises
    ------
    ValueError
        An unknown ``mode``.
    """
    if mode not in MODES:
        raise ValueError(f"recompute must be one of {', '.join(map(repr, MODES))}, got {mode!r}")
    if mode != "auto":
        choices = [mode] * len(widths)
    else:
        room = fg.memory.free_bytes(fg.vertex_tier) // 2
        choices = []
        for w in widths:
            need = 2 * fg.num_nodes * int(w) * itemsize
            keep = need <= room
            room -= need if keep else 0
            choices.append("keep" if keep else "recompute")
    fg.note_intermediates(choices)
    return choices


def run_layer(layer: Callable[..., torch.Tensor], choice: str, *args: object) -> torch.Tensor:
    """``layer(*args)``, under ``torch.utils.checkpoint`` when ``choice == "recompute"`` and autograd is on.

    ``layer`` must be deterministic given its inputs (no random draws inside: dropout goes before it).
    """
    if choice == "recompute" and torch.is_grad_enabled():
        return checkpoint(layer, *args, use_reentrant=False)
    return layer(*args)
