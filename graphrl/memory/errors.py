"""The memory manager's error: `MemoryBudgetError`, a `MemoryError` naming tier, owner and bytes."""

from __future__ import annotations

from graphrl.memory.sizes import Tier, format_size

__all__ = ["MemoryBudgetError"]


class MemoryBudgetError(MemoryError):
    """An allocation did not fit its tier's budget nor any fallback tier's.

    Attributes
    ----------
    tier : Tier
        The tier asked for (the first one tried).
    owner : str
        The owner the allocation was for.
    asked : int
        Bytes asked for.
    free : int
        Bytes free on ``tier`` at the time.
    budget : int
        ``tier``'s budget in bytes.
    attempts : tuple of (Tier, int)
        Every tier tried, in order, with its free bytes.
    lead : str
        What refused the bytes and its own remedy, put before the tier's figures (e.g. a replay
        store's full compressed arena: the field and ``arena_ratio``, not the budget, are the cure).
    """

    def __init__(
        self,
        tier: Tier,
        owner: str,
        asked: int,
        free: int,
        budget: int,
        attempts: tuple[tuple[Tier, int], ...] = (),
        note: str = "",
        lead: str = "",
    ) -> None:
        self.tier, self.owner, self.asked, self.free, self.budget = tier, owner, asked, free, budget
        self.attempts = attempts or ((tier, free),)
        self.note, self.lead = note, lead
        tried = ", ".join(f"'{t}' ({format_size(f)} free)" for t, f in self.attempts)
        msg = (
            f"owner {owner!r} asked for {format_size(asked)} on tier '{tier}', which has "
            f"{format_size(free)} free of a {format_size(budget)} budget; tried {tried}. Free regions, "
            "raise a budget or allow a fallback tier"
        )
        msg += f" ({note})" if note else ""
        super().__init__(f"{lead} (memory manager: {msg})" if lead else msg)

    def __reduce__(self):
        return (
            type(self),
            (self.tier, self.owner, self.asked, self.free, self.budget, self.attempts, self.note, self.lead),
        )
