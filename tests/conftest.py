from pathlib import Path

import pytest

from kvbench.cli import main
from kinds import mark_by_kind
from serve_process import ServeProcess

REPO = Path(__file__).resolve().parents[1]


@pytest.hookimpl(tryfirst=True)  # before pytest's own hook deselects by -m
def pytest_collection_modifyitems(items):
    """Mark every test ``engine`` / ``server`` / ``slow`` by its fixtures and module (tests/kinds.py)."""
    mark_by_kind(items)


@pytest.fixture(scope="session")
def shared_data():
    """The shared data folder beside the repository (../shared/data); skipped where absent."""
    path = REPO.parent / "shared" / "data"
    if not path.is_dir():
        pytest.skip("../shared/data is not beside this checkout")
    return path


@pytest.fixture
def kvbench(capsys):
    """kvbench(*args) -> (exit_code, stdout, stderr), run in-process through the real entry point."""

    def run(*args):
        try:
            main([str(a) for a in args])
            code = 0
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else 1
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


@pytest.fixture(scope="module")
def server():
    """A real ``kvbench serve`` on a free loopback port (one per test module that asks)."""
    process = ServeProcess()  # boots while the first test runs the in-process engine
    yield process
    process.stop()


@pytest.fixture(scope="module")
def paged_radix_server():
    """A real ``kvbench serve --engine paged --cache-kind radix`` (the radix tree over the KV pool)."""
    process = ServeProcess("--engine", "paged", "--cache-kind", "radix")
    yield process
    process.stop()


@pytest.fixture(scope="module")
def prompt_only_server():
    """A real ``kvbench serve --prompt-only`` (prompt blocks cached, generated ones not)."""
    process = ServeProcess("--prompt-only")
    yield process
    process.stop()
