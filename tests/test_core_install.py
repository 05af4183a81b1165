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
from readiness import LIMIT_S

REPO = Path(__file__).resolve().parents[1]

EXTRAS_ONLY = ("torch", "transformers", "fastapi", "uvicorn", "starlette", "matplotlib", "psutil", "jinja2")
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
        return subprocess.run([sys.executable, "-m", "kvbench.cli", *map(str, args)], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=LIMIT_S)

    return run


def test_sim_and_csv_report_need_no_extra(core, tmp_path):
    out = tmp_path / "sim.parquet"
    done = core("sim", "shared_2k", "--sizes", "256,1024", "--out", out)
    assert done.returncode == 0, done.stderr
    assert "wrote 2 rows" in done.stdout and out.exists()
    words = " ".join(done.stdout.split())  # the console wraps long lines
    assert "(no PNG: needs the [plots] extra: pip install 'kvbench[plots]')" in words  # the curve's rows still written
    assert out.with_name("sim.curve.parquet").exists() and not out.with_name("sim.curve.png").exists()
    plots = core("report", out, "--out", tmp_path / "rep")  # the tables print, then plots need [plots]
    assert plots.returncode == 2 and "needs the [plots] extra: pip install 'kvbench[plots]'" in plots.stderr


def test_in_process_run_and_serve_name_their_extra(core):
    run = core("run", "shared_2k", "--requests", "1")
    assert run.returncode == 2
    assert run.stderr.strip() == ("error: needs the [engine] extra: pip install 'kvbench[engine]' "
                                  "(No module named 'torch')")
    serve = core("serve", "--port", "0")
    assert serve.returncode == 2 and "pip install 'kvbench[serve]'" in serve.stderr


def test_http_run_needs_no_extra(core, server, tmp_path):
    out, saved = tmp_path / "http.parquet", tmp_path / "http.json"
    done = core("run", "chat", "--backend", "openai", "--base-url", server.url, "--requests", "4", "--max-tokens",
                "2", "--out", out, "--save-result", saved, "--assert", "failed==0")
    assert done.returncode == 0, done.stderr
    result = json.loads(saved.read_text())
    assert result["completed"] == 4 and result["reported_hit_rate"] is not None
