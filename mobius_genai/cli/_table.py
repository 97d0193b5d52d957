"""Aligned text tables for the commands that print them (`eps`, `bench`)."""

from __future__ import annotations

from collections.abc import Collection, Sequence


def aligned_table(rows: Sequence[Sequence[str]], right: Collection[int] = ()) -> str:
    """`rows` (the first is the header) in columns two spaces apart, a rule under the header;
    the columns numbered in `right` (numbers) are aligned right."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]

    def line(cells: Sequence[str]) -> str:
        padded = (
            cell.rjust(width) if i in right else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(cells, widths, strict=True))
        )
        return "  ".join(padded).rstrip()

    lines = [line(row) for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)
