"""``--help`` reads at 80 columns and through a pipe: every option name of every command
appears whole (it was ``--requests,--num-requ…``), nothing is cut with an ellipsis, and the long
commands group their options in panels."""

import os
import re
import subprocess
import sys

import pytest
import typer

from kvbench import cli


def leaf_commands():
    cli._register_for([])
    found = []

    def walk(command, path):
        if hasattr(command, "commands"):
            for name, sub in sorted(command.commands.items()):
                if not getattr(sub, "hidden", False):
                    walk(sub, [*path, name])
        else:
            found.append((path, command))

    walk(typer.main.get_command(cli.app), [])
    return found


def option_names(command) -> list[str]:
    return [
        name
        for param in command.params
        if param.param_type_name == "option" and not param.hidden
        for name in param.opts + param.secondary_opts
    ]


def whole(name: str, text: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text) is not None


@pytest.mark.parametrize(
    "path,command", leaf_commands(), ids=lambda value: " ".join(value) if isinstance(value, list) else ""
)
def test_every_option_name_is_whole_in_help_at_80_columns(path, command, kvbench, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    code, help_text, _ = kvbench(*path, "--help")
    assert code == 0
    assert [name for name in option_names(command) if not whole(name, help_text)] == []
    assert "…" not in help_text and max(map(len, help_text.splitlines())) <= 80


def test_piped_run_help_keeps_every_name(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "TERMINAL_WIDTH")}
    # stdout is a pipe, as in `kvbench run --help | cat`
    done = subprocess.run(
        [sys.executable, "-m", "kvbench.cli", "run", "--help"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    command = next(c for p, c in leaf_commands() if p == ["run"])
    assert done.returncode == 0 and "…" not in done.stdout
    assert [name for name in option_names(command) if not whole(name, done.stdout)] == []


@pytest.mark.parametrize("word", ["run", "sweep", "sim", "serve", "route"])
def test_long_commands_group_their_options_in_panels(word, kvbench, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    _, help_text, _ = kvbench(word, "--help")
    titles = re.findall(r"╭─ (.+?) ─", help_text)
    assert len([t for t in titles if t not in ("Arguments", "Options")]) >= 3
