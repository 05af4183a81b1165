"""Every ``kvbench ...`` command of the docs' and the README's bash blocks runs, in order, in a fresh
clone of HEAD with the test environment's ``kvbench`` (every documented command works in a
fresh clone). A block that cannot run here (a GPU, a vLLM install, a server on a fixed port, a
remote endpoint) is skipped only by a ``<!-- docs-test: skip (reason) -->`` comment before it: each
shows as a skip with its page, line and reason (``pytest -rs``). An identical command is run once."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from site_paths import REPO, code_blocks, commands

pytestmark = [pytest.mark.slow, pytest.mark.engine]  # several engine runs: minutes on a loaded 2-core machine
COMMAND_TIMEOUT_S = 900  # one command, generous: a loaded machine is slow


def walk() -> list:
    params, seen = [], set()
    for block in code_blocks("bash"):
        for number, line in enumerate(commands(block)):
            if block.skip_reason is not None:
                params.append(
                    pytest.param(
                        line,
                        id=f"{block.where}#{number}",
                        marks=pytest.mark.skip(reason=f"{block.where}: {block.skip_reason}"),
                    )
                )
            elif line not in seen:
                seen.add(line)
                params.append(pytest.param(line, id=f"{block.where}#{number}"))
    return params


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    """A fresh clone of this checkout's HEAD (committed files only), as a newcomer gets it."""
    path = tmp_path_factory.mktemp("docs-walk") / "kvbench"
    subprocess.run(
        ["git", "clone", "--quiet", "--no-hardlinks", str(REPO), str(path)], check=True, timeout=300
    )
    return path


def test_the_walk_has_commands_and_every_skip_gives_a_reason():
    params = walk()
    ran = [p for p in params if not p.marks]
    assert len(ran) >= 20 and all(mark.kwargs["reason"].split(": ", 1)[1] for p in params for mark in p.marks)


@pytest.mark.parametrize("line", walk())
def test_the_documented_command_runs_in_a_fresh_clone(clone, line):
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("PYTHONPATH", None)
    done = subprocess.run(
        ["bash", "-c", line], cwd=clone, env=env, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S
    )
    assert done.returncode == 0, (
        f"{line}\nexit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    )
