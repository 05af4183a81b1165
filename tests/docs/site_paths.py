"""Where the docs live and how their pages are read, for the tests of tests/docs/."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"


def pages() -> list[Path]:
    """Every page of the site (docs/**/*.md but docs/_incoming/, which the site excludes)."""
    return sorted(p for p in DOCS.rglob("*.md") if "_incoming" not in p.relative_to(DOCS).parts)


def page_text(name: str) -> str:
    return (DOCS / name).read_text(encoding="utf-8")


def code_spans(text: str) -> set[str]:
    """Every `inline code` span of a Markdown text."""
    return set(re.findall(r"`([^`\n]+)`", text))
