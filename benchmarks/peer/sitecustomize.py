"""Run at every interpreter start of a peer-suite run (``benchmarks/peer_suites.sh`` puts this folder on
PYTHONPATH): DGL's tests ``import dgl`` in processes they spawn, where the plugin is not loaded, so the
GraphBolt stand-in of `graphrl.dglshim` goes in first (``import dgl`` fails without it on torch > 2.2)."""

from graphrl.dglshim import stub_graphbolt

stub_graphbolt()
