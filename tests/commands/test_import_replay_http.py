"""Trace import end to end against a real ``kvbench serve``: an imported ShareGPT trace replayed at its
own times with the server's tokenizer, the detected cache settings, and a scenario's ``[load]``."""

import json
import urllib.request

import numpy as np
import pyarrow.parquet as pq
import pytest
from cli_and_rows import openai_args

from kvbench.backends.openai.tokenize import ServerTokenizer
from kvbench.errors import InputError
from kvbench.request import Message
from kvbench.results.parquet import read_metadata
from kvbench.workloads.tokenizer import TiktokenTokenizer

SHAREGPT = [
    {
        "id": "a",
        "conversations": [
            {"from": "system", "value": "You are terse. " * 12},
            {"from": "human", "value": "What does a KV cache hold?"},
            {"from": "gpt", "value": "Keys and values."},
            {"from": "human", "value": "And a prefix cache?"},
            {"from": "gpt", "value": "Those blocks, shared."},
        ],
    },
    {
        "id": "b",
        "conversations": [
            {"from": "system", "value": "You are terse. " * 12},
            {"from": "human", "value": "Hello"},
            {"from": "gpt", "value": "Hi."},
        ],
    },
]
SCENARIO = """
[workload]
kind = "one-off"
num_requests = 2
prompt_tokens = 40
max_tokens = 2

[load]
backend = "openai"
base_url = "{url}"
concurrency = 1
hygiene = "nonce"
"""


def test_the_servers_tokenizer_matches_what_it_prefills(server):
    model = json.loads(urllib.request.urlopen(server.url + "/models", timeout=10).read())["data"][0]["id"]
    local, remote = TiktokenTokenizer(), ServerTokenizer(server.url, model)  # vLLM checks the model name
    text = "Prefix caching reuses blocks.\nSecond line"
    assert remote.encode(text) == local.encode(text) and remote.decode(local.encode(text)) == text
    messages = (Message("system", "Be brief."), Message("user", "hi"))
    np.testing.assert_array_equal(remote.render_messages(messages), local.render_messages(messages))
    calls = remote.num_calls
    remote.render_messages(messages)
    assert remote.num_calls == calls  # answers are cached


def test_a_server_without_tokenize_is_one_clear_error(refused_url):
    with pytest.raises(
        InputError, match=r"--tokenizer server: POST http://127.0.0.1:\d+/tokenize: .*local tokenizer"
    ):
        ServerTokenizer(refused_url, "m")


def test_an_imported_sharegpt_trace_replays_at_its_times_with_the_servers_tokenizer(
    kvbench, server, tmp_path
):
    (tmp_path / "s.json").write_text(json.dumps(SHAREGPT))
    trace, out = tmp_path / "s.jsonl", tmp_path / "r.parquet"
    code, stdout, err = kvbench(
        "trace",
        "import",
        "sharegpt",
        tmp_path / "s.json",
        "-o",
        trace,
        "--conversation-gap-s",
        "1",
        "--think-time-s",
        "2",
    )
    assert code == 0 and "imported 3 requests (2 sessions" in stdout, err
    code, _, err = kvbench(
        *openai_args("run", trace, server.url),
        "--tokenizer",
        "server",
        "--schedule",
        "trace",
        "--time-scale",
        "20",
        "--max-tokens",
        "2",
        "--out",
        out,
    )
    assert code == 0, err
    assert (
        "preflight cache_salt: ok" in err
        and "server cache block size: 16 (detected: kvbench:cache_config_info)" in err
    )
    assert "replay lag (sent - due) over 3 requests" in err
    rows = sorted(pq.read_table(out).to_pylist(), key=lambda row: row["due_ms"])
    assert [row["due_ms"] for row in rows] == pytest.approx([0.0, 50.0, 100.0], abs=5.0)  # 0, 1 s, 2 s at 20x
    assert all(row["sent_ms"] >= row["due_ms"] and row["end_ms"] >= row["sent_ms"] for row in rows)
    assert [row["cached_prompt_tokens"] for row in rows] == [row["expected_cached_tokens"] for row in rows]
    metadata = read_metadata(out)["run"]
    assert metadata["tokenizer"].startswith("server:") and metadata["load"]["schedule"] == "trace"
    assert metadata["load"]["time_scale"] == 20.0


def test_a_scenarios_load_section_picks_the_backend_and_the_key_is_never_written(
    kvbench_rows, server, tmp_path, monkeypatch
):
    secret = "sk-never-written-4f1c2a"
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    path, out = tmp_path / "s.toml", tmp_path / "r.parquet"
    path.write_text(SCENARIO.format(url=server.url))
    rows = kvbench_rows("run", path, "--no-preflight", out=out)
    assert [row["backend"] for row in rows] == ["openai", "openai"]
    metadata = read_metadata(out)["run"]
    assert metadata["hygiene"] == "nonce" and metadata["api_key_env"] == "OPENAI_API_KEY"
    assert secret.encode() not in out.read_bytes()
