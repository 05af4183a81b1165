"""How ``kvbench break`` draws an experiment's table: a :class:`~kvbench.breaks.common.VerdictTable`
(plain text from the experiment module) as a rich table whose caption ends in the bold verdict line.

The experiment's text is escaped: a decoded model output such as ``[bold]`` prints as written.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.markup import escape
from rich.table import Table

if TYPE_CHECKING:
    from kvbench.breaks.common import VerdictTable  # imports the engine: only for the annotation


def verdict_table(data: VerdictTable) -> Table:
    """``data`` as a table: its first column left-aligned, the others right; the caption is its notes
    (one a line) followed by ``verdict: ...`` in bold (when it has a verdict)."""
    table = Table(title=escape(data.title), title_justify="left", caption_justify="left")
    for index, name in enumerate(data.columns):
        table.add_column(escape(name), justify="left" if index == 0 else "right")
    for row in data.rows:
        table.add_row(*(escape(cell) for cell in row))
    lines = [escape(note) for note in data.notes]
    if data.verdict:
        lines.append(f"[bold]verdict:[/bold] {escape(data.verdict)}")
    table.caption = "\n".join(lines) or None
    return table
