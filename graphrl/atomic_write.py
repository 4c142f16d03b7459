"""Write a file whole or not at all: the one rule for every result file the application layer writes.

`write_whole` has the caller write into a temporary file beside the target (``.<name>.tmp``) and then
``os.replace``s it onto the target, so a signal, a full disk or a crash while writing leaves the target
as it was (or absent), never half written; the temporary file is removed whatever happens. Used by
``bench.json`` (`graphrl.bench`), the demo curves (`graphrl.curves`), ``train recommend``'s weights
(`graphrl.cli_train`) and the learning-curve records (`graphrl.train.rec_curve`).

>>> write_whole(Path("out/curve.json"), lambda tmp: tmp.write_text("{}"))  # doctest: +SKIP
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

__all__ = ["write_whole"]


def write_whole(path: str | os.PathLike, write: Callable[[Path], object]) -> Path:
    """Call ``write(tmp)`` to fill a temporary file beside ``path``, then replace ``path`` with it.

    Parameters
    ----------
    path : str or path
        The file to write (its folder must exist).
    write : callable
        Writes the whole content to the path it is given (e.g. ``lambda p: p.write_text(text)``,
        ``lambda p: torch.save(state, p)``); its result is ignored.

    Returns
    -------
    Path
        ``path``.

    Raises
    ------
    OSError
        The folder cannot be written (``path`` is then unchanged); any exception ``write`` raises
        propagates the same way.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
