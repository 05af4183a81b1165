"""The docs site builds with ``mkdocs build --strict`` (a broken link, anchor or nav entry fails it),
every page is in the nav, and the command and architecture pages name what the code has."""

import subprocess
import sys

import pytest
import typer
import yaml
from site_paths import DOCS, REPO, code_spans, page_text, pages

from kvbench import cli

pytestmark = pytest.mark.slow  # mkdocs build: a few seconds


def nav_pages(entries) -> set[str]:
    found = set()
    for entry in entries:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        found |= nav_pages(value) if isinstance(value, list) else {value}
    return found


def test_mkdocs_build_strict_passes(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "site" / "results-reference" / "index.html").exists()
    assert not (tmp_path / "site" / "_incoming").exists()


def test_every_page_is_in_the_nav():
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text(encoding="utf-8"))
    assert {p.relative_to(DOCS).as_posix() for p in pages()} == nav_pages(config["nav"])


def root_command():
    cli._register_for([])
    return typer.main.get_command(cli.app)


def option_names(command) -> set[str]:
    names = set()
    for param in command.params:
        if param.param_type_name == "option" and not getattr(param, "hidden", False):
            names |= set(param.opts + param.secondary_opts)
    for sub in getattr(command, "commands", {}).values():
        if not getattr(sub, "hidden", False):
            names |= option_names(sub)
    return names


def test_every_command_has_a_page_naming_each_of_its_options():
    missing = {}
    for name, command in root_command().commands.items():
        page = DOCS / "commands" / f"{name}.md"
        assert page.exists(), f"no docs/commands/{name}.md"
        absent = option_names(command) - code_spans(page.read_text(encoding="utf-8"))
        if absent:
            missing[name] = sorted(absent)
    assert missing == {}


def test_the_architecture_page_names_every_folder_and_module():
    text = page_text("architecture.md")
    spans = code_spans(text)
    package = REPO / "kvbench"
    folders = {
        p.relative_to(REPO).as_posix() + "/"
        for p in package.rglob("*")
        if p.is_dir() and p.name != "__pycache__"
    }
    modules = {p.stem for p in package.rglob("*.py") if p.name != "__init__.py"}
    assert sorted(folders - spans) == [] and sorted(modules - spans) == []
