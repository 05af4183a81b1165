import socket
from pathlib import Path

import pytest
from cli_and_rows import parquet_rows
from kinds import mark_by_kind
from serve_process import ServeProcess
from tiny_workloads import TINY_LLAMA

from kvbench.cli import main

REPO = Path(__file__).resolve().parents[1]


@pytest.hookimpl(tryfirst=True)  # before pytest's own hook deselects by -m
def pytest_collection_modifyitems(items):
    """Mark every test ``engine`` / ``server`` / ``slow`` by its fixtures and module (tests/kinds.py)."""
    mark_by_kind(items)


@pytest.fixture(scope="session")
def shared_data():
    """The shared data folder beside the repository (../shared/data); skipped where absent."""
    path = REPO.parent / "shared" / "data"
    if not path.is_dir():
        pytest.skip("../shared/data is not beside this checkout")
    return path


@pytest.fixture(scope="session")
def tiny_loaded():
    """A random Llama with cl100k's vocabulary (the tokenizer's ids must be valid), everything else
    tiny (2 layers, hidden 64): one per session for the server, peer and run-check tests."""
    from kvbench.engine.model import default_llama_config, random_model

    return random_model(default_llama_config(**TINY_LLAMA))


@pytest.fixture(scope="session")
def default_model_once():
    """``load_model`` that builds the default random model (no ``--model``) once per session and hands
    the same one to every in-process run: its weights depend only on its config (seed, device, dtype;
    the key here) and no engine changes them (kvbench/engine/model.py). A checkpoint loads each time."""
    from kvbench.engine import model

    load, built = model.load_model, {}

    def load_model(config: model.ModelConfig = model.ModelConfig()) -> model.LoadedModel:
        if config.path is not None:
            return load(config)
        if config not in built:
            built[config] = load(config)
        return built[config]

    return load_model


@pytest.fixture
def kvbench(capsys, monkeypatch, default_model_once):
    """kvbench(*args) -> (exit_code, stdout, stderr), run in-process through the real entry point (the
    default model built once per session: ``default_model_once``)."""
    monkeypatch.setattr("kvbench.engine.model.load_model", default_model_once)

    def run(*args):
        try:
            main([str(a) for a in args])
            code = 0
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else 1
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


@pytest.fixture
def refused_url():
    """``http://127.0.0.1:PORT/v1`` where nothing listens: a free loopback port, bound and released."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}/v1"


@pytest.fixture
def kvbench_rows(kvbench):
    """kvbench_rows(*args, out=PATH) -> the Parquet rows ``kvbench *args --out PATH`` wrote, after
    asserting that it exited 0 (its stderr as the message)."""

    def run(*args, out):
        code, _, stderr = kvbench(*args, "--out", out)
        assert code == 0, stderr
        return parquet_rows(out)

    return run


@pytest.fixture(scope="session")
def serve_session():
    """One real ``kvbench serve`` (default model, hash cache) on a free loopback port for the session
    (for each xdist worker); tests take it through ``server``."""
    process = ServeProcess()
    yield process
    process.stop()


@pytest.fixture(scope="module")
def server(serve_session):
    """The session's ``kvbench serve`` with its prefix cache emptied (``/reset_prefix_cache``) for each
    test module that asks: the cache state a server of the module's own had. Its /metrics counters go
    on from earlier modules, so tests read deltas."""
    serve_session.reset_prefix_cache()
    return serve_session


@pytest.fixture(scope="module")
def paged_radix_server():
    """A real ``kvbench serve --engine paged --cache-kind radix`` (the radix tree over the KV pool)."""
    process = ServeProcess("--engine", "paged", "--cache-kind", "radix")
    yield process
    process.stop()


@pytest.fixture(scope="module")
def prompt_only_server():
    """A real ``kvbench serve --prompt-only`` (prompt blocks cached, generated ones not)."""
    process = ServeProcess("--prompt-only")
    yield process
    process.stop()
