"""Core numba kernels both engines and `graphrl.nn` share: byte copies, prefetch, huge pages, the thread
team, and SpMM.

- `graphrl.kernels.copies`: `copy_bytes`, `zero_bytes`, `stream_bytes` (non-temporal stores),
  `copy_auto`, `store_fence`, `address`, and `copy`, the checked Python entry.
- `graphrl.kernels.prefetch`: `prefetch`, `prefetch_l2` and `prefetch_l2_at` hints for loops of random
  reads.
- `graphrl.kernels.huge_pages`: `advise_huge_pages`, `huge_page_bytes`, `huge_pages_advised`, `HUGE_PAGE`.
- `graphrl.kernels.team`: `parallel_for`, `Chunks` and `engaged` (dynamic chunk claiming by the
  caller and daemon helper threads; no OpenMP fork-join).
- `graphrl.kernels.spmm`: sparse (CSR) times dense products, `spmm_partition`, `csr_transpose`,
  `normalized_adjacency` (import it as ``from graphrl.kernels.spmm import ...``; not re-exported here).

Kernels take arrays and return arrays. This is core code: it imports neither engine
(docs/architecture.md#layers). How each kernel was tuned: docs/performance.md.

>>> import numpy as np
>>> from graphrl.kernels import copy, parallel_for
>>> a = np.arange(100, dtype=np.uint8); b = np.zeros(100, dtype=np.uint8)
>>> _ = copy(b, a, nbytes=100); bool((a == b).all())
True
"""

from graphrl.kernels.copies import (
    LINE,
    STREAM_THRESHOLD,
    address,
    copy,
    copy_auto,
    copy_bytes,
    store_fence,
    stream_bytes,
    stream_bytes_nofence,
    stream_line_nofence,
    zero_bytes,
)
from graphrl.kernels.huge_pages import HUGE_PAGE, advise_huge_pages, huge_page_bytes, huge_pages_advised
from graphrl.kernels.prefetch import prefetch, prefetch_l2
from graphrl.kernels.team import Chunks, engaged, parallel_for

__all__ = [
    "HUGE_PAGE",
    "LINE",
    "STREAM_THRESHOLD",
    "Chunks",
    "address",
    "advise_huge_pages",
    "copy",
    "copy_auto",
    "copy_bytes",
    "engaged",
    "huge_page_bytes",
    "huge_pages_advised",
    "parallel_for",
    "prefetch",
    "prefetch_l2",
    "store_fence",
    "stream_bytes",
    "stream_bytes_nofence",
    "stream_line_nofence",
    "zero_bytes",
]
