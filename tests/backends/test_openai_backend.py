"""The HTTP backend against scripted and misbehaving servers: parsing, failures, the key kept secret."""

import time

import pytest
from cli_and_rows import openai_args, parquet_rows
from fake_servers import SECRET_KEY, USAGE, chunk, with_ids
from openai_calls import TOKENIZER, chat_request, ids_request, serve, text_request

from kvbench.backends.openai.client import OpenAIConfig, redact
from kvbench.request import Status


def test_a_stream_is_timed_per_content_chunk_and_counted_from_usage(fake_server):
    server = fake_server(
        "script",
        [chunk("Hel"), chunk("lo there"), chunk("!"), chunk(finish_reason="length"), chunk(usage=USAGE)],
    )
    [served] = serve(server.url, [chat_request(salt="tenant")], run_salt="run")
    assert served.status is Status.OK and served.http_status == 200 and served.error is None
    assert (served.prompt_tokens, served.cached_prompt_tokens, served.output_tokens) == (999, 16, 3)
    assert served.output_tokens_source == "usage"
    assert len(served.itl_ms) == 2 and 0 < served.ttft_ms <= served.e2e_ms
    body = server.bodies[0]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["cache_salt"] == "run-tenant" and body["ignore_eos"] is True and body["max_tokens"] == 4
    assert body["messages"] == [{"role": "user", "content": "hello there"}] and body["model"] == "m"


def test_several_tokens_in_one_chunk_and_no_usage(fake_server):
    server = fake_server("script", [chunk("one two three"), chunk(finish_reason="stop")])
    [served] = serve(server.url, [chat_request()], ignore_eos=False)
    assert served.status is Status.OK and served.output_tokens_source == "tokenizer"
    assert served.output_tokens == len(TOKENIZER.encode("one two three")) == 3
    assert served.itl_ms == () and served.cached_prompt_tokens is None
    assert served.prompt_tokens == chat_request().prompt_tokens  # the local count when usage is missing
    assert "cache_salt" not in server.bodies[0] and "ignore_eos" not in server.bodies[0]


def test_plain_prompts_and_token_ids_go_to_completions(fake_server):
    server = fake_server("script", [chunk("x", chat=False), chunk(finish_reason="length", chat=False)])
    served = serve(server.url, [text_request(0, max_tokens=2), ids_request(1, (11, 22, 33), max_tokens=2)])
    assert [s.status for s in served] == [Status.OK, Status.OK]
    assert server.bodies[0]["prompt"] == "Once upon a time" and server.bodies[1]["prompt"] == [11, 22, 33]


def test_return_token_ids_are_sent_and_recorded(fake_server):
    server = fake_server(
        "script",
        [
            with_ids(chunk("Hel"), [7, 8], prompt_ids=[1, 2, 3]),
            with_ids(chunk(), [9]),
            with_ids(chunk(finish_reason="length"), []),
            chunk(usage=USAGE),
        ],
    )
    [served] = serve(server.url, [chat_request()], extra_body={"return_token_ids": True})
    assert served.status is Status.OK and server.bodies[0]["return_token_ids"] is True
    assert served.prompt_token_ids == (1, 2, 3) and served.output_token_ids == (7, 8, 9)
    assert len(served.itl_ms) == 1  # the text-less chunk with an id is output too


def test_completions_carry_prompt_ids_on_the_choice_and_plain_servers_send_none(fake_server):
    server = fake_server(
        "script",
        [
            with_ids(chunk("a", chat=False), [5], prompt_ids=[4, 4], on_choice=True),
            chunk(finish_reason="length", chat=False),
        ],
    )
    [served] = serve(server.url, [text_request(0, "hi", max_tokens=2)])
    assert served.prompt_token_ids == (4, 4) and served.output_token_ids == (5,)
    plain = fake_server("script", [chunk("x"), chunk(finish_reason="stop")])
    [served] = serve(plain.url, [chat_request()])
    assert served.prompt_token_ids is None and served.output_token_ids is None


@pytest.mark.parametrize(
    "behaviour,status,needle",
    [
        ("fail", 500, "Error code: 500"),
        ("cut", 200, "connection error"),
        ("eof", 200, "ended before its final chunk"),
        ("hang", None, "timeout"),
    ],
)
def test_misbehaving_servers_give_error_rows_quickly(fake_server, behaviour, status, needle):
    server = fake_server(behaviour)
    start = time.perf_counter()
    served = serve(server.url, [chat_request(0), chat_request(1)], timeout_s=1.0)
    assert time.perf_counter() - start < 8
    assert [s.status for s in served] == ["error", "error"]  # the second request was still sent
    assert all(s.http_status == status and needle in s.error and SECRET_KEY not in s.error for s in served)


def test_refused_connection_is_an_error_row(refused_url):
    [served] = serve(refused_url, [chat_request()])
    assert served.status == "error" and served.http_status is None and "connection error" in served.error


def test_the_key_is_never_shown():
    config = OpenAIConfig("http://127.0.0.1:1/v1", "m", api_key=SECRET_KEY)
    assert SECRET_KEY not in repr(config)
    assert redact(f"Bearer {SECRET_KEY}!", SECRET_KEY) == "Bearer ***!"


@pytest.mark.parametrize("behaviour", ["fail", "hang"])
def test_a_run_against_a_bad_server_finishes_records_errors_and_exits_1(
    kvbench, fake_server, tiny_scenario, tmp_path, monkeypatch, behaviour
):
    server = fake_server(behaviour)
    out = tmp_path / "bad.parquet"
    monkeypatch.setenv("KVBENCH_TEST_KEY", SECRET_KEY)
    code, stdout, stderr = kvbench(
        *openai_args("run", tiny_scenario, server.url),
        "--api-key-env",
        "KVBENCH_TEST_KEY",
        "--timeout",
        "1",
        "--concurrency",
        "2",
        "--no-preflight",  # a failing probe stops the run before any request (the test below)
        "--out",
        out,
    )
    assert code == 1 and "3 request(s) failed" in stderr
    rows = parquet_rows(out)
    assert len(rows) == 3 and all(r["status"] == "error" and r["error"] for r in rows)
    assert "failed requests" in stdout and " x3" in stdout
    assert server.bodies[0]["model"] == "m"  # from GET /v1/models
    assert SECRET_KEY not in stdout + stderr and SECRET_KEY.encode() not in out.read_bytes()
    if behaviour == "fail":
        assert {r["http_status"] for r in rows} == {500} and "HTTP 500 x3" in stdout


@pytest.mark.parametrize("behaviour", ["fail", "hang"])
def test_a_failed_streaming_probe_stops_the_run_before_any_request(
    kvbench, fake_server, tiny_scenario, tmp_path, behaviour
):
    # behind a router every such request would fail too, and its circuit breaker would open on them
    server = fake_server(behaviour)
    out = tmp_path / "never.parquet"
    code, _, stderr = kvbench(*openai_args("run", tiny_scenario, server.url), "--timeout", "1", "--out", out)
    assert code == 2 and not out.exists()
    line = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(line) == 1 and "preflight: streaming: a streamed 2-token request failed" in line[0], stderr
    assert "so none is sent" in stderr and len(server.bodies) == 1  # the one probe, no request of the run
