"""Volatile values in prompt text: the content that differs per request and breaks a shared prefix.

A date, a time, a Unix timestamp, a UUID, a request id (a value with a digit after an ``id`` key,
or a code of digits or hex, optionally after a short prefix such as ``req_``, following
``request``, ``trace``, ``session``, ``run`` or ``call``: an id, never a word such as ``run
destructive``), a long hex id or a counter near the top of a prompt makes every block after it
differ (block keys are chained), which is the most common way a prefix cache stops paying (a
timestamp at the top of a system prompt: vLLM, SGLang and provider prompt-caching guides all warn
about it). :func:`find_volatile` finds them by pattern, in priority order (a UUID is not also
reported as a counter); :func:`token_offset_of_char` maps a character position back to the token
that holds it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

# (kind, pattern), most specific first; a later pattern never reports a span an earlier one took
PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("uuid", re.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b")),
    (
        "date",
        re.compile(
            r"\b\d{4}-\d{2}-\d{2}(?:[T ]\d{1,2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?"
            r"|\b\d{1,2}/\d{1,2}/\d{2,4}\b"
        ),
    ),
    ("timestamp", re.compile(r"\b1\d{9}(?:\.\d+)?\b")),  # Unix seconds, 2001..2286
    ("time", re.compile(r"\b\d{1,2}:\d{2}(?::\d{2}(?:\.\d+)?)?\b")),
    (
        "request id",  # an id: a digit-bearing value after an ``id`` key, or a hex code after a request word
        re.compile(
            r"(?i)\b(?:(?:req(?:uest)?|trace|session|run|call|conversation|user)[-_ ]?)?id\b[\"']?"
            r"\s*[:=#]\s*[\"']?(?=[\w-]*\d)[A-Za-z0-9][\w-]{3,}"
            r"|(?i:\b(?:req(?:uest)?|trace|session|run|call)[-_:= #]+)"
            r"(?:[A-Za-z]{1,5}[-_])?(?=[0-9a-fA-F-]*\d)[0-9a-fA-F][0-9a-fA-F-]{3,}\b"
        ),
    ),
    ("hex id", re.compile(r"\b[0-9a-fA-F]{16,}\b")),
    ("counter", re.compile(r"\b\d+\b")),
)


@dataclass(frozen=True)
class VolatileSpan:
    """One volatile value: its kind (a :data:`PATTERNS` name), ``[start, end)`` in characters, the text."""

    kind: str
    start: int
    end: int
    text: str


def find_volatile(text: str, kinds: Sequence[str] | None = None) -> list[VolatileSpan]:
    """Every volatile value in ``text``, sorted by start; overlapping matches keep the more specific
    kind. ``kinds`` limits the search (default: all)."""
    spans: list[VolatileSpan] = []
    for kind, pattern in PATTERNS:
        if kinds is not None and kind not in kinds:
            continue
        for match in pattern.finditer(text):
            if not any(s.start < match.end() and match.start() < s.end for s in spans):
                spans.append(VolatileSpan(kind, match.start(), match.end(), match.group()))
    return sorted(spans, key=lambda s: s.start)


def token_offset_of_char(decode: Callable[[Sequence[int]], str], ids: Sequence[int], char: int) -> int:
    """The index of the token that holds character ``char`` of ``decode(ids)``: the smallest ``m``
    with ``len(decode(ids[:m + 1])) > char`` (binary search, ``O(log n)`` decodes)."""
    lo, hi = 0, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if len(decode(ids[: mid + 1])) > char:
            hi = mid
        else:
            lo = mid + 1
    return min(lo, max(len(ids) - 1, 0))
