"""``kvbench serve`` (a real subprocess on a free loopback port) and ``kvbench run --backend openai``
against it: the same cached tokens as the in-process engine, salts, hygiene, reconciliation."""

import openai
import pyarrow.parquet as pq
import pytest
from cli_and_rows import file_fixture, openai_args
from tiny_scenarios import PROMPT_TOKENS, SHARED_BLOCK_TOKENS
from tiny_scenarios import SHARED_PREFIX as SCENARIO

from kvbench.results.parquet import read_metadata

# the same 93-token prompt again: 5 blocks, the last token recomputed
WHOLE_PROMPT_HIT = (PROMPT_TOKENS - 1) // 16 * 16


scenario = file_fixture(SCENARIO, "tiny.toml")


def rows_of(path):
    return pq.read_table(path).to_pylist()


def test_http_run_reports_what_the_in_process_engine_reports(kvbench, server, scenario, tmp_path):
    code, _, stderr = kvbench("run", scenario, "--out", tmp_path / "here.parquet")
    assert code == 0, stderr
    here = rows_of(tmp_path / "here.parquet")
    code, stdout, stderr = kvbench(
        "run", scenario, "--backend", "openai", "--base-url", server.url, "--out", tmp_path / "http.parquet"
    )
    assert code == 0, stderr
    there = rows_of(tmp_path / "http.parquet")
    assert [r["cached_prompt_tokens"] for r in there] == [r["cached_prompt_tokens"] for r in here]
    # 0 present, not null
    assert [r["cached_prompt_tokens"] for r in there] == [0] + [SHARED_BLOCK_TOKENS] * 3
    assert [r["expected_cached_tokens"] for r in there] == [r["expected_cached_tokens"] for r in here]
    assert [r["prompt_tokens"] for r in there] == [r["prompt_tokens"] for r in here]
    assert all(
        r["backend"] == "openai"
        and r["http_status"] == 200
        and r["output_tokens"] == 3
        and r["output_tokens_source"] == "usage"
        and len(r["itl_ms"]) == 2
        for r in there
    )
    reconciliation = read_metadata(tmp_path / "http.parquet")["reconciliation"]
    assert (
        reconciliation["reported_hit_rate"] == reconciliation["expected_hit_rate"] == pytest.approx(192 / 372)
    )
    assert reconciliation["metrics_hit_rate"] == pytest.approx(192 / 372)
    assert reconciliation["over_possible"] == [] and reconciliation["below_expected"] == []
    assert "hit rate from /metrics delta" in stdout


def test_the_unmodified_openai_client_and_cache_salt(server):
    client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=60)
    model = client.models.list().data[0].id
    messages = [{"role": "system", "content": "word " * 40}, {"role": "user", "content": "hi"}]

    def cached(salt):
        response = client.chat.completions.create(
            model=model, messages=messages, max_tokens=2, extra_body={"cache_salt": salt}
        )
        return response.usage.prompt_tokens, response.usage.prompt_tokens_details.cached_tokens

    prompt_tokens, first = cached("salt-one")
    assert first == 0
    assert cached("salt-two") == (prompt_tokens, 0)
    assert cached("salt-one") == (prompt_tokens, (prompt_tokens - 1) // 16 * 16)
    stream = client.completions.create(
        model=model, prompt="word " * 40, max_tokens=2, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert (
        chunks[-1].usage.prompt_tokens_details.cached_tokens == 0 and chunks[-1].usage.completion_tokens == 2
    )
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt="hi", max_tokens=1)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=model, prompt="hi", max_tokens=0)
    assert client.completions.create(model=model, prompt="hi", max_tokens=1).usage.completion_tokens == 1


def test_hygiene_keeps_runs_apart_unless_off(kvbench, server, scenario, tmp_path):
    def first_cached(*flags):
        out = tmp_path / f"run{len(list(tmp_path.glob('*.parquet')))}.parquet"
        code, _, stderr = kvbench(
            *openai_args("run", scenario, server.url),
            "--requests",
            "1",
            "--out",
            out,
            *flags,
        )
        assert code == 0, stderr
        return rows_of(out)[0]

    first_cached("--hygiene", "off")
    assert first_cached("--hygiene", "off")["cached_prompt_tokens"] == WHOLE_PROMPT_HIT  # leaked in
    assert first_cached("--hygiene", "off", "--reset-cache")["cached_prompt_tokens"] == 0
    assert first_cached()["cached_prompt_tokens"] == 0  # a per-run cache_salt
    nonce = first_cached("--hygiene", "nonce")
    assert (
        nonce["cached_prompt_tokens"] == nonce["expected_cached_tokens"] == 0 and nonce["prompt_tokens"] > 93
    )


def test_a_server_that_is_not_there_fails_every_request_and_exits_1(kvbench, scenario, tmp_path, refused_url):
    out = tmp_path / "refused.parquet"
    code, stdout, stderr = kvbench(
        "run", scenario, "--backend", "openai", "--base-url", refused_url, "--model", "m", "--out", out
    )
    assert code == 1 and "4 request(s) failed" in stderr and "connection error x4" in stdout
    assert all(r["status"] == "error" and r["http_status"] is None for r in rows_of(out))


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--backend", "openai", "--cache-kind", "radix"], "--cache-kind does not apply to --backend openai"),
        (["--request-rate", "5"], "--request-rate does not apply to --backend inprocess"),
        (["--backend", "openai", "--timeout", "0"], "--timeout: 0"),
    ],
)
def test_options_of_the_other_backend_are_refused(kvbench, scenario, args, needle):
    code, _, stderr = kvbench("run", scenario, *args)
    assert code == 2 and needle in stderr


def test_serve_refuses_a_bad_or_busy_port_before_loading_the_model(kvbench):
    import socket

    code, _, stderr = kvbench("serve", "--port", "70000")
    assert code == 2 and "--port 70000" in stderr
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        code, _, stderr = kvbench("serve", "--port", busy.getsockname()[1])
    assert code == 2 and "cannot listen" in stderr
