"""Batch, the windows a store's `sample` returns (their slots: `replay.batch_staging`).

A `Batch` maps each field name to a tensor ``[B, L, *field_shape]`` and carries the ``mask``, the
``keys`` for `update_priorities`, the draw ``probabilities``, the importance ``weights`` and the
``lengths``. Its tensors view one slot of a `graphrl.tensors.StagingPool` (laid out by
`replay.layout.BatchLayout`): pinned host memory with CUDA, host memory without, or device memory for
``sample(device="cuda")``. A slot returns to its pool on `Batch.release` or at the end of a ``with``
block (the user's word that the batch's tensors are no longer read: they may then be overwritten by
the next sample; ``clone()`` what you keep), or, for a batch dropped without either, once the batch
and every tensor taken from it (``batch["obs"]``, `Batch.to_tensordict`'s entries, their views) are
gone (`graphrl.tensors.StagingBuffer.release_when_unused`); until then the pool never hands it out
again, on the host as on a device (``sample(device="cuda")``). `Batch.to`'s non-blocking copy to a GPU
holds the slot until the copy read it (`graphrl.tensors.StagingBuffer.hold_until`), however it is released.

`replay.batch_staging.BatchStaging` keeps a store's pools and the views of each slot;
`importance_weights` computes PER's weights.

>>> with store.sample(256, window=64) as batch:
...     loss = (batch.weights * td(batch["obs"], batch.mask)).mean()

References
----------
Schaul et al., "Prioritized Experience Replay", ICLR 2016: importance weights
``(N * P(i)) ** -beta / max_j w_j``. TorchRL's ``TensorDict`` batches (`Batch.to_tensordict`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch

from graphrl.stream_order import copy_event
from graphrl.tensors import StagingBuffer
from replay._checks import check_beta
from replay.draw_kernels import importance_weights_into
from replay.keys import stamp_keys

__all__ = ["Batch", "importance_weights"]

# the entries `Batch.to_tensordict` makes (layout "torchrl") besides the fields and the init key
_TORCHRL_MADE = frozenset({
    "mask", "keys", "probabilities", "weights", "lengths", "priority_weight", ("collector", "mask"),
    ("next", "truncated"), ("next", "done"), ("next", "terminated"),
})


def importance_weights(probabilities: np.ndarray, table_size: int, beta: float) -> torch.Tensor:
    """``(N * P) ** -beta`` normalised by the batch maximum: float32 [B] (Schaul et al., 2016).

    The one formula of both stores (the Ray store passes ``P(shard) * P(window | shard)`` and the
    global table size). ``N`` is ``max(table_size, 1)``; no probabilities give an empty tensor. Edge
    cases follow IEEE arithmetic, as numpy's vectorised formula does (without its warnings): with
    ``beta > 0`` a probability of 0 (a priority mass that overflowed to inf) has weight inf before
    normalising, so its weight is NaN and every finite one 0 (all zero: all NaN); with ``beta > 0`` a
    NaN probability makes every weight NaN (the maximum is NaN); ``beta = 0`` gives ones (``x ** 0``
    is 1, NaN and 0 included). The arithmetic is `replay.draw_kernels.importance_weights_into`, which
    the fused transition draw runs too, so every path gives the same bits.

    Parameters
    ----------
    probabilities : numpy.ndarray, float (any shape, read flat) [B]
        Each window's draw probability.
    table_size : int
        N, the drawable items at the draw (``batch.table_size``).
    beta : float
        The exponent, finite and >= 0 (or anything `replay._checks.check_beta` takes).

    Returns
    -------
    torch.Tensor, float32 [B]
        The weights, the largest 1 (see the edge cases above).

    Raises
    ------
    TypeError
        ``beta`` not a real number (`replay._checks.check_beta`).
    ValueError
        ``beta`` not finite and >= 0.
    """
    beta = check_beta(beta)
    out = np.empty(probabilities.size, dtype=np.float32)
    if out.size:
        prob = np.ascontiguousarray(probabilities, dtype=np.float64).reshape(-1)
        importance_weights_into(prob, int(table_size), beta, out)
    return torch.from_numpy(out)


class Batch(Mapping[str, torch.Tensor]):
    """Windows drawn by `ReplayStore.sample`: a mapping of field name to tensor ``[B, L, *field_shape]``.

    The tensors view a reusable staging buffer (pinned with CUDA; on the device for
    ``sample(device="cuda")``, whose ``keys``, ``probabilities`` and ``lengths`` stay on the CPU and whose
    ``mask`` and ``weights`` are on the device). The buffer returns to its pool on
    `release` or at the end of a ``with`` block, after which the tensors taken from the batch may be
    overwritten by the next sample (``clone()`` what you keep past it); a batch dropped without a
    release holds its buffer until it and every tensor taken from it (and their views) are gone,
    so ``obs = store.sample(64, 4)["obs"]`` keeps its data, on a device too (``device="cuda"``).

    Attributes
    ----------
    mask : torch.Tensor, bool [B, L]
        True for real steps, False for padding (padded values are zero).
    keys : torch.Tensor, int64 [B]
        Window keys for `ReplayStore.update_priorities`.
    probabilities : torch.Tensor, float64 [B]
        Probability with which each window's anchor was drawn (1.0 for Fifo, Lifo and the heaps).
    weights : torch.Tensor, float32 [B]
        Importance weights ``(N * P) ** -beta`` divided by their batch maximum (1 for uniform draws).
    lengths : torch.Tensor, int64 [B]
        Real steps of each window.
    table_size : int
        N: the number of drawable items when the batch was drawn.
    issuer : int or None
        The id of the store that drew it (``store.store_id``); ``keys`` bears it
        (`replay.keys.stamp_keys`), and another store's ``update_priorities`` refuses them.
    """

    __slots__ = (
        "_fields", "_mask", "_keys", "_probabilities", "_weights", "_lengths", "table_size", "_beta",
        "_buffer", "_source", "_held", "issuer", "__weakref__",
    )

    def __init__(
        self,
        fields: dict[str, torch.Tensor],
        mask: torch.Tensor,
        keys: torch.Tensor,
        probabilities: torch.Tensor,
        weights: torch.Tensor,
        lengths: torch.Tensor,
        table_size: int,
        buffer: StagingBuffer | None = None,
        source: Batch | None = None,
        beta: float | None = None,
        issuer: int | None = None,
    ) -> None:
        self._fields = fields
        # a slot's mask is read through its fields (`_SlotFields`): a released batch kept alive holds
        # no reference of its own to it, which would hold the slot (`StagingBuffer.release_when_unused`)
        self._mask = None if getattr(fields, "mask", None) is mask else mask
        self._keys: torch.Tensor | np.ndarray = keys
        self._probabilities: torch.Tensor | np.ndarray = probabilities
        self._weights: torch.Tensor | np.ndarray | None = weights
        self._lengths: torch.Tensor | np.ndarray | None = lengths
        self.table_size = table_size
        self._beta = beta  # host batches made by `from_draw`: weights computed on first access
        self._buffer = buffer
        self._source = source  # a batch made by `to` keeps its source's staging slot held
        self._held = [buffer] if buffer else []  # popped once: by `release` or at garbage collection
        self.issuer: int | None = issuer  # numpy keys are stamped as they become a tensor (`keys`)

    @classmethod
    def from_draw(
        cls,
        fields: dict[str, torch.Tensor],
        mask: torch.Tensor,
        keys: np.ndarray,
        probabilities: np.ndarray,
        lengths: np.ndarray | None,
        table_size: int,
        beta: float | None,
        buffer: StagingBuffer,
        weights: np.ndarray | None = None,
        issuer: int | None = None,
    ) -> Batch:
        """A host batch whose ``keys``, ``probabilities``, ``lengths`` and ``weights`` tensors are made
        on first access: from these arrays (the batch's own, never reused), ``lengths`` None for
        windows of one real step each, and the weights from ``weights`` (float32 [B], computed with
        the draw), else `importance_weights` (``beta`` given: a prioritized draw) or ones (``beta``
        None). ``issuer``: the store that drew it, as `stamp` records it."""
        # positional: a keyword argument costs a dict per call
        return cls(  # type: ignore[arg-type]
            fields, mask, keys, probabilities, weights, lengths, table_size, buffer, None, beta, issuer
        )

    def stamp(self, issuer: int) -> Batch:
        """Record the store that drew this batch (its ``keys`` bear ``issuer``); return the batch."""
        self.issuer = issuer
        if type(self._keys) is not np.ndarray:  # numpy keys are stamped as they become a tensor (`keys`)
            self._keys = stamp_keys(self._keys, issuer)
        return self

    @property
    def keys(self) -> torch.Tensor:
        """int64 [B]: the window keys for `ReplayStore.update_priorities`, a `replay.keys.ReplayKeys`
        bearing the issuing store's id (docs/architecture.md#keys)."""
        k = self._keys
        if isinstance(k, np.ndarray):
            k = self._keys = stamp_keys(torch.from_numpy(k), self.issuer)
        return k

    @property
    def probabilities(self) -> torch.Tensor:
        """float64 [B]: the probability of each window's anchor at its draw."""
        p = self._probabilities
        if type(p) is not torch.Tensor:
            p = self._probabilities = torch.from_numpy(p)
        return p

    @property
    def weights(self) -> torch.Tensor:
        """float32 [B]: importance weights ``(N * P) ** -beta`` over their batch maximum."""
        w = self._weights
        if type(w) is not torch.Tensor:
            if w is not None:  # computed with the draw
                w = torch.from_numpy(w)
            elif self._beta is None:
                w = torch.ones(self.mask.shape[0], dtype=torch.float32)
            else:
                p = self._probabilities
                p = p.numpy() if type(p) is torch.Tensor else p
                w = importance_weights(p, self.table_size, self._beta)
            self._weights = w
        return w

    @property
    def lengths(self) -> torch.Tensor:
        """int64 [B]: the real steps of each window."""
        n = self._lengths
        if type(n) is not torch.Tensor:
            n = torch.ones(self.mask.shape[0], dtype=torch.int64) if n is None else torch.from_numpy(n)
            self._lengths = n
        return n

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._fields[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)

    @property
    def mask(self) -> torch.Tensor:
        """bool [B, L]: True for real steps, False for padding."""
        m = self._mask
        return self._fields.mask if m is None else m  # type: ignore[attr-defined]

    @property
    def batch_size(self) -> int:
        return int(self.mask.shape[0])

    @property
    def window(self) -> int:
        return int(self.mask.shape[1])

    def release(self) -> None:
        """Return the staging buffer to its pool (its tensors may then be overwritten); idempotent.

        For a batch made by `to`, release the staging buffer of the batch it was copied from (never
        waiting: the pool hands it out again once the copy read it, `StagingBuffer.hold_until`).
        """
        try:
            buffer = self._held.pop()  # atomic: two threads releasing release the buffer once
        except IndexError:
            buffer = None
        if buffer is not None:
            buffer.release(if_held=True)
        if self._source is not None:
            self._source.release()

    def __del__(self) -> None:
        held = getattr(self, "_held", None)  # unset when __init__ did not finish
        if held:  # the user may still read tensors taken from the batch: the slot waits for them
            buffer = held.pop()
            if not buffer.released:
                buffer.release_when_unused()

    @property
    def released(self) -> bool:
        return self._buffer is not None and not self._held

    def __enter__(self) -> Batch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def to(self, device: str | torch.device, non_blocking: bool = True) -> Batch:
        """A copy of the fields, mask and weights on ``device`` (asynchronous from pinned memory to a GPU).

        ``keys``, ``probabilities`` and ``lengths`` stay on the CPU (they go back to the store). The
        copy keeps this batch (and its staging buffer) held until the copy is released or collected; a
        non-blocking copy to a GPU also holds the buffer until the copies read it, however it is then
        released: an event recorded after them (`graphrl.stream_order.copy_event`,
        `graphrl.tensors.StagingBuffer.hold_until`), polled by the pool, never waited for.
        """
        device = torch.device(device)
        moved = {n: t.to(device, non_blocking=non_blocking, copy=True) for n, t in self._fields.items()}
        out = Batch(
            moved,
            self.mask.to(device, non_blocking=non_blocking, copy=True),
            self.keys,
            self.probabilities,
            self.weights.to(device, non_blocking=non_blocking, copy=True),
            self.lengths,
            self.table_size,
            source=self,  # the copy keeps the staging slot held until it is released or collected
        )
        out.issuer = self.issuer
        event = copy_event(device, non_blocking)
        if event is not None:
            held = self._held
            if held:  # a released batch's slot is no longer this batch's to hold
                held[0].hold_until(event)
        return out

    def to_tensordict(
        self,
        layout: str = "torchrl",
        keys: Mapping[str, Any] | None = None,
        flat: bool = False,
        strict_length: bool = False,
        init_key: str | tuple[str, ...] | None = "is_init",
    ) -> Any:
        """The batch as a ``tensordict.TensorDict`` in TorchRL's ``SliceSampler`` layout (or per window).

        ``layout="torchrl"`` (the default): batch size ``[B, L]`` (dim names ``[None, "time"]``), or
        ``[B * L]`` with ``flat=True`` (as a ``SliceSampler(slice_len=L, strict_length=False,
        pad_output=True)`` batch of B slices, whose padding repeats a slice's last step where ours is
        zeros; ``td[td["mask"]]`` gives its ``pad_output=False`` form, the real steps of each slice
        one after another), holding:

        - each field ``[B, L, *field_shape]`` under its TorchRL key: ``keys.get(field)``, else
          `replay.torchrl.DEFAULT_KEYS` (``"reward"`` -> ``("next", "reward")``, ``"next_observation"``
          -> ``("next", "observation")``, ``"traj_ids"`` -> ``("collector", "traj_ids")``, ...), else
          the field's own name;
        - ``("next", "truncated")``: the stored value (False where there is none) OR-ed with True at
          each window's last real step, ``("next", "done")``: the stored value OR that, and
          ``("next", "terminated")``: stored or False (bool ``[B, L, 1]`` unless the fields have
          their own shapes), as ``SliceSampler`` marks slice ends for value estimators; each under
          ``keys["truncated"]`` / ``keys["done"]`` / ``keys["terminated"]`` when ``keys`` maps it
          (``SliceSampler(end_key=..., truncated_key=...)``);
        - ``init_key`` (``"is_init"``): the stored value under that key (False where there is none)
          OR-ed with True at each window's first real step (bool ``[B, L, 1]``, `InitTracker`'s
          shape, unless a stored field has its own), as ``SliceSampler(init_key="is_init")`` marks
          slice starts: a recurrent module (``GRUModule``/``LSTMModule`` in recurrent mode) restarts
          its state there, so it gives the same outputs on the ``flat=True`` form as on ``[B, L]``.
          A window never crosses an episode start, so this is the only start inside a window;
        - ``"mask"``: bool ``[B, L]``, True for real steps, always; and ``("collector", "mask")``, the
          same tensor, only when some window is padded (TorchRL's losses read that key themselves and
          then drop masked steps; without it they keep every step, as for a batch with no padding).
          Padded steps hold zeros;
        - ``"priority_weight"``: float32 ``[B, L]``, the window's importance weight (read by
          TorchRL's losses as a prioritized buffer's), and ``"keys"``, ``"probabilities"``,
          ``"weights"``, ``"lengths"`` as ``[B, L]`` (each window's value on every step; priorities go
          back with ``store.update_priorities(td["keys"][:, 0], ...)``).

        ``strict_length=True`` drops the windows shorter than L (``lengths < L``), as
        ``SliceSampler(strict_length=True)`` filters out slices shorter than ``slice_len``: batch size
        ``[B', L]`` (``[B' * L]`` flat), B' <= B and possibly 0, never a padded step, so no
        ``("collector", "mask")``. The windows kept are the batch's full ones in their order (not a
        redraw: see docs/architecture.md#batchto_tensordict).

        ``layout="batch"``: batch size ``[B]``, the fields under their own names ``[B, L, ...]`` and
        ``mask``, ``keys``, ``probabilities``, ``weights``, ``lengths`` as the batch has them (what this
        method returned before it had the TorchRL layout).

        The fields and ``mask`` are views, not copies (except when ``strict_length`` drops windows):
        the TensorDict views the batch's staging slot, which a dropped batch keeps held while the
        TensorDict (or a tensor of it) lives; after `release` or a ``with`` block's end the slot may be
        overwritten, so ``clone()`` what you keep past it. With ``layout="torchrl"`` every entry is on
        the fields' device (``keys``, ``probabilities`` and ``lengths`` copied there from the CPU;
        `ReplayStore.update_priorities` takes them from any device); with ``layout="batch"`` they stay
        on the CPU.

        Parameters
        ----------
        layout : {"torchrl", "batch"}
        keys : mapping of str to str or tuple of str, optional
            Field name -> TorchRL key, overriding `replay.torchrl.DEFAULT_KEYS` (``None`` drops one).
        flat : bool
            With ``layout="torchrl"``: batch size ``[B * L]`` instead of ``[B, L]``.
        strict_length : bool
            With ``layout="torchrl"``: drop the windows that have padding.
        init_key : str or tuple of str, or None
            With ``layout="torchrl"``: where to mark each window's first real step (``None``: no
            marker; a field stored under that key is then returned untouched).

        Returns
        -------
        tensordict.TensorDict
            As described above.

        Raises
        ------
        ImportError
            The ``tensordict`` package is not installed (``pip install tensordict``).
        ValueError
            An unknown ``layout``, two fields mapped to one key, or an ``init_key`` that names an entry
            this method makes (``"mask"``, ``("next", "done")``, ...).
        TypeError
            A ``keys`` or ``init_key`` value that is not a str or a tuple of str.

        References
        ----------
        TorchRL's ``SliceSampler`` (``truncated_key``, ``init_key``, ``strict_length``,
        ``pad_output``) and its losses' ``("collector", "mask")`` and ``"priority_weight"`` entries.
        """
        try:
            from tensordict import TensorDict
        except ImportError as exc:
            raise ImportError(
                "Batch.to_tensordict() needs the 'tensordict' package: pip install tensordict"
            ) from exc
        if layout == "batch":
            data = dict(self._fields)
            data.update(
                mask=self.mask,
                keys=self.keys,
                probabilities=self.probabilities,
                weights=self.weights,
                lengths=self.lengths,
            )
            return TensorDict(data, batch_size=[self.batch_size])
        if layout != "torchrl":
            raise ValueError(f"layout must be 'torchrl' or 'batch', got {layout!r}")
        from replay.torchrl import check_key, torchrl_keys

        mapping = torchrl_keys(keys)
        if init_key is not None:
            init_key = check_key(init_key, "init_key")
            if init_key in _TORCHRL_MADE:
                raise ValueError(
                    f"init_key={init_key!r} is an entry to_tensordict makes itself; pass another key "
                    f"(TorchRL's is 'is_init') or None"
                )
        length = self.window
        device = self.mask.device
        fields, mask = self._fields, self.mask
        per_window = {
            "keys": self.keys,
            "probabilities": self.probabilities,
            "weights": self.weights,
            "lengths": self.lengths,
            "priority_weight": self.weights,
        }
        short = self.lengths < length  # CPU: which windows are padded (no device sync)
        if strict_length and bool(short.any()):  # keep the full windows (copies)
            rows = torch.nonzero(~short).reshape(-1)
            rows_dev = rows.to(device)
            fields = {n: t[rows_dev] for n, t in fields.items()}
            mask = mask[rows_dev]
            per_window = {n: t[rows.to(t.device)] for n, t in per_window.items()}
            short = short[rows]
        b = int(mask.shape[0])
        named = {mapping.get(name, name): t for name, t in fields.items()}
        steps = torch.arange(length, device=device)
        last = torch.where(mask, steps, -1).amax(1, keepdim=True)  # each window's last real step
        first = torch.where(mask, steps, length).amin(1, keepdim=True)  # and its first
        # the end flags under the mapped keys (SliceSampler's end_key / truncated_key), else ("next", k)
        flag_keys = {k: mapping.get(k, ("next", k)) for k in ("truncated", "done", "terminated")}
        flags = {k: named.get(key) for k, key in flag_keys.items()}
        like = next((f for f in flags.values() if f is not None), None)
        shape = (b, length, 1) if like is None else tuple(like.shape)
        end = (steps == last).reshape(b, length, *([1] * (len(shape) - 2))).expand(shape)
        for k in ("truncated", "done"):
            stored = flags[k]
            named[flag_keys[k]] = end.clone() if stored is None else stored.to(torch.bool) | end
        if flags["terminated"] is None:
            named[flag_keys["terminated"]] = torch.zeros(shape, dtype=torch.bool, device=device)
        if init_key is not None:
            stored = named.get(init_key)
            init_shape = (b, length, 1) if stored is None else tuple(stored.shape)
            start = (steps == first).reshape(b, length, *([1] * (len(init_shape) - 2))).expand(init_shape)
            named[init_key] = start.clone() if stored is None else stored.to(torch.bool) | start
        for name, t in per_window.items():  # one device for the whole TensorDict (tiny [B] copies at most)
            named[name] = t.to(device)[:, None].expand(b, length)
        named["mask"] = mask
        if bool(short.any()):  # TorchRL's losses drop the steps it marks False; absent, they keep all
            named["collector", "mask"] = mask
        data: dict[str, Any] = {}
        for key, t in named.items():  # nest ("next", "reward") as {"next": {"reward": ...}}
            if isinstance(key, tuple):
                node = data
                for part in key[:-1]:
                    node = node.setdefault(part, {})
                node[key[-1]] = t
            else:
                data[key] = t
        td = TensorDict(data, batch_size=[b, length], device=device, names=[None, "time"])
        return td.reshape(b * length) if flat else td

    def __repr__(self) -> str:
        shapes = ", ".join(f"{n}: {tuple(t.shape)} {t.dtype}" for n, t in self._fields.items())
        return f"Batch({shapes}; B={self.batch_size}, L={self.window})"
