"""The package's shape, checked from the source (ast): import layers one way, small modules and functions.

Layers (DESIGN.md): cache/, sim/, workloads/ and memory/ never import torch or transformers; nothing
below commands/ imports commands/ or the CLI; engine/ imports nothing from workloads/, backends/,
run/ or results/; request.py, errors.py and constants.py import nothing of kvbench but each other;
only commands/ and the CLI import rich (library code returns plain data, the command draws it).
outside cache/ and engine/ only the replay step (kvbench/sim/step.py) looks anything up in a cache.
"""

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "kvbench"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
TORCH_FREE = ("cache", "sim", "workloads", "memory")
ENGINE_MUST_NOT_IMPORT = ("kvbench.workloads", "kvbench.backends", "kvbench.run", "kvbench.results")
FOUNDATION = ("kvbench.request", "kvbench.errors", "kvbench.constants")
RENDERERS = ("kvbench.commands", "kvbench.cli")  # the only modules that may import rich


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


def found_outside(check, allowed: tuple[str, ...]) -> list[str]:
    """``path:finding`` for every finding of ``check(path)`` in a module outside ``allowed`` (module
    name prefixes)."""
    return [
        f"{path.relative_to(REPO)}:{finding}"
        for path in SOURCES
        if not starts(module_name(path), allowed)
        for finding in check(path)
    ]


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


def rich_imports(imports: dict[str, set[str]]) -> list[str]:
    """``MODULE imports NAME, ...`` for each module outside :data:`RENDERERS` that imports rich (at the
    top level or inside a function)."""
    found = {
        module: sorted(name for name in names if starts(name, ("rich",)))
        for module, names in sorted(imports.items())
        if not starts(module, RENDERERS)
    }
    return [f"{module} imports {', '.join(names)}" for module, names in found.items() if names]


def test_only_the_commands_import_rich():
    """Library code never renders (DESIGN.md): it returns plain data (dataclasses, strings, numbers) and
    the command in kvbench/commands/ turns it into tables, markup and progress bars."""
    offenders = rich_imports(IMPORTS)
    assert not offenders, "rich imported outside kvbench/commands/ and kvbench/cli.py:\n" + "\n".join(
        offenders
    )


def test_the_rich_check_names_library_modules_importing_rich_anywhere(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("import rich\n\ndef f():\n    from rich.table import Table\n    return Table()\n")
    imports = imported_modules(source)
    assert rich_imports(
        {"kvbench.results.m": imports, "kvbench.commands.m": imports, "kvbench.cli": imports}
    ) == ["kvbench.results.m imports rich, rich.table, rich.table.Table"]


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
    assert found_outside(cache_lookups, LOOKUP_ALLOWED) == []


def calls_to(name: str):
    """A check: the lines where ``path`` calls ``name(...)`` (a bare name or an attribute)."""

    def check(path: Path) -> list[int]:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        return sorted(
            node.lineno
            for node in ast.walk(tree)
            if isinstance(node, ast.Call)
            and (getattr(node.func, "id", None) == name or getattr(node.func, "attr", None) == name)
        )

    return check


def test_one_function_carries_out_every_run():
    """A run is a plan (:class:`kvbench.run.plan.RunPlan`) carried out by
    :func:`kvbench.run.execute.execute`: no backend assembles its own writer and send loop. (The
    peer harness and the virtual clock drive the send loop without a results file.)"""
    assert found_outside(calls_to("RunWriter"), ("kvbench.run.execute", "kvbench.results.writer")) == []
    senders = ("kvbench.run.execute", "kvbench.run.loop", "kvbench.run.clock", "kvbench.peer.driver")
    assert found_outside(calls_to("send_requests"), senders) == []


def test_the_call_check_sees_names_and_attributes(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("RunWriter(1)\nw.RunWriter(2)\nx = RunWriter\nRunWriters(3)\n")
    assert calls_to("RunWriter")(source) == [1, 2]


def test_the_lookup_check_sees_calls_and_bound_methods(tmp_path):
    source = tmp_path / "m.py"
    source.write_text(
        "def f(cache, prompt):\n    match = cache.lookup(prompt, 3)\n    find = cache.lookup\n"
        "    return lookup(prompt), match._lookup\n"
    )
    assert cache_lookups(source) == [2, 3]


ENGINE_CLASSES = frozenset({"HFEngine", "PagedEngine"})


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
    assert found_outside(engine_type_uses, ("kvbench.engine",)) == []


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


KIND_COMPARISONS = (ast.Is, ast.IsNot, ast.Eq, ast.NotEq, ast.In, ast.NotIn)


def is_engine_kind(node: ast.AST) -> bool:
    """``EngineKind.X`` (or ``module.EngineKind.X``), or a tuple / list / set holding one."""
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(is_engine_kind(item) for item in node.elts)
    owner = getattr(node, "value", None) if isinstance(node, ast.Attribute) else None
    return (getattr(owner, "id", None) or getattr(owner, "attr", None)) == "EngineKind"


def engine_kind_comparisons(path: Path) -> list[str]:
    """Where ``path`` compares with an ``EngineKind`` member (``is``, ``==``, ``in`` a tuple of kinds,
    a ``case``): code outside engine/ asks the kind's spec (``EngineKind.spec``) or the engine's
    ``spec`` what it is, never which kind it is. A default (``engine=EngineKind.COPY``) is no
    comparison."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Compare) and any(isinstance(op, KIND_COMPARISONS) for op in node.ops):
            if any(is_engine_kind(side) for side in (node.left, *node.comparators)):
                found.append(f"{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.MatchValue) and is_engine_kind(node.value):
            found.append(f"{node.lineno}: case {ast.unparse(node.value)}")
    return found


def test_no_module_outside_engine_compares_engine_kinds():
    assert found_outside(engine_kind_comparisons, ("kvbench.engine",)) == []


def test_the_engine_kind_check_sees_comparisons_not_defaults(tmp_path):
    source = tmp_path / "m.py"
    source.write_text(
        "from kvbench.engine import factory\nfrom kvbench.engine.factory import EngineKind\n"
        "def f(kind=EngineKind.COPY, other=EngineKind.PAGED.spec):\n"
        "    a = kind is EngineKind.PAGED or kind != factory.EngineKind.COPY\n"
        "    b = kind in (EngineKind.COPY, EngineKind.PAGED) or kind.spec.batching is True\n"
        "    match kind:\n"
        "        case EngineKind.COPY:\n"
        "            return a and b\n"
    )
    assert engine_kind_comparisons(source) == [
        "4: kind is EngineKind.PAGED",
        "4: kind != factory.EngineKind.COPY",
        "5: kind in (EngineKind.COPY, EngineKind.PAGED)",
        "7: case EngineKind.COPY",
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


# "issue 32.9", "(issue 26)", "issues 18 and 19", "stop 25": names of tracker items, which a reader of the
# code has never seen (STYLE.md: docstrings say what and why); say the finding itself instead. A number
# on the next line counts: docstrings wrap.
TRACKER_REFERENCE = re.compile(r"\b(?:issues?|stop)\s*#?\d", re.IGNORECASE)
TEXT_SUFFIXES = (".py", ".toml", ".cc")


def tracker_references(path: Path) -> list[str]:
    """``"line: text"`` for each place in ``path`` that cites a tracker item by number."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    found = []
    for match in TRACKER_REFERENCE.finditer(text):
        number = text.count("\n", 0, match.start()) + 1
        found.append(f"{number}: {lines[number - 1].strip()}")
    return found


def test_no_source_file_cites_the_tracker():
    problems = [
        f"{path.relative_to(REPO)}:{reference}"
        for path in sorted(PACKAGE.rglob("*"))
        if path.suffix in TEXT_SUFFIXES
        for reference in tracker_references(path)
    ]
    assert problems == []


def test_the_tracker_check_sees_issue_and_stop_numbers(tmp_path):
    source = tmp_path / "m.py"
    source.write_text(
        '"""Issue 32.9: x."""\n# (issue 26)\nx = 1  # stop 25\n# issues 18 and 19\n'
        '"""wrapped issue\n32.6"""\n# an issue with 2 items; stop the run; reissue 3\n'
    )
    assert [reference.split(":")[0] for reference in tracker_references(source)] == ["1", "2", "3", "4", "5"]


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
