"""Aligned text tables for the CLI: a header row, then one row per item.

Every cell must already be escaped for display (toolauthz/display/escape.py) by the code that
knows what it holds (a Cedar uid, JSON, a plain string); `table` refuses a cell that
could still break a line or move the cursor, so a forgotten escape fails loudly instead
of letting a model's string forge a row."""

from __future__ import annotations

from collections.abc import Sequence


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """The rows under the header, columns padded to their widest cell; the last column is
    not padded (it may be long, e.g. arguments)."""
    for row in rows:
        if len(row) != len(header):
            raise ValueError(f"a row has {len(row)} cells for {len(header)} columns")
        for cell in row:
            if not cell.isprintable():
                raise ValueError("a table cell was not escaped for display")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return "\n".join("  ".join([*(cell.ljust(widths[i]) for i, cell in enumerate(r[:-1])), r[-1]]).rstrip()
                     for r in [header, *rows])
