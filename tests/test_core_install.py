"""The core install (no extras): torch, transformers, fastapi, uvicorn and matplotlib unimportable in
a subprocess; ``kvbench sim``, ``report --format csv`` and ``run --backend openai`` (against a real
``kvbench serve``) still work, and an in-process run names the extra it needs in one line.

(The same with a real fresh venv is in .ci/run: ``pip install -c constraints-cpu.txt .`` only.)
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_and_rows import small_chat
from readiness import LIMIT_S

REPO = Path(__file__).resolve().parents[1]
CPU_PIP = "pip install -c constraints-cpu.txt -e"  # the install hint keeps constraints-cpu.txt's CPU torch

EXTRAS_ONLY = (
    "torch",
    "transformers",
    "fastapi",
    "uvicorn",
    "starlette",
    "matplotlib",
    "psutil",
    "jinja2",
    "textual",
)
BLOCKER = f"""
import importlib.abc, sys
class _ExtrasMissing(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {EXTRAS_ONLY!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, _ExtrasMissing())
"""


@pytest.fixture(scope="module")
def core(tmp_path_factory):
    """core(*args) -> CompletedProcess of ``python -m kvbench.cli ARGS`` with only the core importable."""
    site = tmp_path_factory.mktemp("core-site")
    (site / "sitecustomize.py").write_text(BLOCKER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)])}

    def run(*args):
        return subprocess.run(
            [sys.executable, "-m", "kvbench.cli", *map(str, args)],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=LIMIT_S,
        )

    return run


def test_sim_and_csv_report_need_no_extra(core, tmp_path):
    out = tmp_path / "sim.parquet"
    done = core("sim", "shared_2k", "--sizes", "256,1024", "--out", out)
    assert done.returncode == 0, done.stderr
    assert "wrote 2 rows" in done.stdout and out.exists()
    words = " ".join(done.stdout.split())  # the console wraps long lines
    # rows still written
    assert f"(no PNG: needs the [plots] extra; from a checkout: {CPU_PIP} '.[plots]')" in words
    assert out.with_name("sim.curve.parquet").exists() and not out.with_name("sim.curve.png").exists()
    plots = core("report", out, "--out", tmp_path / "rep")  # the tables print, a note, exit 0
    assert plots.returncode == 0, plots.stderr
    assert "Sim: shared_2k" in plots.stdout and "token hit 0.9690" in plots.stdout  # the summary table
    assert (
        plots.stderr.strip()
        == f"note: no PNG plots or report.html: needs the [plots] extra; from a checkout: {CPU_PIP} "
        "'.[plots]'"
    )
    assert not (tmp_path / "rep").exists()  # no empty folder left behind


def test_in_process_run_and_serve_name_their_extra(core):
    run = core("run", "shared_2k", "--requests", "1")
    assert run.returncode == 2
    assert run.stderr.strip() == (
        f"error: needs the [engine] extra; from a checkout: {CPU_PIP} '.[engine]' (No module named 'torch')"
    )
    serve = core("serve", "--port", "0")
    assert serve.returncode == 2 and f"{CPU_PIP} '.[serve]'" in serve.stderr
    play = core("play")
    assert (
        play.returncode == 2
        and f"kvbench play needs the [play] extra; from a checkout: {CPU_PIP} '.[play]'" in play.stderr
    )


def test_http_run_needs_no_extra(core, server, tmp_path):
    out, saved = tmp_path / "http.parquet", tmp_path / "http.json"
    done = core(*small_chat("run", server.url), "--out", out, "--save-result", saved, "--assert", "failed==0")
    assert done.returncode == 0, done.stderr
    result = json.loads(saved.read_text())
    assert result["completed"] == 4 and result["reported_hit_rate"] is not None
