"""Where a feature table lives: the tier it is placed on, and transparent huge pages for host tables.

`place_table` puts the rows of a `samplers.features.FeatureStore` into a memory-manager region on a
tier the gather reads, chosen by the device the store serves and by where the manager's device tier
lives (`device_tier_is_host`, never by whether the machine has CUDA):

- a GPU gather: ``device``, then ``pinned`` (read in place through UVA);
- a CPU gather over a manager whose device tier is host memory (no CUDA, or ``MemoryManager(device=
  "cpu")``): ``device``, ``pinned``, ``host``;
- a CPU gather over a manager whose device tier is GPU memory: ``host``, then ``pinned`` (the CPU reads
  both alike; plain host memory can go on huge pages and leaves page-locked memory to copies).

Without a manager the table is the caller's tensor itself (page-locked in place for a GPU gather).
`cache_tier_for` and `staging_tiers` give the tiers of the hot-row cache and of a gather's staging
buffers by the same rule (docs/architecture.md#memory-tiers).

Huge pages: a host table of `HUGE_TABLE_BYTES` (32 MiB) or more that a CPU gather reads goes on 2 MiB
transparent huge pages (`graphrl.kernels.advise_huge_pages`): a region is advised before the table is
written into it, and a table used in place is collapsed once (the kernel copies it). Linux in THP
``madvise`` mode gives huge pages only to memory that asks; page-locked, shared or file-mapped memory
(``numpy.memmap``) stays as it is, and so does any table where THP is off.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from graphrl.kernels import advise_huge_pages
from graphrl.memory import MemoryManager, Region, Tier

__all__ = ["HUGE_TABLE_BYTES", "advise_huge_table", "cache_tier_for", "device_tier_is_host",
           "place_table", "staging_tiers", "wants_huge_pages"]

logger = logging.getLogger(__name__)

HUGE_TABLE_BYTES = 32 << 20
"""Host tables of at least this many bytes go on transparent huge pages (``huge_pages=True``): below it
the 4 KiB pages' translations fit the second-level TLB (2048 entries, 8 MiB) or nearly."""


def wants_huge_pages(tensor: torch.Tensor, enabled: bool, device: torch.device) -> bool:
    """Whether rows a ``device`` gather reads from ``tensor`` should go on huge pages (plain host memory
    of at least `HUGE_TABLE_BYTES`, a CPU gather, ``enabled``)."""
    return (enabled and device.type == "cpu" and tensor.device.type == "cpu" and not tensor.is_pinned()
            and tensor.numel() * tensor.element_size() >= HUGE_TABLE_BYTES)


def advise_huge_table(tensor: torch.Tensor, enabled: bool, device: torch.device) -> None:
    """Advise ``tensor``'s memory onto huge pages before it is written, where `wants_huge_pages` says so."""
    if wants_huge_pages(tensor, enabled, device):
        advise_huge_pages(tensor.data_ptr(), tensor.numel() * tensor.element_size())


def device_tier_is_host(memory: MemoryManager, owner: str) -> bool:
    """Whether ``memory``'s device tier is host memory (no CUDA, or ``MemoryManager(device="cpu")``).

    Asks the manager itself with an empty region on the device tier (owner ``f"{owner}.table"``, freed
    at once), as `samplers.full_graph.FullGraph` does; a device tier that cannot even give that (a CUDA
    device named where torch has none) counts as not host memory.
    """
    try:
        probe = memory.allocate(0, torch.uint8, Tier.DEVICE, owner=f"{owner}.table")
    except (RuntimeError, AssertionError, MemoryError):  # torch without CUDA asked for a CUDA device
        return False
    try:
        return str(probe.device).startswith("cpu")
    finally:
        probe.free()


def cache_tier_for(device: torch.device, host_device_tier: bool) -> Tier:
    """Tier of the hot-row cache: the device tier for a GPU gather, and for a CPU gather where the device
    tier is host memory; plain host memory for a CPU gather over a GPU device tier."""
    if device.type == "cuda" or host_device_tier:
        return Tier.DEVICE
    return Tier.HOST


def staging_tiers(device: torch.device) -> tuple[Tier, tuple[Tier, ...]]:
    """Tier and fallback of a gather's staging buffers: device memory for a GPU gather, else pinned
    (host memory where it does not fit or there is no CUDA)."""
    if device.type == "cuda":
        return Tier.DEVICE, ()
    return Tier.PINNED, (Tier.HOST,)


def place_table(x: torch.Tensor, memory: MemoryManager | None, private: MemoryManager, owner: str,
                device: torch.device, tier: Any, fallback: Any, huge_pages: bool, host_device_tier: bool,
                regions: list[Region]) -> tuple[torch.Tensor, str]:
    """Place the feature table: returns ``(table, tier name)``.

    Parameters
    ----------
    x : torch.Tensor, shape [N, *row]
    memory : MemoryManager or None
        The manager to copy ``x`` into (owner ``f"{owner}.table"``); None uses ``x`` in place, page-locked
        through ``private`` for a GPU gather.
    private : MemoryManager
        The store's own manager (registers ``x`` in place when ``memory`` is None).
    owner : str
    device : torch.device
        Where the gather runs.
    tier, fallback : Tier or str or None, sequence of those or None
        Tier of the table and tiers tried after it; None: as in the module docstring.
    huge_pages : bool
    host_device_tier : bool
        Whether ``memory``'s device tier is host memory (`device_tier_is_host`); a CPU gather then
        tries it first.
    regions : list of Region
        Every region allocated is appended here at once (the caller frees them, also on an error).

    Raises
    ------
    ValueError
        The table landed on a tier the gather cannot read (disk, or host memory for a GPU gather).
    MemoryBudgetError
        It fits no tier tried.
    """
    gpu = device.type == "cuda"
    if memory is None:
        table = x.contiguous()
        if gpu and table.device.type == "cpu" and not table.is_pinned():
            # page-lock x in place (cudaHostRegister) so that the GPU kernel reads it through UVA
            region = private.register(table, Tier.PINNED, owner=f"{owner}.table")
            regions.append(region)
            table = region.tensor()
        elif not gpu and table.device.type != "cpu":
            table = table.cpu()
        if wants_huge_pages(table, huge_pages, device):
            # x is already written: collapse its pages into huge pages in place (same contents)
            t0, nbytes = time.perf_counter(), table.numel() * table.element_size()
            if advise_huge_pages(table.data_ptr(), nbytes, collapse=True):
                logger.info("feature table (%.2f GiB) collapsed onto huge pages in place in %.2f s "
                            "(huge_pages=False skips this)", nbytes / 2**30, time.perf_counter() - t0)
        where = "device" if table.device.type == "cuda" else ("pinned" if table.is_pinned() else "host")
        return table, where
    if tier is None:
        if gpu:
            tier, default_fallback = Tier.DEVICE, (Tier.PINNED,)
        elif host_device_tier:
            tier, default_fallback = Tier.DEVICE, (Tier.PINNED, Tier.HOST)
        else:
            tier, default_fallback = Tier.HOST, (Tier.PINNED,)
        fallback = default_fallback if fallback is None else fallback
    region = memory.allocate(tuple(x.shape), x.dtype, tier, owner=f"{owner}.table",
                             fallback=() if fallback is None else fallback)
    regions.append(region)
    if region.tier is Tier.DISK:
        raise ValueError("the feature table cannot live on the disk tier (rows are read in place)")
    huge = wants_huge_pages(region.tensor(), huge_pages, device)
    if huge:  # before the first write, so that the pages are faulted in as huge pages
        advise_huge_pages(region.tensor().data_ptr(), region.nbytes)
    region.write(x)
    if huge:  # memory written before (a reused mapping) or shared memory: collapse what is left
        advise_huge_pages(region.tensor().data_ptr(), region.nbytes, collapse=True)
    table = region.tensor()
    if table.device.type != device.type and not (gpu and table.is_pinned()):
        raise ValueError(f"the feature table landed on tier '{region.tier}' ({table.device}), which "
                         f"a {device.type} gather cannot read: choose tier/fallback accordingly")
    return table, region.tier.value
