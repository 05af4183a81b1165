"""The package's shape, checked from the source (ast): import layers one way, small modules and functions.

Layers (DESIGN.md): cache/, sim/, workloads/ and memory/ never import torch or transformers; nothing
below commands/ imports commands/ or the CLI; engine/ imports nothing from workloads/, backends/,
run/ or results/; request.py, errors.py and constants.py import nothing of kvbench but each other;
outside cache/ and engine/ only the replay step (kvbench/sim/step.py) looks anything up in a cache.
"""

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "kvbench"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
TORCH_FREE = ("cache", "sim", "workloads", "memory")
ENGINE_MUST_NOT_IMPORT = ("kvbench.workloads", "kvbench.backends", "kvbench.run", "kvbench.results")
FOUNDATION = ("kvbench.request", "kvbench.errors", "kvbench.constants")


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports anywhere (top level or inside a function), absolute names."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def starts(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


SOURCES = sorted(PACKAGE.rglob("*.py"))
IMPORTS = {module_name(path): imported_modules(path) for path in SOURCES}


def test_the_layer_rules_hold():
    problems = []
    for module, imports in IMPORTS.items():
        folder = module.split(".")[1] if module.count(".") else ""
        if folder in TORCH_FREE:
            problems += [
                f"{module} imports {name}" for name in imports if starts(name, ("torch", "transformers"))
            ]
        if not starts(module, ("kvbench.commands", "kvbench.cli")):
            problems += [
                f"{module} imports {name}"
                for name in imports
                if starts(name, ("kvbench.commands", "kvbench.cli"))
            ]
        if folder == "engine":
            problems += [
                f"{module} imports {name}" for name in imports if starts(name, ENGINE_MUST_NOT_IMPORT)
            ]
        if module in FOUNDATION:
            problems += [
                f"{module} imports {name}"
                for name in imports
                if starts(name, ("kvbench",)) and not starts(name, FOUNDATION) and name != "kvbench"
            ]
    assert problems == []


def test_the_checker_sees_function_level_imports(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from kvbench.commands.run import run\n    import torch\n")
    assert {"kvbench.commands.run", "kvbench.commands.run.run", "torch"} <= imported_modules(source)


# The caches themselves, the engines (they serve real requests) and the one replay step.
LOOKUP_ALLOWED = ("kvbench.cache", "kvbench.engine", "kvbench.sim.step")


def cache_lookups(path: Path) -> list[int]:
    """Lines where ``path`` calls ``x.lookup(...)`` or takes the bound ``x.lookup`` to call later (no
    other kvbench object has a ``lookup``: every one is a prefix cache's)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return sorted(
        node.lineno for node in ast.walk(tree) if isinstance(node, ast.Attribute) and node.attr == "lookup"
    )


def test_only_the_replay_step_looks_up_a_cache():
    """Every cache-only replay steps a request through :func:`kvbench.sim.step.step`, so the
    last-token cap, the insert after the hit and the release order are written once."""
    problems = [
        f"{path.relative_to(REPO)}:{line}"
        for path in SOURCES
        if not starts(module_name(path), LOOKUP_ALLOWED)
        for line in cache_lookups(path)
    ]
    assert problems == []


def test_the_lookup_check_sees_calls_and_bound_methods(tmp_path):
    source = tmp_path / "m.py"
    source.write_text(
        "def f(cache, prompt):\n    match = cache.lookup(prompt, 3)\n    find = cache.lookup\n"
        "    return lookup(prompt), match._lookup\n"
    )
    assert cache_lookups(source) == [2, 3]


ENGINE_CLASSES = frozenset({"HFEngine", "PagedEngine"})


# Outside this change's folders (issue 26 part 3 works in kvbench/peer/): builds its replay engine
# directly; it moves to kvbench.engine.factory.make_engine when that work is merged.
def engine_type_uses(path: Path) -> list[str]:
    """Where ``path`` imports an engine class or asks ``isinstance(x, <engine class>)`` (DESIGN.md: code
    outside engine/ never asks which engine it holds; it builds one with ``make_engine``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("kvbench.engine"):
            found += [
                f"{node.lineno}: imports {alias.name}" for alias in node.names if alias.name in ENGINE_CLASSES
            ]
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", None) == "isinstance"
            and len(node.args) == 2
        ):
            kinds = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
            named = {getattr(kind, "id", None) or getattr(kind, "attr", None) for kind in kinds}
            found += [f"{node.lineno}: isinstance(..., {name})" for name in sorted(named & ENGINE_CLASSES)]
    return found


def test_no_module_outside_engine_asks_which_engine_it_holds():
    problems = [
        f"{path.relative_to(REPO)}:{use}"
        for path in SOURCES
        if not path.relative_to(PACKAGE).parts[0] == "engine"
        for use in engine_type_uses(path)
    ]
    assert problems == []


def test_the_engine_type_check_sees_isinstance_and_imports(tmp_path):
    source = tmp_path / "m.py"
    source.write_text(
        "from kvbench.engine.paged.engine import PagedEngine\nimport kvbench.engine.engine as e\n"
        "def f(x):\n    return isinstance(x, (int, e.HFEngine)) or isinstance(x, PagedEngine)\n"
        "from kvbench.engine.factory import make_engine\n"
    )
    assert engine_type_uses(source) == [
        "1: imports PagedEngine",
        "4: isinstance(..., HFEngine)",
        "4: isinstance(..., PagedEngine)",
    ]


def function_lengths(path: Path):
    """``(name, line, length)`` of every function; the length is the body's, docstring included.

    The signature is left out: ruff format writes one parameter a line once a signature is too long,
    so a typer command's options would count against its body (their number has no limit here)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node.lineno, node.end_lineno - node.body[0].lineno + 1


def test_a_function_is_measured_from_its_body(tmp_path):
    source = tmp_path / "m.py"
    source.write_text('def f(\n    a,\n    b,\n):\n    """Doc."""\n    return a + b\n')
    assert list(function_lengths(source)) == [("f", 1, 2)]


@pytest.mark.parametrize("root", ["kvbench", "tests", "benchmarks"])
def test_modules_and_functions_stay_small(root):
    too_long = []
    for path in sorted((REPO / root).rglob("*.py")):
        num_lines = len(path.read_text(encoding="utf-8").splitlines())
        if num_lines > MAX_MODULE_LINES:
            too_long.append(f"{path.relative_to(REPO)}: {num_lines} lines")
        too_long += [
            f"{path.relative_to(REPO)}:{line} {name}(): {length} lines"
            for name, line, length in function_lengths(path)
            if length > MAX_FUNCTION_LINES
        ]
    assert too_long == []


def test_no_options_dict_from_locals():
    offenders = [
        str(path.relative_to(REPO))
        for path in SOURCES
        if "dict(locals())" in path.read_text(encoding="utf-8")
    ]
    assert offenders == []


def test_tests_never_import_the_tests_folder_as_a_package():
    """``tests`` has no ``__init__.py``: ``from tests.x import y`` works only where the repository
    root happens to be on ``sys.path`` (a dev ``PYTHONPATH``), not under CI's plain ``pytest``. Shared
    helpers live in a non-test module imported by its bare name (tests/server/live_server.py)."""
    offenders = []
    for path in (REPO / "tests").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else ([alias.name for alias in node.names] if isinstance(node, ast.Import) else [])
            )
            offenders += [
                f"{path.relative_to(REPO)}:{node.lineno}"
                for name in names
                if name == "tests" or name.startswith("tests.")
            ]
    assert offenders == []
