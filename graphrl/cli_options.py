"""Option values the ``graphrl`` commands parse themselves, each by one rule: click has no type for them.

- `int_list`: comma-separated integers (``demo --fanouts 10,10,10``, ``--synthetic-size U,I,N``,
  ``train recommend --fanouts``, ``partition --size NODES,EDGES``), optionally an exact count; spaces
  around items are ignored, an empty item (``10,,10``, ``10,``) is refused.
- `check_size`: a click callback for a byte-size option (``demo --device-budget 256KiB``), checked by
  `graphrl.memory.parse_size` when the command line is parsed, before any task runs.

Both refuse a bad value with `click.BadParameter` naming the option and the text given (click prints it
and exits with status 2).

>>> int_list("10, 10,5", "--fanouts")
[10, 10, 5]

This module raises click errors (it serves the CLI); library code does not use it.
"""

from __future__ import annotations

import click

from graphrl.memory import parse_size

__all__ = ["check_size", "int_list"]


def int_list(text: str, option: str | None, count: int | None = None, names: str | None = None) -> list[int]:
    """The integers of a comma-separated option value.

    Parameters
    ----------
    text : str
        The value given (``"10,10"``); spaces around an item are ignored.
    option : str or None
        The option, for the message (``"--fanouts"``); None inside a click callback (click names it).
    count : int or None
        The number of integers required (None: one or more).
    names : str or None
        What the value holds, for the message (``"NODES,EDGES (two integers)"``); None: "comma-separated
        integers".

    Returns
    -------
    list of int

    Raises
    ------
    click.BadParameter
        An item is not an integer (an empty one included), or not ``count`` of them; the message names
        ``option`` and quotes ``text``.
    """
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        what = names or "comma-separated integers such as '10,10'"
        raise click.BadParameter(f"expected {what}, got {text!r}", param_hint=option) from None
    if count is not None and len(values) != count:
        what = names or f"{count} comma-separated integers"
        raise click.BadParameter(f"expected {what}, got {text!r}", param_hint=option)
    return values


def check_size(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A click callback: a byte size option (``"256KiB"``), checked by `graphrl.memory.parse_size` when the
    command line is parsed, before any task runs; the text is passed on unchanged.

    Raises
    ------
    click.BadParameter
        ``value`` is not a size; the message is `parse_size`'s.
    """
    if value is not None:
        try:
            parse_size(value)
        except (ValueError, TypeError) as err:
            raise click.BadParameter(str(err), ctx=ctx, param=param) from None
    return value
