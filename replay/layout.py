"""BatchLayout: where each field and the mask of a [B, L] batch sit in one flat staging slot.

Both stores stage a batch in one uint8 slot of a `graphrl.tensors.StagingPool`: every field's
``[B, L, *field_shape]`` bytes, then the bool mask ``[B, L]``, each starting 64-byte aligned.

>>> layout = BatchLayout(spec, batch=256, window=64)
>>> pool = StagingPool(memory, (layout.nbytes,), torch.uint8)
>>> fields, mask = layout.views(spec, pool.acquire().tensor)
"""

from __future__ import annotations

import torch

from replay.spec import TrajectorySpec

__all__ = ["BatchLayout"]


class BatchLayout:
    """Byte offsets of each field and the mask of a [B, L] batch in one staging slot (64-byte aligned).

    Attributes
    ----------
    batch, window : int
        B and L.
    offsets : dict of str to (int, int)
        ``(byte offset, byte length)`` of each field, in spec order.
    mask_off : int
        Byte offset of the mask (``B * L`` bytes).
    nbytes : int
        Bytes of a slot (a multiple of 64, at least 64).
    """

    def __init__(self, spec: TrajectorySpec, batch: int, window: int) -> None:
        self.batch, self.window = batch, window
        self.offsets: dict[str, tuple[int, int]] = {}
        off = 0
        for name, f in spec.items():
            nbytes = batch * window * f.row_bytes
            self.offsets[name] = (off, nbytes)
            off += -(-nbytes // 64) * 64
        self.mask_off = off
        self.nbytes = -(-max(1, off + batch * window) // 64) * 64  # slots stay 64-byte aligned

    def views(self, spec: TrajectorySpec, raw: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """Typed views of a slot ``raw`` (uint8 [>= nbytes]): ``({field: [B, L, *shape]}, mask [B, L])``."""
        fields = {}
        for name, f in spec.items():
            off, nbytes = self.offsets[name]
            fields[name] = raw[off : off + nbytes].view(f.torch_dtype).view(self.batch, self.window, *f.shape)
        mask = raw[self.mask_off : self.mask_off + self.batch * self.window].view(torch.bool)
        return fields, mask.view(self.batch, self.window)
