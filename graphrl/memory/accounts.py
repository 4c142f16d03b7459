"""Budget accounting per tier and owner: the limiting and statistics layer the manager puts on each
resource (RMM's ``limiting_resource_adaptor`` and ``statistics_resource_adaptor``).

An `Account` keeps one tier's budget exactly: `Account.reserve` refuses bytes that do not fit,
`Account.settle` marks reserved bytes allocated (only allocated bytes reach the peaks, so a tier whose
allocator fails after the reservation keeps its peak), `Account.cancel` returns a reservation that was
never allocated and `Account.release` returns allocated bytes; per-owner `OwnerUsage` keeps bytes,
peak and live regions. The manager's lock guards every account.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Account", "OwnerUsage"]


@dataclass
class OwnerUsage:
    bytes: int = 0
    peak: int = 0
    regions: int = 0
    pending: int = 0  # reserved, not yet allocated (in ``bytes``, not in ``peak``)


@dataclass
class Account:
    """One tier's budget and per-owner statistics; the manager's lock guards it."""

    budget: int
    used: int = 0
    peak: int = 0
    regions: int = 0
    pending: int = 0  # reserved, not yet allocated (in ``used``, not in ``peak``)
    owners: dict[str, OwnerUsage] = field(default_factory=dict)

    @property
    def free(self) -> int:
        return self.budget - self.used

    def reserve(self, owner: str, nbytes: int) -> bool:
        """Hold ``nbytes`` for ``owner`` if they fit; then `settle` or `cancel` them."""
        if self.used + nbytes > self.budget:
            return False
        self.used += nbytes
        self.regions += 1
        self.pending += nbytes
        usage = self.owners.setdefault(owner, OwnerUsage())
        usage.bytes += nbytes
        usage.regions += 1
        usage.pending += nbytes
        return True

    def settle(self, owner: str, nbytes: int) -> None:
        """The reservation of ``nbytes`` was allocated: count it in the peaks."""
        self.pending -= nbytes
        self.peak = max(self.peak, self.used - self.pending)
        usage = self.owners[owner]
        usage.pending -= nbytes
        usage.peak = max(usage.peak, usage.bytes - usage.pending)

    def cancel(self, owner: str, nbytes: int) -> None:
        """The reservation of ``nbytes`` was never allocated: return it (the peaks never saw it)."""
        self.pending -= nbytes
        self.owners[owner].pending -= nbytes
        self.release(owner, nbytes)

    def release(self, owner: str, nbytes: int) -> None:
        self.used -= nbytes
        self.regions -= 1
        usage = self.owners[owner]
        usage.bytes -= nbytes
        usage.regions -= 1
