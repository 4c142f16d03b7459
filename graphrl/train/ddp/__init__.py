"""Data-parallel GNN training with ``torch.distributed``: one graph copy per machine, seeds split by rank.

Launch with ``torchrun`` (``torchrun --nproc_per_node=2 examples/ddp_recommender.py``), as DGL and PyG
users do; nothing here opens sockets or manages a cluster. The pieces, one module each:

- `process_group`: `init_distributed` joins the process group ``torchrun`` describes (or makes a
  one-process group, so a script also runs as plain ``python``) and returns a `DistContext`;
  `shutdown_distributed` leaves it;
- `shared_graph`: `share_graph` builds the graph once per machine on local rank 0 in the memory
  manager's ``shared`` tier (``/dev/shm``), attaches it on the other local ranks and unlinks the names
  once all have attached; it returns a `SharedGraph`;
- `batch_sampler`: `DistributedBatchSampler`, this rank's batches of ``range(M)`` by
  ``DistributedSampler``'s split (its drop/pad rule is documented there);
- `trainer`: `wrap_model` (``DistributedDataParallel`` around the single-process model),
  `ddp_bpr_step` (the BPR step with the ranks agreeing on a non-finite loss and on a stop) and
  `train_bpr_ddp` (the loop);
- `evaluate`: `evaluate_ddp`, recall@K / NDCG@K with the test users split over the ranks.

>>> ctx = init_distributed()                                         # doctest: +SKIP
>>> shared = share_graph(build, MemoryManager(), ctx)                # doctest: +SKIP
>>> batches = DistributedBatchSampler(link.num_pairs, 4096, rank=ctx.rank, world_size=ctx.world_size)
>>> stats = train_bpr_ddp(wrap_model(model, ctx), link, batches, minutes=3)   # doctest: +SKIP

References
----------
Li et al., "PyTorch Distributed: Experiences on Accelerating Data Parallel Training" (VLDB 2020) for
DDP; ``torch.utils.data.DistributedSampler`` for the seed split; DGL's and PyG's multi-GPU examples,
which share one graph per machine between the trainer processes.
"""

from graphrl.train.ddp.batch_sampler import DistributedBatchSampler
from graphrl.train.ddp.evaluate import evaluate_ddp
from graphrl.train.ddp.process_group import DistContext, init_distributed, shutdown_distributed
from graphrl.train.ddp.shared_graph import SharedGraph, share_graph
from graphrl.train.ddp.trainer import ddp_bpr_step, train_bpr_ddp, wrap_model

__all__ = [
    "DistContext",
    "DistributedBatchSampler",
    "SharedGraph",
    "ddp_bpr_step",
    "evaluate_ddp",
    "init_distributed",
    "share_graph",
    "shutdown_distributed",
    "train_bpr_ddp",
    "wrap_model",
]
