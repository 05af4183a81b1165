"""Bad rows of an imported file: stop at the first one (the default) or skip and count them.

Every importer (:mod:`kvbench.workloads.formats.importing`) parses each row inside
:meth:`BadRows.guard`; a malformed row raises :class:`kvbench.errors.InputError` naming the file,
the row and the field. Without ``skip`` that error stops the import; with ``skip`` (``kvbench trace
import --skip-bad``) the row is left out, counted, and the first message kept for the report.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from kvbench.errors import InputError

T = TypeVar("T")


@dataclass
class BadRows:
    """``skip``: leave bad rows out instead of stopping. ``count``: rows left out; ``first``: the
    first one's one-line error (``None`` while there is none)."""

    skip: bool = False
    count: int = 0
    first: str | None = None

    def guard(self, parse: Callable[[], T]) -> T | None:
        """``parse()``; its ``InputError`` is raised again, or with ``skip`` counted and ``None``
        returned."""
        try:
            return parse()
        except InputError as exc:
            if not self.skip:
                raise
            self.count += 1
            self.first = self.first or str(exc)
            return None


def number_at_least(value: object, minimum: float) -> bool:
    """Whether ``value`` is an int or float (not a bool), finite and ``>= minimum``."""
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= minimum
    )


def int_at_least(value: object, minimum: int) -> bool:
    """Whether ``value`` is an int (not a bool) ``>= minimum``."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum
