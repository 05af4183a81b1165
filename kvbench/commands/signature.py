"""Commands with many options: options declared in named groups, one ``--help`` panel per group.

A typer command's options are its function's parameters. ``kvbench run`` has over fifty, which no
readable function signature holds, so its options live in groups (``{name: (annotation, default)}``,
the annotation an ``Annotated[type, typer.Option(...)]`` as anywhere else) and :func:`with_options`
gives the command a signature made of its own parameters plus every group's; typer reads that
signature (``inspect.signature`` honours ``__signature__``) and passes the options as keywords.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from copy import copy
from typing import Annotated, Any, get_args

import typer

OptionGroup = dict[str, tuple[Any, Any]]  # option name -> (Annotated type, default)


def option(kind: Any, help_text: str, *names: str, panel: str | None = None, **settings: Any) -> Any:
    """``Annotated[kind, typer.Option(*names, help=help_text, rich_help_panel=panel, **settings)]``: one
    option of an ordinary signature in a line or two (a flag's own names, e.g. ``"--requests"``, in
    ``names``; ``callback``, ``min`` and the rest of typer's settings as keywords)."""
    return Annotated[kind, typer.Option(*names, help=help_text, rich_help_panel=panel, **settings)]


def panel(title: str, options: OptionGroup) -> OptionGroup:
    """The same options shown under ``title`` in ``--help`` (typer's ``rich_help_panel``)."""
    return {name: (in_panel(title, annotation), default) for name, (annotation, default) in options.items()}


def in_panel(title: str, annotation: Any) -> Any:
    """One ``Annotated[type, typer.Option(...)]`` (e.g. a shared alias of :mod:`kvbench.commands.options`)
    shown under ``title`` in ``--help``; for an ordinary signature, where a group does not fit."""
    base, *infos = get_args(annotation)
    infos = [copy(info) for info in infos]
    for info in infos:
        if getattr(info, "rich_help_panel", None) is None:
            info.rich_help_panel = title
    return Annotated[(base, *infos)]


def with_options(*groups: OptionGroup) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate ``def command(source, **flags)``: typer sees ``source`` and every group's options.

    Raises ``ValueError`` when two groups (or the function) declare the same name."""

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(func, eval_str=True)
        own = [p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
        added = [
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=default)
            for group in groups
            for name, (annotation, default) in group.items()
        ]
        names = [p.name for p in own + added]
        if len(names) != len(set(names)):
            raise ValueError(f"options declared twice: {sorted({n for n in names if names.count(n) > 1})}")
        func.__signature__ = signature.replace(parameters=[*own, *added])  # type: ignore[attr-defined]
        return func

    return decorate
