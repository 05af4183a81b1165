"""``--help`` a person can read at 80 columns through a pipe, for every command and group: no word or
environment-variable name split across lines (they were: ``KVBENCH_RUN_MAX_NUM_SE`` / ``QS``,
``results/run-NAME-TIME.p`` / ``arquet``, with a 13-character description column), no ``<bool>``
metavar, a usage line that says ``SOURCE`` (it said ``{source}``), no tracker numbers, and a command
list whose summaries are each command's whole first sentence (they broke mid-sentence where the
docstring had a line break)."""

import re

import pytest
import typer

from kvbench import cli
from kvbench.commands.help_layout import first_sentence

BORDER = re.compile(r"^[│╭╰ ]|[│╮╯]\s*$")


def all_commands():
    """``(path, click command)`` for the root, every group and every command, in order."""
    cli._register_for([])
    found = []

    def walk(command, path):
        found.append((path, command))
        for name, sub in sorted(getattr(command, "commands", {}).items()):
            if not getattr(sub, "hidden", False):
                walk(sub, [*path, name])

    walk(typer.main.get_command(cli.app), [])
    return found


def unboxed(text: str) -> list[str]:
    """The help's lines without the panels' borders."""
    return [BORDER.sub("", BORDER.sub("", line)).strip() for line in text.splitlines()]


def words_of(param) -> list[str]:
    """The words of an option's help and its env var: each must appear whole on one line."""
    words = [w for w in (param.help or "").split() if "[" not in w and "]" not in w]
    envvar = getattr(param, "envvar", None) or None
    return words + ([envvar] if isinstance(envvar, str) else [])


@pytest.mark.parametrize(
    "path,command", all_commands(), ids=lambda v: " ".join(v) if isinstance(v, list) else ""
)
def test_help_reads_whole_at_80_columns(path, command, kvbench, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    code, text, _ = kvbench(*path, "--help")
    assert code == 0
    lines = unboxed(text)
    tokens = {token for line in lines for token in line.split()}
    env_prefix = "_".join(["KVBENCH", *path]).upper().replace("-", "_")
    split = []
    for param in command.params:
        if getattr(param, "hidden", False):
            continue
        expected = words_of(param)
        shown = getattr(param, "allow_from_autoenv", False) and getattr(param, "show_envvar", False)
        if param.param_type_name == "option" and shown and path and not getattr(param, "envvar", None):
            expected.append(f"{env_prefix}_{param.name.upper()}")
        split += [word for word in expected if word not in tokens and f"{word}]" not in tokens]
    assert split == [], f"split or missing at 80 columns: {split[:8]}"
    assert "<bool>" not in text
    usage = next(line for line in lines if line.startswith("Usage:"))
    assert "{" not in usage and "}" not in usage, usage
    assert re.search(r"\bissue \d", text) is None


@pytest.mark.parametrize(
    "path,command",
    [(p, c) for p, c in all_commands() if getattr(c, "commands", None)],
    ids=lambda v: " ".join(v) if isinstance(v, list) else "",
)
def test_command_lists_show_each_first_sentence_whole(path, command, kvbench, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    _, text, _ = kvbench(*path, "--help")
    panel = text[text.index("─ Commands ─") :]
    entries, current = {}, None
    for line in unboxed(panel)[1:]:
        first, _, rest = line.partition(" ")
        if first in command.commands:
            current = first
            entries[current] = rest.strip()
        elif current and line and not set(line) <= {"─"}:
            entries[current] += " " + line
    for name, sub in command.commands.items():
        if getattr(sub, "hidden", False):
            continue
        shown = " ".join(entries[name].split())
        assert shown == first_sentence(sub.help or ""), (name, shown)


def test_run_help_fits_in_half_its_old_length(kvbench, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    _, text, _ = kvbench("run", "--help")
    assert len(text.splitlines()) < 455 // 2  # 455 lines with a 13-character description column
    assert "results/run-NAME-TIME.parquet" in text and "KVBENCH_RUN_MAX_NUM_SEQS" in text
