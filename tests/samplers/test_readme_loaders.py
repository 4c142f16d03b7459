"""The README's "PyG and DGL loaders" block runs as written (it loads Cora itself), and its loaders yield
batches whose seeds and edges are Cora's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch


@pytest.mark.slow
def test_the_readme_pyg_and_dgl_loader_block_runs(data_root, monkeypatch):
    pytest.importorskip("torch_geometric")
    from graphrl.dglshim import import_dgl

    try:
        import_dgl()
    except ImportError as err:
        pytest.skip(f"the dgl extra is not installed: {err}")
    monkeypatch.setenv("GRAPHRL_DATA", str(data_root))
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", readme, re.S) if "DglSampler(fanouts=" in b]
    ns: dict = {}
    exec(compile(block, "README.md", "exec"), ns)  # the DGL loop runs to its end
    ds, data = ns["ds"], ns["data"]
    assert data.num_nodes == 2708 and data.edge_index.shape == (2, ds.graph.num_edges)
    # the PyG data holds our graph's edges: as many into each node as its in-degree
    e = data.edge_index
    assert torch.equal(torch.bincount(e[1], minlength=2708), ds.graph.in_degrees())
    batch = next(iter(ns["loader"]))
    assert torch.equal(batch.n_id[:batch.batch_size], ds.train_mask.nonzero().squeeze(1)[:batch.batch_size])
    assert torch.equal(batch.y[:batch.batch_size], ds.labels[batch.n_id[:batch.batch_size]])
    sub = batch.n_id[batch.edge_index]  # sampled edges, global ids: each an edge of Cora
    keys = set((e[0] * 2708 + e[1]).tolist())
    assert set((sub[0] * 2708 + sub[1]).tolist()) <= keys
    links = next(iter(ns["links"]))
    assert links.edge_label_index.shape[1] == 2048 and int(links.edge_label.sum()) == 1024  # 1024 + negatives
    input_nodes, output_nodes, blocks = next(iter(ns["dl"]))
    assert torch.equal(output_nodes, ns["train_nids"][:output_nodes.numel()])
    assert len(blocks) == 2 and torch.equal(blocks[-1].dstdata["_ID"], output_nodes)
