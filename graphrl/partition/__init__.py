"""Partitioned graphs: a graph split into P parts for owners on several hosts.

See docs/architecture.md#partitioned-graphs.

`assign_parts` chooses the part of every node (METIS through pymetis, or streaming LDG); `balance`
measures it; `write_partitions` writes a sealed partition folder (per part the CSC of the owned
destinations' in-edges, halo ids, features and labels of the owned nodes, id maps) and
`load_partition` / `load_book` / `verify` read it back verified. The samplers that read a folder
through owners live in `samplers.distributed`.

>>> write_partitions(graph, "parts/", 4, features=x, labels=y)      # doctest: +SKIP
>>> part = load_partition("parts/", 2, expect=graph_fingerprint(graph))  # doctest: +SKIP
"""

from graphrl.partition.assign import METHODS, assign_parts, balance, metis_available
from graphrl.partition.files import PartitionError
from graphrl.partition.folder import (
    MANIFEST,
    Partition,
    PartitionBook,
    graph_fingerprint,
    load_book,
    load_partition,
    verify,
    write_partitions,
)

__all__ = ["MANIFEST", "METHODS", "Partition", "PartitionBook", "PartitionError", "assign_parts",
           "balance", "graph_fingerprint", "load_book", "load_partition", "metis_available", "verify",
           "write_partitions"]
