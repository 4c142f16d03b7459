"""The learner's weights for its actor processes: a flat parameter vector in shared memory, seqlock-versioned.

`SharedWeights.create` (learner) allocates two regions on the ``shared`` tier of a
`graphrl.memory.MemoryManager`: the float32 parameter vector and an int64 version counter;
`SharedWeights.attach` (an actor) maps them by the picklable `SharedWeightsHandle`. The learner
`SharedWeights.publish`-es (the version is odd while the vector is written); actors
`SharedWeights.pull` only when the version changed and retry later if it changed during their copy,
so they never load a torn vector. No pickling of weights, no queue.

>>> weights = SharedWeights.create(memory, net); weights.publish(net)        # learner
>>> theirs = SharedWeights.attach(weights.handle()); theirs.pull(actor_net)  # actor  # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from graphrl.memory import MemoryManager, Region, RegionHandle

__all__ = ["SharedWeights", "SharedWeightsHandle"]


@dataclass(frozen=True)
class SharedWeightsHandle:
    """Picklable names of a `SharedWeights` pair of regions."""

    params: RegionHandle
    version: RegionHandle


class SharedWeights:
    """A network's flat parameter vector in shared memory, with a version counter other processes poll.

    The learner `publish`-es (a seqlock: the version is odd while the vector is written); actors
    `pull` only when the version changed, and retry later if it changed during their copy, so they
    never load a torn vector. A pull costs one copy of the parameters (about 40 KB for the default
    CartPole network); no pickling, no queue.

    Parameters
    ----------
    params : graphrl.memory.Region
        float32 [P], shared tier.
    version : graphrl.memory.Region
        int64 [1], shared tier.

    Use `create` (learner) and `attach` (actors), not the constructor.

    Examples
    --------
    >>> weights = SharedWeights.create(mm, net); weights.publish(net)       # learner
    >>> theirs = SharedWeights.attach(weights.handle()); theirs.pull(net2)  # actor  # doctest: +SKIP
    True
    """

    def __init__(self, params: Region, version: Region) -> None:
        self._params, self._version = params, version
        self.params = params.tensor()
        self.version = version.numpy()
        self.seen = -1

    @classmethod
    def create(cls, memory: MemoryManager, network: nn.Module) -> SharedWeights:
        """Allocate the regions for ``network``'s parameters (version 0: nothing published yet).

        Raises
        ------
        graphrl.memory.MemoryBudgetError
            The shared tier's budget has no room.
        """
        count = sum(p.numel() for p in network.parameters())
        params = memory.allocate((count,), torch.float32, "shared", owner="train.rl.weights")
        version = memory.allocate((1,), torch.int64, "shared", owner="train.rl.weights")
        version.numpy()[0] = 0
        return cls(params, version)

    def handle(self) -> SharedWeightsHandle:
        """What `attach` needs in another process."""
        return SharedWeightsHandle(self._params.handle(), self._version.handle())

    @classmethod
    def attach(cls, handle: SharedWeightsHandle) -> SharedWeights:
        """Map the regions named by ``handle`` (from the learner's `handle`).

        Raises
        ------
        FileNotFoundError
            The learner has freed them.
        """
        return cls(Region.attach(handle.params), Region.attach(handle.version))

    def publish(self, network: nn.Module) -> int:
        """Write ``network``'s parameters; return the new (even) version.

        Raises
        ------
        ValueError
            The network's parameter count differs from the regions'.
        """
        flat = nn.utils.parameters_to_vector([p.detach() for p in network.parameters()])
        if flat.numel() != self.params.numel():
            raise ValueError(
                f"network has {flat.numel()} parameters, the shared vector {self.params.numel()}"
            )
        v = int(self.version[0])
        self.version[0] = v + 1
        self.params.copy_(flat)
        self.version[0] = v + 2
        return v + 2

    def pull(self, network: nn.Module) -> bool:
        """Load the latest published parameters into ``network`` if they changed; return whether it did."""
        v1 = int(self.version[0])
        if v1 == self.seen or v1 == 0 or v1 % 2:
            return False
        flat = self.params.clone()
        if int(self.version[0]) != v1:  # the learner wrote meanwhile: try again next time
            return False
        with torch.no_grad():
            nn.utils.vector_to_parameters(flat, network.parameters())
        self.seen = v1
        return True

    def close(self) -> None:
        """Free (learner) or unmap (actors) the regions."""
        for r in (self._params, self._version):
            if not r.freed:
                r.free()
