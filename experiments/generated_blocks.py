"""The README's Table 1 and claims tables, rewritten in place from the cards as a sweep goes on.

A markdown table is found by its header line and ends at the first line that is not a table row, so the prose
around it is never touched; a README that lacks a table's header is an error rather than a silent no-op.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from training.atomic import write_atomic

from .results_tables import seed_table
from .table1_claims import claims_table

__all__ = ["refresh_readme", "replace_table", "replace_between_markers", "rewrite_block"]

# Tables the README shows, each built from a folder of cards.
README_TABLES: tuple[Callable[[Path], str], ...] = (seed_table, claims_table)


def replace_table(text: str, table: str) -> str:
    """``text`` with the markdown table that has ``table``'s header line replaced by ``table``."""
    header = table.splitlines()[0]
    lines = text.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if line.rstrip("\n") == header]
    if len(starts) != 1:
        raise ValueError(f"expected one table headed {header!r}, found {len(starts)}")
    end = starts[0]
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return "".join(lines[: starts[0]]) + table + "\n" + "".join(lines[end:])


def replace_between_markers(text: str, begin: str, end: str, block: str) -> str:
    """``text`` with what lies between the lines ``begin`` and ``end`` replaced by ``block`` (markers kept).

    Raises:
        ValueError: the markers are not there exactly once each, in that order.
    """
    lines = text.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if line.rstrip("\n") == begin]
    ends = [i for i, line in enumerate(lines) if line.rstrip("\n") == end]
    if len(starts) != 1 or len(ends) != 1 or ends[0] < starts[0]:
        raise ValueError(f"expected one {begin!r} line and one {end!r} line after it; found {len(starts)} and "
                         f"{len(ends)}")
    body = block if block.endswith("\n") else block + "\n"
    return "".join(lines[: starts[0] + 1]) + body + "".join(lines[ends[0]:])


def refresh_readme(readme: str | Path, cards: str | Path) -> bool:
    """Rewrite ``readme``'s tables from the cards in ``cards``; True when anything changed."""
    path = Path(readme)
    old = path.read_text()
    new = old
    for build in README_TABLES:
        new = replace_table(new, build(Path(cards)))
    if new != old:
        write_atomic(path, new.encode())
    return new != old


def rewrite_block(path: Path, begin: str, end: str, block: str) -> bool:
    """Write ``block`` between the markers of the file ``path`` (:func:`replace_between_markers`); whether it
    changed (an unchanged file is not written)."""
    old = path.read_text()
    new = replace_between_markers(old, begin, end, block)
    if new != old:
        write_atomic(path, new.encode())
    return new != old
