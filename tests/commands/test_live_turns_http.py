"""``kvbench run --turns live`` end to end: an imported ShareGPT file against a real ``kvbench serve``
(the openai client, vLLM's ``return_token_ids``), one with ``--prompt-only``, and the in-process engine."""

import json

import numpy as np
import pyarrow.parquet as pq

from kvbench.results.parquet import read_metadata
from kvbench.run.api import run
from kvbench.run.config import BackendKind, RunConfig, RunFlags, ServerFlags, TurnMode
from kvbench.workloads.tokenizer import TiktokenTokenizer

CHATS = [
    {
        "id": "a",
        "conversations": [
            {
                "from": "system",
                "value": "You are a terse assistant for engineers who run inference servers. "
                "Answer in one or two lines and keep units in every number you give.",
            },
            {"from": "human", "value": "What does a KV cache hold?"},
            {"from": "gpt", "value": "Keys and values of every past token, per layer."},
            {"from": "human", "value": "And a prefix cache?"},
            {"from": "gpt", "value": "Those blocks, shared between requests with the same prefix."},
            {"from": "human", "value": "Why blocks?"},
        ],
    },
    {
        "id": "b",
        "conversations": [
            {"from": "human", "value": "Explain TTFT in one line."},
            {"from": "gpt", "value": "Time from sending a request to its first output token."},
            {"from": "human", "value": "And TPOT?"},
        ],
    },
]
MAX_TOKENS = 20  # > one 16-token block: every reply fills a block the next turn can hit


def live_run(tmp_path, url):
    path = tmp_path / "chats.json"
    path.write_text(json.dumps(CHATS))
    config = RunConfig(
        path,
        BackendKind.OPENAI,
        run=RunFlags(max_tokens=MAX_TOKENS),
        server=ServerFlags(base_url=url, turns=TurnMode.LIVE, preflight=False),
        out=tmp_path / "live.parquet",
    )
    return run(config)


def test_the_next_turn_is_the_previous_prompt_plus_the_real_reply_and_its_blocks_hit(server, tmp_path):
    outcome = live_run(tmp_path, server.url)
    tokenizer = TiktokenTokenizer()
    by_turn = {(request.session_id, request.turn): (request, record) for request, record in outcome.records}
    assert len(by_turn) == 5 and all(record.ok for _, record in by_turn.values())
    for (session, turn), (request, _) in by_turn.items():
        if turn == 0:
            continue
        previous, reply = by_turn[session, turn - 1]
        assert len(reply.output_token_ids) == MAX_TOKENS  # vLLM's return_token_ids, from kvbench serve
        assert request.messages[-2].content == reply.output_text  # the real reply, not the trace's
        retokenized = np.concatenate([previous.token_ids, tokenizer.encode(reply.output_text)])
        np.testing.assert_array_equal(request.token_ids[: len(retokenized)], retokenized)
        if tokenizer.encode(reply.output_text) == list(reply.output_token_ids):
            generated = np.concatenate([previous.token_ids, reply.output_token_ids])
            np.testing.assert_array_equal(request.token_ids[: len(generated)], generated)
    report = read_metadata(outcome.path)["live_turns"]
    differing = [
        r for _, r in by_turn.values() if tokenizer.encode(r.output_text) != list(r.output_token_ids)
    ]
    assert (report["num_replies_checked"], report["num_retokenized_differently"]) == (5, len(differing))
    rows = pq.read_table(outcome.path).to_pylist()
    assert [row["cached_prompt_tokens"] for row in rows] == [row["expected_cached_tokens"] for row in rows]
    assert report["num_live"] == 3 and report["generated_blocks_cached"] is True
    assert (
        report["reported_cached_tokens"]
        == report["expected_with_generated_tokens"]
        > report["expected_prompt_only_tokens"]
    )
    assert read_metadata(outcome.path)["run"]["turns"] == "live"
    assert any("the generated blocks were cached" in note for note in outcome.notes)


def test_a_prompt_only_server_is_told_apart(prompt_only_server, tmp_path):
    outcome = live_run(tmp_path, prompt_only_server.url)
    report = read_metadata(outcome.path)["live_turns"]
    assert report["generated_blocks_cached"] is False
    assert (
        report["reported_cached_tokens"]
        == report["expected_prompt_only_tokens"]
        < report["expected_with_generated_tokens"]
    )
    assert any("the generated blocks were NOT cached" in note for note in outcome.notes)
    assert outcome.reconciliation.below_expected  # the rows expected the generated blocks


def test_an_in_process_run_takes_turns_live_too(kvbench, tmp_path):
    path = tmp_path / "chats.json"
    path.write_text(json.dumps(CHATS))
    out = tmp_path / "inprocess.parquet"
    code, _, err = kvbench("run", path, "--turns", "live", "--max-tokens", MAX_TOKENS, "--out", out)
    assert code == 0, err
    assert (
        "live turns: 3 requests built from the real replies" in err
        and "the generated blocks were cached" in err
    )
    rows = pq.read_table(out).to_pylist()
    assert [row["cached_prompt_tokens"] for row in rows] == [row["expected_cached_tokens"] for row in rows]
    assert read_metadata(out)["live_turns"]["num_live"] == 3
    code, _, err = kvbench("run", path, "--turns", "sometimes")
    assert code == 2 and "sometimes" in err
