import pytest

from kvbench.cli import main


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
