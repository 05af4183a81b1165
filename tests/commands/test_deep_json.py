"""JSON (and TOML) nested 100,000 levels deep is one line naming the file and line, exit 2, in every
reader of user files: ``trace import jsonl`` and ``sharegpt``, ``run``, ``trace stats``, ``sim``.
Before: ``error: RecursionError: maximum recursion depth exceeded``, exit 1."""

import pytest

DEPTH = 100_000
NESTED = "[" * DEPTH + "]" * DEPTH
PROMPT_LINE = '{"prompt": "hello"}'


@pytest.fixture
def deep_files(tmp_path):
    jsonl = tmp_path / "deep.jsonl"
    jsonl.write_text(f'{PROMPT_LINE}\n{{"prompt": "x", "extra": {NESTED}}}\n')
    first = tmp_path / "first.jsonl"  # the line that picks the format
    first.write_text(f"{NESTED}\n")
    sharegpt = tmp_path / "deep.json"
    sharegpt.write_text('[{"conversations": [{"from": "human", "value": "hi"}]},\n' + NESTED + "]")
    scenario = tmp_path / "deep.toml"
    scenario.write_text("[workload]\nkind = 'shared-prefix'\nnum_requests = " + NESTED + "\n")
    return {"jsonl": jsonl, "first": first, "sharegpt": sharegpt, "toml": scenario}


def one_line_error(code, err, expected):
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and expected in lines[0], err


@pytest.mark.parametrize(
    "command, name, where",
    [
        (("trace", "import", "jsonl"), "jsonl", ":2: not valid JSON (nested too deeply"),
        (("trace", "import", "jsonl"), "first", ":1: not valid JSON (nested too deeply"),
        (("trace", "import", "sharegpt"), "sharegpt", ":2: not valid JSON (nested too deeply"),
        (("trace", "stats"), "jsonl", ":2: not valid JSON (nested too deeply"),
        (("trace", "stats"), "sharegpt", ":2: not valid JSON (nested too deeply"),
        (("sim",), "first", ":1: not valid JSON (nested too deeply"),
        (("sim",), "toml", ": invalid TOML (nested too deeply)"),
        (("run",), "jsonl", ":2: not valid JSON (nested too deeply"),
    ],
)
def test_deep_nesting_is_one_line_naming_file_and_line(kvbench, tmp_path, deep_files, command, name, where):
    path = deep_files[name]
    out = ("-o", tmp_path / "out.jsonl") if command[:2] == ("trace", "import") else ()
    code, stdout, stderr = kvbench(*command, path, *out)
    one_line_error(code, stderr, f"{path}{where}")
    assert "RecursionError" not in stderr + stdout
