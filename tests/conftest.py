from pathlib import Path

import pytest

from kvbench.cli import main

REPO = Path(__file__).resolve().parents[1]


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
