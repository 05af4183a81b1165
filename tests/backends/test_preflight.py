"""The preflight against fake servers (one that ignores cache_salt, one without cached_tokens) and
through ``kvbench run``: the fallback to nonce hygiene, a wrong model, a server that is not there."""

import asyncio
import json

import pyarrow.parquet as pq
import pytest
from cli_and_rows import openai_args

from kvbench.backends.openai.client import OpenAIConfig
from kvbench.backends.openai.preflight import PROBE_TOKENS, preflight, probe_request
from kvbench.results.parquet import read_metadata
from kvbench.workloads.tokenizer import TiktokenTokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return TiktokenTokenizer()


TRACE = [
    {"prompt": "Say hello to the cache.", "max_tokens": 2},
    {"prompt": "Say hello to the cache again.", "max_tokens": 2},
]


def checks_of(server, tokenizer, with_salts=True, model="m"):
    result = asyncio.run(
        preflight(
            OpenAIConfig(server.url if hasattr(server, "url") else server, model), tokenizer, with_salts
        )
    )
    return result, {check.name: check.ok for check in result.checks}


def test_the_probe_is_fresh_and_spans_several_blocks(tokenizer):
    first, second = probe_request(tokenizer, "aa11"), probe_request(tokenizer, "bb22")
    assert PROBE_TOKENS <= first.num_tokens <= PROBE_TOKENS + 8  # + the chat template
    assert first.messages[0].content.startswith("kvbench preflight aa11\n")
    assert list(first.token_ids[:8]) != list(second.token_ids[:8])  # the nonce is in the first block


def test_a_server_that_ignores_cache_salt_is_caught(fake_server, tokenizer):
    server = fake_server("saltless")
    result, ok = checks_of(server, tokenizer)
    assert ok == {
        "server": True,
        "model": True,
        "streaming": True,
        "cached_tokens": True,
        "cache_salt": False,
    }
    assert result.salt_ignored and result.fatal is None
    salts = [body.get("cache_salt") for body in server.bodies]
    assert len(salts) == 3 and salts[0] == salts[1] != salts[2] and None not in salts
    assert any("ignores cache_salt, so salt hygiene is OFF" in line for line in result.lines())


def test_a_server_without_cached_tokens_says_how_to_turn_it_on(fake_server, tokenizer):
    result, ok = checks_of(fake_server("no_details"), tokenizer)
    assert ok["cached_tokens"] is False and ok["cache_salt"] is None and not result.salt_ignored
    line = next(line for line in result.lines() if "cached_tokens" in line and "FAILED" in line)
    assert "--enable-prompt-tokens-details" in line and "--enable-cache-report" in line


def test_without_salt_hygiene_no_salt_is_sent(fake_server, tokenizer):
    server = fake_server("saltless")
    _, ok = checks_of(server, tokenizer, with_salts=False)
    assert "cache_salt" not in ok and all("cache_salt" not in body for body in server.bodies)


def test_a_model_the_server_does_not_list_is_fatal_and_no_server_is_not(fake_server, refused_url, tokenizer):
    result, ok = checks_of(fake_server("saltless"), tokenizer, model="llama")
    assert (
        ok == {"server": True, "model": False}
        and "'llama' is not served (the server lists m)" in result.fatal
    )
    result, ok = checks_of(refused_url, tokenizer)
    assert ok == {"server": False} and result.fatal is None


def write_trace(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in TRACE))
    return path


def test_run_falls_back_to_nonce_hygiene_when_salts_are_ignored(kvbench, fake_server, tmp_path):
    server = fake_server("saltless")
    out = tmp_path / "r.parquet"
    code, _, err = kvbench(
        "run", write_trace(tmp_path), "--backend", "openai", "--base-url", server.url, "--out", out
    )
    assert code == 0, err
    assert "preflight cache_salt: FAILED" in err and "falling back to --hygiene nonce" in err
    metadata = read_metadata(out)
    assert metadata["run"]["hygiene"] == "nonce" and metadata["preflight"]["checks"][4]["ok"] is False
    run_bodies = server.bodies[3:]
    assert len(run_bodies) == 2 and all("cache_salt" not in body for body in run_bodies)
    assert all(body["prompt"].startswith("[kvbench run ") for body in run_bodies)
    assert len(pq.read_table(out)) == 2


def test_no_preflight_sends_nothing_first_and_a_wrong_model_stops_the_run(kvbench, fake_server, tmp_path):
    server = fake_server("saltless")
    trace = write_trace(tmp_path)
    code, _, err = kvbench(
        *openai_args("run", trace, server.url),
        "--no-preflight",
        "--out",
        tmp_path / "a.parquet",
    )
    assert code == 0, err
    assert len(server.bodies) == 2 and all("cache_salt" in body for body in server.bodies)
    code, _, err = kvbench(
        *openai_args("run", trace, server.url),
        "--model",
        "llama",
        "--out",
        tmp_path / "b.parquet",
    )
    assert code == 2 and "preflight: model: 'llama' is not served" in err and "Traceback" not in err
