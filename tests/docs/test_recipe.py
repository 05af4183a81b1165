"""The recipe of docs/recipe.md ("my server, my agent") runs as written: its bash block, line by line
in a fresh folder, with ``SERVER_ON`` and ``SERVER_OFF`` set to two real ``kvbench serve`` on free
loopback ports (the second with ``--cache off``), then its outputs are read back."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from serve_process import ServeProcess
from site_paths import REPO, code_blocks, commands

pytestmark = [pytest.mark.slow, pytest.mark.server, pytest.mark.engine]


def recipe_lines() -> list[str]:
    (block,) = [b for b in code_blocks("bash") if b.where.startswith("docs/recipe.md")]
    return commands(block)


@pytest.fixture(scope="module")
def servers():
    on, off = ServeProcess(), ServeProcess("--cache", "off")
    try:
        yield on.url, off.url
    finally:
        on.stop()
        off.stop()


def test_the_recipe_runs_against_a_server_with_the_cache_on_and_off(servers, tmp_path):
    lines = recipe_lines()
    assert [line.split()[1] for line in lines] == ["trace", "run", "run", "compare", "explain", "report"]
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "SERVER_ON": servers[0],
        "SERVER_OFF": servers[1],
    }
    printed = {}
    for line in lines:
        done = subprocess.run(["bash", "-c", line], cwd=tmp_path, env=env, capture_output=True, text=True)
        assert done.returncode == 0, f"{line}\nexit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr}"
        printed[line.split()[1]] = done.stdout
    on = pq.read_table(tmp_path / "results/agent-on.parquet").to_pylist()
    off = pq.read_table(tmp_path / "results/agent-off.parquet").to_pylist()
    assert len(on) == len(off) == 9 and all(row["status"] == "ok" for row in on + off)
    assert sum(row["cached_prompt_tokens"] for row in off) == 0
    hit = sum(row["cached_prompt_tokens"] for row in on) / sum(row["prompt_tokens"] for row in on)
    assert hit > 0.5  # each agent step resends the system prompt, task and earlier observations
    assert "token hit rate" in printed["compare"]
    assert (tmp_path / "results/agent-report/report.html").is_file()


def test_the_recipe_is_skipped_by_the_docs_walk_with_a_pointer_here():
    (block,) = [b for b in code_blocks("bash") if b.where.startswith("docs/recipe.md")]
    assert "tests/docs/test_recipe.py" in block.skip_reason
    assert json.dumps(recipe_lines()).count("$SERVER_ON") == 1
    assert REPO.joinpath("docs/recipe.md").read_text().count("kvbench ") >= 6
