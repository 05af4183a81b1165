"""A prompt whose body is over the server's limit is refused before the run with the
server's own 413 message (a real ``kvbench serve --max-body-size``), not "Connection reset by peer"."""

import json

import pytest
from cli_and_rows import openai_args
from serve_process import ServeProcess

from kvbench.backends.openai.body_limit import PROBE_ABOVE_BYTES

pytestmark = [pytest.mark.server, pytest.mark.slow]


@pytest.fixture(scope="module")
def small_limit_server():
    process = ServeProcess("--max-body-size", "128KiB")
    yield process
    process.stop()


def prompts_trace(tmp_path, sizes_chars):
    path = tmp_path / "prompts.jsonl"
    words = "lorem ipsum dolor sit amet "
    path.write_text(
        "".join(json.dumps({"prompt": (words * (n // len(words) + 1))[:n]}) + "\n" for n in sizes_chars)
    )
    return path


def test_an_over_long_prompt_is_refused_with_the_servers_413(kvbench, small_limit_server, tmp_path):
    trace = prompts_trace(tmp_path, [200, 300_000])
    out = tmp_path / "r.parquet"
    code, _, err = kvbench(
        *openai_args("run", trace, small_limit_server.url),
        "--no-preflight",
        "--max-tokens",
        "1",
        "--out",
        out,
    )
    assert code == 2 and not out.exists()
    line = " ".join(err[err.index("error: ") :].split())  # after the status lines (preflight, server cache)
    assert (
        line.startswith("error: request ")
        and "bytes and the server refuses that size before the run: HTTP 413:" in line
    )
    assert "larger than this server's limit of 131,072 bytes" in line and "reset" not in line


def test_a_body_under_the_limit_is_not_probed_and_runs(kvbench, small_limit_server, tmp_path):
    trace = prompts_trace(tmp_path, [200, PROBE_ABOVE_BYTES // 8])
    code, _, err = kvbench(
        *openai_args("run", trace, small_limit_server.url),
        "--no-preflight",
        "--max-tokens",
        "1",
        "--out",
        tmp_path / "r.parquet",
    )
    assert code == 0, err
