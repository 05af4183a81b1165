"""Every install hint kvbench prints says the command that keeps the CPU torch of
constraints-cpu.txt: ``pip install -c constraints-cpu.txt -e '.[X]'`` from a checkout,
never ``pip install 'kvbench[X]'`` (not on any index; unconstrained, it resolves a CUDA torch)."""

import re
from pathlib import Path

import pytest

from kvbench.extras import EXTRA_OF_MODULE, install_command, missing_extra

REPO = Path(__file__).resolve().parents[1]
EXTRAS = ("engine", "serve", "plots", "play")


@pytest.mark.parametrize("module", sorted(EXTRA_OF_MODULE))
def test_a_missing_module_names_its_extra_and_the_constrained_command(module):
    extra = EXTRA_OF_MODULE[module]
    message = missing_extra(ModuleNotFoundError(f"No module named {module!r}", name=module))
    assert message == (
        f"needs the [{extra}] extra; from a checkout: pip install -c constraints-cpu.txt "
        f"-e '.[{extra}]' (No module named {module!r})"
    )


def test_every_extra_of_the_pyproject_has_a_module_or_is_a_group():
    pyproject = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    assert set(EXTRAS) <= set(EXTRA_OF_MODULE.values())
    assert all(f"\n{extra} = [" in pyproject for extra in EXTRAS)


def test_the_core_install_command_has_no_extra():
    assert install_command(None) == "pip install -c constraints-cpu.txt -e ."


def test_no_source_file_prints_the_unconstrained_hint():
    pattern = re.compile(r"pip install '?kvbench\[|pip install (anthropic|textual|matplotlib|torch)\b")
    found = [
        f"{path.relative_to(REPO)}:{n}"
        for folder in ("kvbench", "examples", ".ci")
        for path in sorted((REPO / folder).rglob("*"))
        if path.is_file() and path.suffix in ("", ".py", ".sh", ".yml")
        for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
        if pattern.search(line)
    ]
    assert found == []
