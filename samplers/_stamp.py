"""`TensorStamp`: whether a tensor a sampler derived state from (draw weights, a mask, their prefix sums) is
the same tensor, unwritten since; the one rule by which the adapters (`samplers.DglSampler`,
`samplers.PygSampler`) decide to keep or rebuild what they cached from a graph's edge features or times
(docs/architecture.md#pyg-and-dgl-loaders).

>>> stamp = TensorStamp.of(w); w[:8] = 0; stamp.matches(w)
False
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

__all__ = ["TensorStamp"]


@dataclass(frozen=True)
class TensorStamp:
    """A tensor (weakly referenced) and its version counter when stamped.

    torch bumps a tensor's version counter on every in-place write to it or to a view of it
    (``t[:8] = 0``, ``t.mul_(2)``, ``t.copy_(u)``, under ``torch.no_grad()`` too); writes that bypass
    autograd's tracking are not counted and so not seen: through ``t.data``, a numpy view (``t.numpy()``)
    or DLPack.

    Attributes
    ----------
    ref : weakref.ref
        The tensor (a weak reference: a stamp keeps nothing alive).
    version : int
        Its version counter when stamped.
    """

    ref: weakref.ref
    version: int

    @staticmethod
    def of(tensor: torch.Tensor) -> TensorStamp:
        """The stamp of ``tensor`` now."""
        # torch has no public reader of the version counter autograd keeps on every tensor (its own
        # torch.autograd.graph and torch.utils.checkpoint read ._version likewise): the samplers' one read
        return TensorStamp(weakref.ref(tensor), tensor._version)

    def matches(self, tensor: torch.Tensor | None) -> bool:
        """Whether ``tensor`` is the stamped tensor, with no in-place write since."""
        # a tensor that is gone (None) or another matches no stamp; the version read in one place, `of`
        return tensor is not None and self.ref() is tensor and TensorStamp.of(tensor).version == self.version
