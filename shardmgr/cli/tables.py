"""Rows shown to an operator: a rich table on a terminal, plain lines elsewhere.

On a terminal (rich's ``Console.is_terminal``: stdout is a tty, or the
environment says to act as one with ``TTY_COMPATIBLE=1`` or ``FORCE_COLOR``)
rows are a rich table, fitted to the terminal's width. Anywhere else (a pipe,
a file) each row is one line of tab-separated fields that is never wrapped
or cut, whatever ``COLUMNS`` says, so ``grep`` finds a whole path or key on
one line and ``cut -f`` picks a field. Within a field, a backslash, a control
character and a byte of a file name that is not UTF-8 are written ``\\\\``,
``\\t``, ``\\n``, ``\\r`` or ``\\xNN``, so a row stays one line; an empty or
absent value is ``-``; numbers carry no thousands separators. Nothing shown
is read as rich markup.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text

#: A value in a row: text (styled text keeps its style in the table only), a number, or nothing.
Cell = str | int | float | Text | None

_ESCAPES: dict[int, str] = {ord("\\"): "\\\\", ord("\t"): "\\t", ord("\n"): "\\n", ord("\r"): "\\r"}
_ESCAPES.update({c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F) if c not in _ESCAPES})
# os.fsdecode turns each byte of a name that is not UTF-8 into a lone surrogate U+DC80..U+DCFF
_ESCAPES.update({c: f"\\x{c - 0xDC00:02x}" for c in range(0xDC80, 0xDD00)})


def field(value: Cell) -> str:
    """``value`` as one field of a plain line: escaped, ``-`` if empty."""
    if isinstance(value, Text):
        value = value.plain
    if value is None or value == "":
        return "-"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value).translate(_ESCAPES)


def cell(value: Cell) -> Text:
    """``value`` as a table cell: numbers with thousands separators, text as it is."""
    if isinstance(value, Text):
        return value
    if value is None:
        return Text("")
    if isinstance(value, int):
        return Text(f"{value:,}")
    if isinstance(value, float):
        return Text(f"{value:,.6g}")
    return Text(value)


def show(console: Console, table: Table, rows: Iterable[Sequence[Cell]], *lead: str, header: bool = False) -> None:
    """On a terminal, ``rows`` in ``table`` (its columns already added);
    elsewhere one line per row: the ``lead`` fields, then the row's. With
    ``header``, off a terminal the rows follow a line naming the columns:
    ``#`` and the lead fields, then the columns' names (so ``grep`` on a
    lead finds rows only)."""
    if console.is_terminal:
        for row in rows:
            table.add_row(*map(cell, row))
        console.print(table)
        return
    if header:
        names = (str(c.header) for c in table.columns)
        _line(console, "#" + "\t".join(map(field, (*lead, *names))))
    for row in rows:
        _line(console, "\t".join(map(field, (*lead, *row))))


def say(console: Console, text: str) -> None:
    """One line of prose; off a terminal it is escaped as a field is, never wrapped or cut."""
    if console.is_terminal:
        console.print(text, markup=False)
    else:
        _line(console, text.translate(_ESCAPES))


def _line(console: Console, text: str) -> None:
    # past rich's rendering, which would expand the tabs and wrap at the console's width
    console.file.write(text + "\n")
