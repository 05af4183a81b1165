"""The docs' Python API page (docs/python-api.md, once the README's "Python API" section), run as
written (a real ``kvbench serve`` stands in for the
server on port 8000), so the documented API cannot drift from the code."""

import contextlib
import io
import os
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCUMENTED_URL = "http://127.0.0.1:8000/v1"


def api_examples() -> list[str]:
    page = (REPO / "docs" / "python-api.md").read_text(encoding="utf-8")
    return re.findall(r"```python\n(.*?)```", page, flags=re.S)


def run_example(code: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "docs/python-api.md", "exec"), {})
    return out.getvalue()


def test_the_readme_has_three_examples():
    assert len(api_examples()) == 3


def test_the_cache_and_replay_examples_print_what_their_comments_say(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    cache_example, replay_example, _ = api_examples()
    assert run_example(cache_example).split() == ["6"]
    assert run_example(replay_example).splitlines() == ["token hit rate 0.9646", "[0, 2000, 2000]"]


def test_the_run_example_runs_in_process_and_against_a_server(server, tmp_path, monkeypatch):
    *_, run_example_code = api_examples()
    assert DOCUMENTED_URL in run_example_code
    os.symlink(REPO / "scenarios", tmp_path / "scenarios")
    monkeypatch.chdir(tmp_path)
    printed = run_example(run_example_code.replace(DOCUMENTED_URL, server.url)).splitlines()
    inprocess_rate, path = printed[0].split()
    assert float(inprocess_rate) == 2 * 2000 / (3 * 2063) and Path(path) == Path(
        "results/api-inprocess.parquet"
    )
    reported, expected = (float(value) for value in printed[1].split())
    assert reported == expected > 0
    assert [line.split()[-1] for line in printed[2:]] == ["3", "4"]  # rows read back from both files
