"""Joining the ``torch.distributed`` process group that ``torchrun`` describes, and where this rank sits.

`init_distributed` reads ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` (and
``MASTER_ADDR``/``MASTER_PORT`` through ``env://``) and returns a `DistContext`. The backend follows the
training device: NCCL for ``cuda:<local rank>``, gloo for the CPU; either is overridable. Without
``torchrun`` it makes a one-process group in memory, so the same script also runs as plain ``python``.
`current_context` describes the default group as it stands (one CPU process when none exists);
`shutdown_distributed` leaves it.

>>> ctx = init_distributed()              # doctest: +SKIP
>>> ctx.rank, ctx.world_size, ctx.backend  # doctest: +SKIP
(0, 2, 'gloo')

References
----------
Li et al., "PyTorch Distributed: Experiences on Accelerating Data Parallel Training" (VLDB 2020);
``torchrun``'s environment variables.
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
from dataclasses import dataclass

import torch
import torch.distributed as dist

__all__ = ["DistContext", "current_context", "init_distributed", "shutdown_distributed"]

log = logging.getLogger(__name__)

_BACKENDS = ("gloo", "nccl")


@dataclass(frozen=True)
class DistContext:
    """Where this process sits in the job.

    Attributes
    ----------
    rank, world_size : int
        Global rank and number of processes.
    local_rank, local_world_size : int
        Rank among the processes of this machine, and their number.
    node : str
        Names this machine's group of local ranks (host name and ``torchrun``'s ``GROUP_RANK``): ranks
        with the same ``node`` share one graph copy.
    backend : str
        "gloo" or "nccl".
    device : torch.device
        The training device: ``cuda:<local_rank>`` with NCCL, else the CPU.
    """

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node: str
    backend: str
    device: torch.device

    @property
    def is_main(self) -> bool:
        """True on global rank 0 (the rank that logs, evaluates and prints)."""
        return self.rank == 0


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} must be an integer") from None


def _node_name() -> str:
    return f"{socket.gethostname()}/{os.environ.get('GROUP_RANK', '0')}"


def init_distributed(backend: str | None = None, device: str | torch.device | None = None, *,
                     timeout_s: float = 600.0) -> DistContext:
    """Join the process group described by ``torchrun``'s environment (or make a one-process group).

    Reads ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE`` (defaults without them:
    rank 0 of 1, and local = global, i.e. one machine) and rendezvouses through ``env://``
    (``MASTER_ADDR``, ``MASTER_PORT``). Without ``RANK`` in the environment it makes a one-process
    group in memory (no network), so a ``torchrun`` script also runs as plain ``python``. If the
    default group already exists, it is reused.

    Parameters
    ----------
    backend : {"gloo", "nccl"} or None
        None: NCCL when the training device is CUDA, gloo otherwise.
    device : str, torch.device or None
        Training device. None: ``cuda:<LOCAL_RANK>`` when CUDA is available and ``backend`` is not
        "gloo", else "cpu". A CUDA device becomes the current device.
    timeout_s : float
        How long a collective may wait for the other ranks before failing, seconds.

    Returns
    -------
    DistContext

    Raises
    ------
    ValueError
        An unknown backend; NCCL with a CPU device or without NCCL in this torch build; an environment
        variable that is not an integer; a rank outside ``[0, WORLD_SIZE)``.

    Examples
    --------
    >>> ctx = init_distributed()              # doctest: +SKIP
    >>> ctx.rank, ctx.world_size, ctx.backend  # doctest: +SKIP
    (0, 2, 'gloo')
    """
    if backend is not None and backend not in _BACKENDS:
        raise ValueError(f"backend must be one of {_BACKENDS} or None (by device), got {backend!r}")
    torchrun = "RANK" in os.environ
    rank = _env_int("RANK", 0)
    world = _env_int("WORLD_SIZE", 1)
    local_rank = _env_int("LOCAL_RANK", rank)
    local_world = _env_int("LOCAL_WORLD_SIZE", world)
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"RANK={rank} must be in [0, WORLD_SIZE={world})")
    if not 0 <= local_rank < local_world:
        raise ValueError(f"LOCAL_RANK={local_rank} must be in [0, LOCAL_WORLD_SIZE={local_world})")
    if device is None:
        cuda = torch.cuda.is_available() and backend != "gloo"
        dev = torch.device(f"cuda:{local_rank % max(torch.cuda.device_count(), 1)}" if cuda else "cpu")
    else:
        dev = torch.device(device)
    if backend is None:
        backend = "nccl" if dev.type == "cuda" else "gloo"
    if backend == "nccl":
        if dev.type != "cuda":
            raise ValueError(f"backend='nccl' needs a CUDA device, got device={str(dev)!r}: use gloo on CPUs")
        if not dist.is_nccl_available():
            raise ValueError("backend='nccl': this torch build has no NCCL; use backend='gloo'")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if dist.is_initialized():
        backend = str(dist.get_backend())
        rank, world = dist.get_rank(), dist.get_world_size()
    elif torchrun:
        dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout_s))
    else:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1,
                                timeout=datetime.timedelta(seconds=timeout_s))
    ctx = DistContext(rank=rank, world_size=world, local_rank=local_rank, local_world_size=local_world,
                      node=_node_name(), backend=backend, device=dev)
    log.info("rank %d of %d (local %d of %d on %s), backend %s, device %s", ctx.rank, ctx.world_size,
             ctx.local_rank, ctx.local_world_size, ctx.node, ctx.backend, ctx.device)
    return ctx


def shutdown_distributed() -> None:
    """Leave the process group (``destroy_process_group``) if one exists; idempotent."""
    if dist.is_initialized():
        dist.destroy_process_group()


def current_context() -> DistContext:
    """Where this process sits in the default group (rank 0 of 1 on the CPU when none exists)."""
    if not dist.is_initialized():
        return DistContext(0, 1, 0, 1, _node_name(), "gloo", torch.device("cpu"))
    rank, world = dist.get_rank(), dist.get_world_size()
    return DistContext(rank, world, _env_int("LOCAL_RANK", rank), _env_int("LOCAL_WORLD_SIZE", world),
                       _node_name(), str(dist.get_backend()), torch.device("cpu"))
