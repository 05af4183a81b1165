"""Every python block of the docs and the README runs, as written, in a folder holding the
checkout's scenarios/ and samples/; a block's ``http://127.0.0.1:8000/v1`` is a real ``kvbench serve
--engine paged`` on a free port. docs/python-api.md's blocks run in tests/test_readme_api.py, which
also checks what they print against their comments; a block that cannot run here is skipped by a
``<!-- docs-test: skip (reason) -->`` comment before it."""

import contextlib
import io
import os

import pytest
from site_paths import REPO, code_blocks

DOCUMENTED_URL = "http://127.0.0.1:8000/v1"
CHECKED_ELSEWHERE = {"docs/python-api.md": "run and checked by tests/test_readme_api.py"}


def blocks() -> list:
    params = []
    for block in code_blocks("python"):
        reason = block.skip_reason or CHECKED_ELSEWHERE.get(block.page)
        marks = [pytest.mark.skip(reason=f"{block.where}: {reason}")] if reason else []
        if DOCUMENTED_URL in block.body:
            marks += [pytest.mark.server, pytest.mark.engine]
        params.append(pytest.param(block, id=block.where, marks=marks))
    return params


def test_every_python_block_is_run_here_or_elsewhere_or_skipped_with_a_reason():
    params = blocks()
    assert {p.values[0].page for p in params} >= set(CHECKED_ELSEWHERE)
    assert any(all(mark.name != "skip" for mark in p.marks) for p in params)  # at least one block runs here


@pytest.mark.parametrize("block", blocks())
def test_the_python_block_runs(block, tmp_path, monkeypatch, request):
    code = block.body
    if DOCUMENTED_URL in code:  # the paged engine: the examples send n > 1
        code = code.replace(DOCUMENTED_URL, request.getfixturevalue("paged_radix_server").url)
    for folder in ("scenarios", "samples"):
        os.symlink(REPO / folder, tmp_path / folder)
    monkeypatch.chdir(tmp_path)
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(code, block.where, "exec"), {})
