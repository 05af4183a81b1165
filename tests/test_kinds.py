"""tests/kinds.py marks every test by kind; the fast loop (``-m "not slow"``) never starts kvbench serve."""

import re
from pathlib import Path

from kinds import ENGINE_MODULES, SERVE_FIXTURES, SERVER_MODULES, SLOW_MODULES, kinds_of

REPO = Path(__file__).resolve().parents[1]


def marks(item) -> set[str]:
    return {mark.name for mark in item.iter_markers()} & {"engine", "server", "slow"}


def test_every_entry_of_the_lists_names_a_test_file():
    for entry in ENGINE_MODULES | SERVER_MODULES | SLOW_MODULES:
        path, _, name = entry.partition("::")
        assert (REPO / path).is_file(), entry
        first = name.split("::")[0].split("[")[0]  # a function or a class (a hypothesis state machine)
        assert not name or re.search(rf"\b{re.escape(first)}\b", (REPO / path).read_text()), entry


def test_every_collected_test_carries_the_marks_of_its_kinds(request):
    """Whatever this session collected (all of tests/, or what -m / -k / paths kept)."""
    items = request.session.items
    assert items and all(kinds_of(item) <= marks(item) for item in items)
    if request.config.getoption("markexpr") == "not slow":  # the fast loop: no kvbench serve, no child
        assert not [item.nodeid for item in items if set(item.fixturenames) & SERVE_FIXTURES]
        assert not [item.nodeid for item in items if "slow" in marks(item)]


def test_the_fast_loop_deselects_every_test_that_starts_kvbench_serve(pytester):
    """Collect a small tree with the real hook (tests/conftest.py's) under ``-m "not slow"``."""
    pytester.makeconftest((REPO / "tests" / "conftest.py").read_text())
    pytester.syspathinsert(REPO / "tests")
    pytester.makepyfile(
        test_sample="""
import pytest

@pytest.fixture(scope="module")
def loaded():
    return object()

def test_with_a_server(server):
    pass

def test_with_the_engine_model(loaded):
    pass

def test_plain():
    pass

@pytest.mark.slow
def test_marked_by_hand():
    pass
"""
    )
    result = pytester.runpytest("--collect-only", "-q", "-m", "not slow", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(
        [
            "test_sample.py::test_with_the_engine_model",
            "test_sample.py::test_plain",
            "*2/4 tests collected (2 deselected)*",
        ]
    )
    result = pytester.runpytest("--collect-only", "-q", "-m", "server", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["test_sample.py::test_with_a_server", "*1/4 tests collected*"])


pytest_plugins = ["pytester"]
