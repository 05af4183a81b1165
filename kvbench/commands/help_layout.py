"""``--help`` that reads at 80 columns and through a pipe.

typer draws each options panel as a rich ``Table``: one row per option, with the option's names
(``--requests,--num-requests,--num-prompts``), its type and its help in three columns. At 80 columns
(rich's width when stdout is not a terminal, unless ``COLUMNS`` says otherwise) the names and the
types take most of the line: the help was left a 13-character column, words and environment-variable
names were split across lines (``KVBENCH_RUN_MAX_NUM_SE`` / ``QS``), and ``kvbench run --help`` ran to
455 lines. :func:`install` makes typer draw every option as two parts instead, the layout of
argparse's and git's help:

* a line with its names (``--requests / --num-requests / --num-prompts``) and its value's type
  (none for a flag: ``<bool>`` says nothing a flag does not), an argument in capitals (``SOURCE``);
* its help below, indented, as one paragraph with ``[env var: ...]`` and ``[default: ...]`` after
  the description, wrapped at spaces only, so no word is ever split and the description gets the
  whole width.

It also makes a group's command list show each command's first sentence on one logical line (the
docstring's own line breaks made summaries break mid-sentence), and the usage line name a required
argument as ``SOURCE`` (click's convention) where typer 0.29 writes ``{source}``.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

from rich.columns import Columns
from rich.console import Group
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

OPTION_CELLS = 6  # typer's option row: long, short, negative long, negative short, type, help
HELP_INDENT = 4  # columns before an option's help, under its names
LONG_TYPE = 40  # characters of a type (choices) beyond which it may break between its choices
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z`])")  # a sentence ends before a capital or a code span


def first_sentence(help_text: str) -> str:
    """The first sentence of ``help_text``'s first paragraph, its line breaks made spaces (the summary
    a command list shows)."""
    paragraph = inspect.cleandoc(help_text).split("\n\n")[0].replace("\b\n", "")
    flat = " ".join(paragraph.split())
    return _SENTENCE_END.split(flat, maxsplit=1)[0]


def _plain(cell: Any) -> str:
    return cell.plain if isinstance(cell, Text) else str(cell or "")


def _help_text(cell: Any) -> Any:
    """typer's help cell (``Columns`` of the description, env var, default, required) as one wrapped
    paragraph; a cell that is not plain text is kept as it is."""
    parts = list(cell.renderables) if isinstance(cell, Columns) else [cell]
    if not all(isinstance(part, Text) for part in parts):
        return cell
    text = Text(overflow="fold", no_wrap=False)  # fold only a word longer than the whole line
    for part in parts:
        if part.plain.strip():
            if text.plain:
                text.append(" ")
            text.append_text(part)
    return text


def stacked(cells: tuple[Any, ...]) -> Group:
    """One option of typer's row (``[required,] long, short, negative long, negative short, type,
    help``) as its names-and-type line with its help indented below (module docstring)."""
    from typer import rich_utils

    *heads, types, help_cell = cells
    required = any(_plain(cell) == rich_utils.REQUIRED_SHORT_STRING for cell in heads)
    names = [
        name
        for cell in heads
        if _plain(cell) != rich_utils.REQUIRED_SHORT_STRING
        for name in _plain(cell).split(",")
        if name
    ]
    if names and not names[0].startswith("-"):  # an argument: click's usage convention
        names = [name.upper() for name in names]
    line = rich_utils.highlighter(Text(" / ".join(names), overflow="fold"))
    kind = _plain(types)
    if len(kind) > LONG_TYPE:  # a long list of choices: breakable between them, never cut with "…"
        kind = kind.replace("|", " | ")
    if kind and not kind.startswith("<bool>"):
        line.append(" ")
        line.append(kind, style=rich_utils.STYLE_TYPES)
    if required:
        line.append(" " + rich_utils.REQUIRED_SHORT_STRING, style=rich_utils.STYLE_REQUIRED_SHORT)
    return Group(line, Padding(_help_text(help_cell), (0, 0, 0, HELP_INDENT)))


class OptionsTable(Table):
    """typer's options table, one option per row drawn by :func:`stacked` (module docstring)."""

    def add_row(self, *renderables: Any, **kwargs: Any) -> None:
        if len(renderables) < OPTION_CELLS:  # the commands panel (name, summary): as typer draws it
            super().add_row(*renderables, **kwargs)
            return
        super().add_row(stacked(renderables), **kwargs)


def _usage_display_name(argument: Any) -> str:
    """A typer argument in the usage line: ``SOURCE``, ``[SOURCE]`` when optional, ``...`` when many."""
    name = argument.display_name_raw.upper()
    name = name if argument.required else f"[{name}]"
    return name + ("..." if argument.nargs != 1 else "")


def install() -> None:
    """Make typer draw its help as the module docstring says (a no-op where typer has no rich)."""
    try:
        from typer import core, rich_utils
    except ImportError:  # pragma: no cover - typer without rich
        return
    if getattr(rich_utils, "Table", None) is Table:
        rich_utils.Table = OptionsTable
        make_command_help = rich_utils._make_command_help
        rich_utils._make_command_help = lambda *, help_text, markup_mode: make_command_help(
            help_text=first_sentence(help_text), markup_mode=markup_mode
        )
        core.TyperArgument._usage_display_name = _usage_display_name
