"""Texts of an exact token length, assembled from pieces (``kvbench.workloads.text``).

How: take pieces from a stream while their token counts fit, skip the ones that do not (a few
times), then close with a *filler line* of exactly the remaining count: a capitalized word, then
words that are one token each with their leading space, then ``".\\n"`` (one cl100k token). Every
piece starts with non-whitespace and ends with ``"\\n"``, so under a tokenizer that splits at line
boundaries (cl100k, see ``kvbench.workloads.tokenizer``) the text's count is the sum of the pieces'
counts. For any other tokenizer the whole text is counted again and, on a mismatch, rebuilt from
fewer pieces plus a filler searched for by its real count (``ValueError`` if nothing fits).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from kvbench.workloads.text import FILLER_WORDS
from kvbench.workloads.tokenizer import Tokenizer

_CACHE_ENTRIES = 1 << 17  # piece counts kept per counter
_MAX_SKIPS = 12  # pieces tried after the first one that does not fit, before the filler closes
_ONE_TOKEN_LINES = (".\n", "-\n", "}\n", ")\n")  # tried in order for a 1-token filler


class PieceCounter:
    """Token counts of pieces under one tokenizer, cached (pieces from pools repeat)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.splits_at_lines = bool(tokenizer.splits_at_lines)
        self._counts: dict[str, int] = {}
        self._words: tuple[str, ...] | None = None

    def count(self, text: str) -> int:
        """Tokens of ``text`` encoded alone (ordinary text)."""
        found = self._counts.get(text)
        if found is None:
            found = len(self.tokenizer.encode(text))
            if len(self._counts) < _CACHE_ENTRIES:
                self._counts[text] = found
        return found

    @property
    def filler_words(self) -> tuple[str, ...]:
        """Filler words that are one token with a leading space and one token capitalized."""
        if self._words is None:
            words = tuple(
                w for w in FILLER_WORDS if self.count(" " + w) == 1 and self.count(w.capitalize()) == 1
            )
            self._words = words or FILLER_WORDS
        return self._words


def _filler_text(words: tuple[str, ...], num_words: int, offset: int) -> str:
    chosen = [words[(offset + i) % len(words)] for i in range(num_words)]
    if not chosen:
        return ".\n"
    return chosen[0].capitalize() + "".join(" " + w for w in chosen[1:]) + ".\n"


def filler_line(counter: PieceCounter, num_tokens: int, rng: np.random.Generator) -> str:
    """One line of exactly ``num_tokens`` tokens (>= 1) made of common words.

    Raises:
        ValueError: the tokenizer cannot make such a line from the filler words.
    """
    if num_tokens < 1:
        raise ValueError(f"num_tokens must be >= 1, got {num_tokens}")
    if num_tokens == 1:
        for line in _ONE_TOKEN_LINES:
            if counter.count(line) == 1:
                return line
    words = counter.filler_words
    offset = int(rng.integers(len(words)))
    guess = num_tokens - 1  # n - 1 one-token words, then ".\n"
    for num_words in sorted(range(max(guess - 4, 1), guess + 5), key=lambda n: abs(n - guess)):
        line = _filler_text(words, num_words, offset)
        if counter.count(line) == num_tokens:
            return line
    raise ValueError(f"cannot build a {num_tokens}-token filler line with tokenizer {counter.tokenizer.name}")


def fit_text(counter: PieceCounter, pieces: Iterator[str], num_tokens: int, rng: np.random.Generator) -> str:
    """Text of exactly ``num_tokens`` tokens from ``pieces``; the stream's first piece always leads.

    Raises:
        ValueError: ``num_tokens`` is smaller than the first piece (plus one token), or no exact
            fit exists under a tokenizer that does not split at lines.
    """
    first = next(pieces)
    total = counter.count(first)
    if total > num_tokens or num_tokens - total == 1 and counter.count(".\n") != 1:
        raise ValueError(f"{num_tokens} tokens is too short: the opening line alone is {total} tokens")
    chosen, skips = [first], 0
    while total < num_tokens and skips < _MAX_SKIPS:
        piece = next(pieces)
        size = counter.count(piece)
        left = num_tokens - total - size
        if left >= 0 and left != 1:  # a 1-token remainder would need the bare ".\n" line
            chosen.append(piece)
            total += size
        else:
            skips += 1
    text = "".join(chosen)
    if counter.splits_at_lines:
        return text + filler_line(counter, num_tokens - total, rng) if total < num_tokens else text
    if total < num_tokens:
        try:
            text += filler_line(counter, num_tokens - total, rng)
        except ValueError:
            return _refit(counter, chosen, num_tokens, rng)
    return text if counter.count(text) == num_tokens else _refit(counter, chosen, num_tokens, rng)


def _refit(counter: PieceCounter, chosen: list[str], num_tokens: int, rng: np.random.Generator) -> str:
    """Exact fit by real counts: fewer pieces, then a filler found by trying word counts."""
    words = counter.filler_words
    offset = int(rng.integers(len(words)))
    for keep in range(len(chosen), 0, -1):
        base = "".join(chosen[:keep])
        have = counter.count(base)
        if have == num_tokens:
            return base
        if have > num_tokens:
            continue
        for num_words in range(0, num_tokens - have + 4):
            candidate = base + _filler_text(words, num_words, offset)
            if counter.count(candidate) == num_tokens:
                return candidate
    raise ValueError(
        f"cannot fit text to exactly {num_tokens} tokens with tokenizer {counter.tokenizer.name}"
    )
