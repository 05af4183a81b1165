"""A bad option value, caught while typer parses the flags, as kvbench's one error line.

typer's own message ("Invalid value for '--requests' / '--num-requests': Input should be greater
than or equal to 1", under a usage block) becomes ``--requests: 0: must be >= 1``: the flag as typed,
the value as typed, the rule. Range rules come from ``typer.Option(min=..., max=...)``, choices from
``str`` Enums, the rest from callbacks (:mod:`kvbench.commands.choices`); all exit 2 before a command
body runs, so before any model loads.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

_RULES = (
    (re.compile(r"greater than or equal to (\S+)"), ">= {}"),
    (re.compile(r"less than or equal to (\S+)"), "<= {}"),
    (re.compile(r"greater than (\S+)"), "> {}"),
    (re.compile(r"less than (\S+)"), "< {}"),
)
_CHOICES = re.compile(r"is not one of (.+?)\.?$")


def bad_value_line(exc, args: Sequence[str]) -> str | None:
    """``FLAG: VALUE: RULE`` for a ``BadParameter`` raised for an option, else ``None`` (arguments,
    missing options and anything typer did not attach to an option keep click's own text).

    ``args``: the command line as given (without the program name), to recover the flag's spelling
    and the raw value; a value from a ``KVBENCH_*`` variable is named with that variable."""
    param = getattr(exc, "param", None)
    if param is None or getattr(param, "param_type_name", "") != "option":
        return None
    names = [*param.opts, *param.secondary_opts]
    flag, value = _typed(names, args)
    if flag is None:  # not on the command line: it came from the environment
        envvar = _envvar(exc, param)
        flag, value = (envvar, os.environ.get(envvar)) if envvar else (names[0], None)
    choices = _choices(exc.message)
    if choices:
        return f"{flag} must be {choices}" + (f", got {value!r}" if value is not None else "")
    rule = _rule(exc.message)
    return f"{flag}: {value}: {rule}" if value is not None else f"{flag}: {rule}"


def _typed(names: list[str], args: Sequence[str]) -> tuple[str | None, str | None]:
    for index, arg in enumerate(args):
        name, equals, value = arg.partition("=")
        if name in names:
            if equals:
                return name, value
            return name, args[index + 1] if index + 1 < len(args) else None
    return None, None


def _envvar(exc, param) -> str | None:
    ctx = getattr(exc, "ctx", None)
    if ctx is None or not param.name:
        return None
    prefix = getattr(ctx, "auto_envvar_prefix", None)
    return (
        param.envvar
        if isinstance(param.envvar, str)
        else f"{prefix}_{param.name.upper()}"
        if prefix
        else None
    )


def _rule(message: str) -> str:
    for pattern, template in _RULES:
        found = pattern.search(message)
        if found:
            return "must be " + template.format(found.group(1))
    return message


def _choices(message: str) -> str | None:
    """``'on' or 'off'`` out of typer's "'x' is not one of 'on', 'off'." (an Enum option), else None."""
    found = _CHOICES.search(message)
    if not found:
        return None
    *others, last = [part.strip() for part in found.group(1).split(",")]
    return f"{', '.join(others)} or {last}" if others else last
