"""Counts and articles in messages: "1 request", "2 requests", "an anthropic model".

Imports nothing of kvbench, so every layer can use it.
"""

from __future__ import annotations


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """``count`` with ``noun`` in the right number, thousands separated: ``1 request``,
    ``2,000 requests``, ``1 size``; ``plural`` for irregular nouns (default ``noun + "s"``)."""
    return f"{count:,} {noun if count == 1 else plural or noun + 's'}"


def with_article(word: str) -> str:
    """``word`` after "a" or "an" by its first letter (a vowel: "an"): ``an anthropic``, ``a google``."""
    return f"{'an' if word[:1].lower() in 'aeiou' else 'a'} {word}"
