"""``--help`` that reads at 80 columns and through a pipe.

typer draws each options panel as a rich ``Table`` with one row per option: the option's names
joined by commas in one cell (``--requests,--num-requests,--num-prompts``), its type, its help. A
rich column's default overflow is ``ellipsis``, so at 80 columns (rich's width when stdout is not a
terminal, unless ``COLUMNS`` says otherwise) the names were cut (``--requests,--num-requ…``) and so
were long environment-variable names. :func:`install` gives typer a table that puts each name on a
line of its own and keeps that column from shrinking, and folds (never cuts) the other cells: every
option name stays whole at any width, and at 80 columns the help column gets the rest.
"""

from __future__ import annotations

from typing import Any

from rich.columns import Columns
from rich.table import Table
from rich.text import Text


def _names_on_lines(cell: Text, highlighter: Any) -> Text:
    """``--a,--b`` -> ``--a`` / ``--b``, one per line, highlighted again as typer does."""
    return highlighter(Text("\n".join(cell.plain.split(",")), style=cell.style))


class OptionsTable(Table):
    """typer's options table, with names kept whole (see the module docstring)."""

    def add_row(self, *renderables: Any, **kwargs: Any) -> None:
        from typer import rich_utils

        cells = []
        for index, cell in enumerate(renderables):
            if isinstance(cell, Text):
                if cell.plain.startswith("-"):
                    cell = _names_on_lines(cell, rich_utils.highlighter)
                    if len(self.columns) > index:
                        self.columns[index].no_wrap = True
            # the help: texts in Columns
            for text in cell.renderables if isinstance(cell, Columns) else [cell]:
                if isinstance(text, Text) and text.overflow is None:
                    text.overflow = "fold"
            cells.append(cell)
        super().add_row(*cells, **kwargs)
        for index, cell in enumerate(cells):  # a column made by this first row: names never shrink
            if isinstance(cell, Text) and cell.plain.startswith("-"):
                self.columns[index].no_wrap = True


def install() -> None:
    """Make typer draw its help tables with :class:`OptionsTable` (a no-op where typer has none)."""
    try:
        from typer import rich_utils
    except ImportError:  # pragma: no cover - typer without rich
        return
    if getattr(rich_utils, "Table", None) is Table:
        rich_utils.Table = OptionsTable
