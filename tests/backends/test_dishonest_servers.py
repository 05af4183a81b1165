"""Servers whose numbers are missing, impossible or in other units, and
replies that are not streams. A run against each must say what happened, never headline a false figure."""

import asyncio

import pyarrow.parquet as pq
import pytest
from cli_and_rows import openai_args
from fake_servers import chunk
from tiny_workloads import tiny_shared_prefix

from kvbench.backends.openai.client import OpenAIBackend, OpenAIConfig
from kvbench.cli import main
from kvbench.request import Message, Request
from kvbench.results.rows import rows_from_dicts
from kvbench.results.summary import summarize
from kvbench.workloads.tokenizer import load_tokenizer

SCENARIO = tiny_shared_prefix(4)


def run_against(server, tmp_path, capsys, *flags):
    scenario = tmp_path / "tiny.toml"
    scenario.write_text(SCENARIO)
    out = tmp_path / "run.parquet"
    try:
        main(
            [
                *openai_args("run", str(scenario), server.url),
                "--timeout",
                "5",
                "--out",
                str(out),
                *flags,
            ]
        )
        code = 0
    except SystemExit as exit_:
        code = exit_.code
    captured = capsys.readouterr()
    return code, captured.out + captured.err, pq.read_table(out).to_pylist()


def usage(prompt, completion, cached=None):
    body = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    if cached is not None:
        body["prompt_tokens_details"] = {"cached_tokens": cached}
    return body


def script(usage_body):
    return [chunk("a"), chunk("b"), chunk("c"), chunk(finish_reason="length"), chunk(usage=usage_body)]


def test_missing_cached_tokens_is_missing_not_zero(fake_server, tmp_path, capsys):
    """Was: a server that omits cached_tokens (vLLM's default) got a headline hit rate of 0.0000."""
    code, output, rows = run_against(fake_server("script", script(usage(90, 3))), tmp_path, capsys)
    assert code == 0 and all(r["cached_prompt_tokens"] is None for r in rows)
    summary = summarize(rows_from_dicts(rows))
    assert summary.token_hit_rate is None and summary.num_cached_unreported == 4
    assert "0.0000 (" not in output and "- (" in output
    assert "without cached_tokens" in output and "--enable-prompt-tokens-details" in output


def test_impossible_cached_tokens_are_flagged_and_kept_out_of_the_rates(fake_server, tmp_path, capsys):
    """Was: cached_tokens 1.24x the prompt gave a hit rate of 1.24, exit 0, nothing said."""
    code, output, rows = run_against(
        fake_server("script", script(usage(90, 3, cached=112))), tmp_path, capsys
    )
    assert {r["cached_prompt_tokens"] for r in rows} == {112}  # the row keeps what the server said
    summary = summarize(rows_from_dicts(rows))
    assert summary.token_hit_rate is None and summary.num_cached_impossible == 4
    assert "impossible cached_tokens" in output and "1.24" not in output
    negative = summarize(
        rows_from_dicts([{**rows[0], "cached_prompt_tokens": -3}, {**rows[1], "cached_prompt_tokens": 45}])
    )
    assert negative.num_cached_impossible == 1 and negative.token_hit_rate == 0.5


def test_prompt_count_mismatch_checked_on_every_request_and_expected_rate_in_local_units(
    fake_server, tmp_path, capsys
):
    """Was: the mismatch check looked only at requests with cached_tokens (0 shown while all differed),
    and the expected rate divided local expected hits by the server's prompt count."""
    code, output, rows = run_against(fake_server("script", script(usage(500, 3))), tmp_path, capsys)
    local = [r["local_prompt_tokens"] for r in rows]
    assert all(r["prompt_tokens"] == 500 for r in rows) and all(n < 500 for n in local)
    assert "server prompt tokens != local count" in output
    assert [line for line in output.splitlines() if "server prompt tokens != local count" in line][0].split()[
        -2
    ] == "4"
    expected = sum(r["expected_cached_tokens"] for r in rows) / sum(local)
    assert summarize(rows_from_dicts(rows)).expected_hit_rate == pytest.approx(expected) and expected > 0.3


def test_short_outputs_under_ignore_eos_are_flagged(fake_server, tmp_path, capsys):
    """Was: 8 of 16 tokens with finish_reason "stop" under ignore_eos passed silently."""
    server = fake_server(
        "script", [chunk("a"), chunk(finish_reason="stop"), chunk(usage=usage(90, 1, cached=0))]
    )
    code, output, rows = run_against(server, tmp_path, capsys)
    assert all(r["output_tokens"] == 1 and r["max_tokens"] == 3 for r in rows)
    line = [line for line in output.splitlines() if "shorter than max_tokens under ignore_eos" in line][0]
    assert line.split()[-2] == "4"


def serve_one(url):
    tokenizer = load_tokenizer()
    messages = (Message("user", "hi"),)
    request = Request(0, "r0", "s0", 0, tokenizer.render_messages(messages), max_tokens=3, messages=messages)

    async def go():
        async with OpenAIBackend(OpenAIConfig(url, "m", timeout_s=5.0), tokenizer) as backend:
            return await backend.serve(request)

    return asyncio.run(go())


def test_a_plain_json_reply_to_a_stream_request_says_so(fake_server):
    """Was: "the stream ended before its final chunk"."""
    served = serve_one(fake_server("json_reply").url)
    assert (
        served.status == "error" and "one JSON body" in served.error and "not an SSE stream" in served.error
    )


def test_a_connection_reset_names_what_happened(fake_server):
    """Was: an error row reading just "connection error: "."""
    served = serve_one(fake_server("reset").url)
    assert served.status == "error" and served.error.startswith("connection error: ")
    assert len(served.error) > len("connection error: ") + 3, served.error
