"""Where the docs live and how their pages are read, for the tests of tests/docs/."""

from __future__ import annotations

import re
from dataclasses import dataclass
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


SKIP = re.compile(r"<!-- docs-test: skip \((?P<reason>[^)]+)\) -->\s*\n$")
COMMAND = re.compile(r"(^|&& |; |\| )kvbench ")  # a line that runs kvbench, alone or after another command
FENCE = re.compile(r"^```(?P<lang>[a-z]*)\n(?P<body>.*?)^```", re.S | re.M)


@dataclass(frozen=True)
class CodeBlock:
    """One fenced block of a page: where it starts (``page:line``), its language and text, and the
    reason given by a ``<!-- docs-test: skip (reason) -->`` comment just before it (``None``: run it)."""

    page: str
    line: int
    lang: str
    body: str
    skip_reason: str | None

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def code_blocks(lang: str) -> list[CodeBlock]:
    """Every ``lang`` block of the docs pages and the README, in page order."""
    blocks = []
    for path in [REPO / "README.md", *pages()]:
        text = path.read_text(encoding="utf-8")
        for match in FENCE.finditer(text):
            if match["lang"] == lang:
                skip = SKIP.search(text[: match.start()][-300:])
                blocks.append(
                    CodeBlock(
                        path.relative_to(REPO).as_posix(),
                        text.count("\n", 0, match.start()) + 1,
                        lang,
                        match["body"],
                        skip["reason"] if skip else None,
                    )
                )
    return blocks


def commands(block: CodeBlock) -> list[str]:
    """The command lines of a bash block that run ``kvbench`` (continuations joined, comments dropped)."""
    joined = block.body.replace("\\\n", " ")
    lines = (line.split("  #")[0].strip() for line in joined.splitlines())
    return [line for line in lines if COMMAND.search(line)]
