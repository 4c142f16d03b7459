"""`TrainingBar`: one tqdm bar for a loop that stops at a step count or a wall-clock budget, whichever first.

With a time budget the bar counts seconds of that budget (as the RL demo's does), so a 90-s run shows 90 s,
not the thousands of steps a large epoch count would allow; without one it counts steps. The postfix carries
the loop's own figures (loss, epoch, ...).

>>> bar = TrainingBar(max_steps=14_000, budget_seconds=90.0, progress=True, unit="step")   # doctest: +SKIP
>>> bar.advance(seconds=0.4, loss="0.6931")                                                # doctest: +SKIP
>>> bar.close()                                                                            # doctest: +SKIP
"""

from __future__ import annotations

import math
from typing import IO

from tqdm.auto import tqdm

__all__ = ["TrainingBar"]


class TrainingBar:
    """A tqdm bar over a time budget (seconds) when there is one, else over steps.

    Parameters
    ----------
    max_steps : int or None
        The step cap (None: none).
    budget_seconds : float
        Wall-clock budget in seconds (``math.inf``: none).
    progress : bool
        Show the bar (on stderr); False makes every call a no-op.
    unit : str
        What one step is called ("step", "batch").
    desc : str
        The bar's label.
    file : text stream or None
        Where the bar is drawn (None: stderr).
    """

    def __init__(self, max_steps: int | None, budget_seconds: float, progress: bool, unit: str = "step",
                 desc: str = "train", file: IO[str] | None = None) -> None:
        self.timed = math.isfinite(budget_seconds)
        self.steps = 0
        self._seconds = 0.0
        if self.timed:
            self._bar = tqdm(total=round(budget_seconds), disable=not progress, unit="s", file=file,
                             ncols=120,
                             desc=f"{desc} ({budget_seconds:g} s budget)",
                             bar_format="{l_bar}{bar}| {n:.0f}/{total} s [{elapsed}<{remaining}{postfix}]")
        else:
            self._bar = tqdm(total=max_steps, disable=not progress, unit=unit, file=file, ncols=120,
                             desc=desc)

    def advance(self, seconds: float, **postfix: str) -> None:
        """One step that took ``seconds`` of the budget; ``postfix`` is shown beside the bar."""
        self.steps += 1
        if self.timed:
            before = self._seconds
            self._seconds = min(self._seconds + seconds, float(self._bar.total))
            self._bar.update(self._seconds - before)
            postfix = {"steps": str(self.steps), **postfix}
        else:
            self._bar.update(1)
        self._bar.set_postfix(postfix, refresh=False)

    def close(self) -> None:
        self._bar.close()
