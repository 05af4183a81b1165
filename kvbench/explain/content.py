"""Content causes: why a prompt stops matching the best earlier one at token ``k``.

Given the two id sequences (this prompt, and the stored sequence of the earlier request it shares
most with) and the divergence offset ``k``, the detectors decode a window around ``k`` and look,
in this order, for:

1. ``text re-rendered``: the same chat messages rendered to different tokens (another template);
   found by rendering the messages both requests share and seeing ``k`` fall inside them;
2. ``reasoning stripped``: the earlier text has a ``<think>``-style block at ``k`` and this one goes
   on with the text after it (a chat template or client that drops reasoning from history);
3. ``re-tokenized``: both sides decode to the same text with different ids (a reply sent back as
   text and re-encoded differently from what was generated);
4. ``JSON key order``: a JSON object that starts before ``k`` parses to the same value on both
   sides, with its keys in another order (tool-call arguments serialized by another library);
5. ``volatile value``: a date, time, timestamp, UUID, request id or counter that straddles ``k``
   and differs (:mod:`kvbench.explain.volatile`);
6. otherwise ``content differs``.

Each finding carries the offset and a short excerpt of both texts around it (``‖`` marks ``k``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvbench.explain.volatile import find_volatile
from kvbench.request import Message
from kvbench.sim.outputs import PLACEHOLDER_BASE

WINDOW_TOKENS = 24  # tokens decoded on each side of the divergence for the text detectors
JSON_WINDOW_TOKENS = 384  # how far JSON detection looks back and ahead
EXCERPT_TOKENS = 8
EXCERPT_CHARS = 32  # each side of an excerpt at most; random-token text decodes to long runs
CUT = "✂"  # marks an excerpt side cut at EXCERPT_CHARS
REASONING = re.compile(r"\s*<(think|thinking|reasoning)>.*?</\1>\s*", re.S)


@dataclass(frozen=True)
class Finding:
    """A content cause: ``kind``, the token offset, a one-line ``detail``, excerpts of both texts."""

    kind: str
    offset_tokens: int
    detail: str
    excerpt: str
    earlier_excerpt: str


def decode(tokenizer, ids: np.ndarray) -> str:
    """``tokenizer.decode`` of ``ids``, with a run of placeholder outputs (unknown generated tokens,
    :data:`kvbench.sim.outputs.PLACEHOLDER_BASE` and up) shown as ``⟨generated⟩``."""
    ids = np.asarray(ids)
    unknown = np.flatnonzero(ids >= PLACEHOLDER_BASE)
    if unknown.size:
        return _decode(tokenizer, ids[: unknown[0]].tolist()) + "⟨generated⟩"
    return _decode(tokenizer, ids.tolist())


def _decode(tokenizer, ids: list[int]) -> str:
    """Token-id traffic (random ids) may hold ids the vocabulary leaves unassigned: shown as ``�``."""
    try:
        return tokenizer.decode(ids)
    except (KeyError, ValueError):
        parts = []
        for token in ids:
            try:
                parts.append(tokenizer.decode([token]))
            except (KeyError, ValueError):
                parts.append("\ufffd")
        return "".join(parts)


def excerpt(
    tokenizer, ids: np.ndarray, offset: int, width: int = EXCERPT_TOKENS, max_chars: int = EXCERPT_CHARS
) -> str:
    """``…before‖after…`` around token ``offset`` (``width`` tokens each side), newlines shown as
    ``⏎``; a side longer than ``max_chars`` characters is cut to them, the cut marked ``✂``
    (``…✂re the cut‖after the c✂…``)."""
    before = decode(tokenizer, ids[max(offset - width, 0) : offset]).replace("\n", "⏎")
    after = decode(tokenizer, ids[offset : offset + width]).replace("\n", "⏎")
    if len(before) > max_chars:
        before = CUT + before[-max_chars:]
    if len(after) > max_chars:
        after = after[:max_chars] + CUT
    return f"…{before}‖{after}…"


def detect(
    tokenizer,
    prompt: np.ndarray,
    earlier: np.ndarray,
    offset: int,
    messages: Sequence[Message] | None = None,
    earlier_messages: Sequence[Message] | None = None,
) -> Finding:
    """The content cause at ``offset`` (the first index where ``prompt`` and ``earlier`` differ)."""
    shown = excerpt(tokenizer, prompt, offset), excerpt(tokenizer, earlier, offset)
    kind, detail = _rendered(tokenizer, offset, messages, earlier_messages) or _textual(
        tokenizer, prompt, earlier, offset
    )
    return Finding(kind, offset, detail, *shown)


def last_message_offset(tokenizer, messages: Sequence[Message] | None) -> float:
    """Token offset where the last message's render starts (``inf`` without messages or a chat renderer)."""
    if not messages or not hasattr(tokenizer, "render_messages"):
        return float("inf")
    return len(tokenizer.render_messages(messages[:-1])) - len(tokenizer.render_messages([]))


def _rendered(tokenizer, offset: int, messages, earlier_messages) -> tuple[str, str] | None:
    if not messages or not earlier_messages or not hasattr(tokenizer, "render_messages"):
        return None
    common = 0
    while common < min(len(messages), len(earlier_messages)) and messages[common] == earlier_messages[common]:
        common += 1
    if common == 0:
        return None
    rendered = len(tokenizer.render_messages(earlier_messages[:common])) - len(tokenizer.render_messages([]))
    if offset < rendered:
        return (
            "text re-rendered",
            f"the same first {common} message(s) render to different tokens from token "
            f"{offset} (another chat template or renderer)",
        )
    return None


def _textual(tokenizer, prompt: np.ndarray, earlier: np.ndarray, offset: int) -> tuple[str, str]:
    left = decode(tokenizer, prompt[max(offset - WINDOW_TOKENS, 0) : offset])
    mine = decode(tokenizer, prompt[offset : offset + WINDOW_TOKENS])
    theirs = decode(tokenizer, earlier[offset : offset + WINDOW_TOKENS])
    found = REASONING.match(theirs)
    if (
        found
        and found.group(1)
        and theirs[found.end() : found.end() + 16].strip()
        and mine.lstrip().startswith(theirs[found.end() :].strip()[:16])
    ):
        return (
            "reasoning stripped",
            f"the earlier text has a <{found.group(1)}> block here that this one drops",
        )
    shorter = min(len(mine), len(theirs))
    if shorter and mine[:shorter] == theirs[:shorter]:
        return "re-tokenized", "the same text as before, encoded as different token ids (a reply re-encoded)"
    json_finding = _json_key_order(tokenizer, prompt, earlier, offset)
    if json_finding is not None:
        return json_finding
    volatile = _volatile(left, mine, theirs)
    if volatile is not None:
        return volatile
    return "content differs", "the text differs here (no volatile value, re-render or JSON reorder found)"


def _json_key_order(
    tokenizer, prompt: np.ndarray, earlier: np.ndarray, offset: int
) -> tuple[str, str] | None:
    start = max(offset - JSON_WINDOW_TOKENS, 0)
    mine = decode(tokenizer, prompt[start : offset + JSON_WINDOW_TOKENS])
    theirs = decode(tokenizer, earlier[start : offset + JSON_WINDOW_TOKENS])
    junction = len(decode(tokenizer, prompt[start:offset]))
    decoder = json.JSONDecoder()
    position = mine.rfind("{", 0, junction + 1)
    for _ in range(8):  # the innermost objects first, then the ones around them
        if position < 0:
            return None
        try:
            value, end = decoder.raw_decode(mine, position)
            other, other_end = decoder.raw_decode(theirs, position)
        except ValueError:
            position = mine.rfind("{", 0, position)
            continue
        if value == other and mine[position:end] != theirs[position:other_end]:
            keys = ", ".join(list(value)[:4]) if isinstance(value, dict) else ""
            return "JSON key order", f"a JSON object with the same keys ({keys}) in another order"
        position = mine.rfind("{", 0, position)
    return None


def _volatile(left: str, mine: str, theirs: str) -> tuple[str, str] | None:
    junction = len(left)
    spans_mine = [s for s in find_volatile(left + mine) if s.start <= junction + 1 and s.end > junction - 1]
    spans_theirs = {(s.kind, s.start): s for s in find_volatile(left + theirs)}
    for span in spans_mine:
        other = spans_theirs.get((span.kind, span.start))
        if other is not None and other.text != span.text:
            return f"volatile value ({span.kind})", f"{span.text!r} here, {other.text!r} before"
    # a lone number is any text's, not a volatile value
    named = [s for s in spans_mine if s.kind != "counter"]
    if named:
        span = named[0]
        return f"volatile value ({span.kind})", f"{span.text!r} here differs from the earlier text"
    return None
