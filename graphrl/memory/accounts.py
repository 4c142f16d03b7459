"""Budget accounting per tier and owner: the limiting and statistics layer the manager puts on each
resource (RMM's ``limiting_resource_adaptor`` and ``statistics_resource_adaptor``).

An `Account` keeps one tier's budget exactly: `Account.reserve` refuses bytes that do not fit and
`Account.release` returns them; per-owner `OwnerUsage` keeps bytes, peak and live regions. The
manager's lock guards every account.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Account", "OwnerUsage"]


@dataclass
class OwnerUsage:
    bytes: int = 0
    peak: int = 0
    regions: int = 0


@dataclass
class Account:
    """One tier's budget and per-owner statistics; the manager's lock guards it."""

    budget: int
    used: int = 0
    peak: int = 0
    regions: int = 0
    owners: dict[str, OwnerUsage] = field(default_factory=dict)

    @property
    def free(self) -> int:
        return self.budget - self.used

    def reserve(self, owner: str, nbytes: int) -> bool:
        if self.used + nbytes > self.budget:
            return False
        self.used += nbytes
        self.regions += 1
        self.peak = max(self.peak, self.used)
        usage = self.owners.setdefault(owner, OwnerUsage())
        usage.bytes += nbytes
        usage.regions += 1
        usage.peak = max(usage.peak, usage.bytes)
        return True

    def release(self, owner: str, nbytes: int) -> None:
        self.used -= nbytes
        self.regions -= 1
        usage = self.owners[owner]
        usage.bytes -= nbytes
        usage.regions -= 1
