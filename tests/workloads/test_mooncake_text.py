"""Mooncake -> text: equal hash ids give equal 512-token blocks, and concatenation stays exact."""

import json

import numpy as np
import pytest

from kvbench.engine.hf_tokenizer import HFTokenizer
from kvbench.errors import InputError
from kvbench.sim.replay import ideal_hit_rate, prepare_prompts
from kvbench.workloads.formats.kvbench_trace_reader import trace_requests
from kvbench.workloads.formats.mooncake import read_mooncake
from kvbench.workloads.kinds import generate_trace
from kvbench.workloads.mooncake_text import BlockTexts, MooncakeTextConfig
from kvbench.workloads.text_fit import PieceCounter

RECORDS = [
    {"timestamp": 0, "input_length": 1536, "output_length": 10, "hash_ids": [0, 1, 2]},
    {"timestamp": 5, "input_length": 1300, "output_length": 0, "hash_ids": [0, 1, 5]},
    {"timestamp": 9, "input_length": 1537, "output_length": 3, "hash_ids": [0, 1, 2, 7]},  # 1-token tail
    {"timestamp": 9, "input_length": 3, "output_length": 3, "hash_ids": [9]},
    {"timestamp": 12, "input_length": 1000, "output_length": 3, "hash_ids": [0, 1]},
    {"timestamp": 20, "input_length": 700, "output_length": 3, "hash_ids": [11, 12]},
]


@pytest.fixture
def mooncake_file(tmp_path):
    path = tmp_path / "mooncake.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    return path


def common_prefix(a, b):
    size = min(len(a), len(b))
    differ = np.flatnonzero(np.asarray(a[:size]) != np.asarray(b[:size]))
    return int(differ[0]) if differ.size else size


def test_blocks_are_exactly_512_tokens_and_equal_for_equal_ids(tokenizer):
    blocks = BlockTexts(PieceCounter(tokenizer), seed=0)
    for hash_id in (0, 1, 12345, 2**40):
        text = blocks.full_block(hash_id)
        assert len(tokenizer.encode(text)) == 512
        assert text.startswith(f"Section {hash_id}:\n") and text.endswith("\n")
        assert BlockTexts(PieceCounter(tokenizer), seed=0).full_block(hash_id) == text
    assert BlockTexts(PieceCounter(tokenizer), seed=1).full_block(0) != blocks.full_block(0)


def test_prompts_have_input_length_tokens_and_share_exactly_the_shared_blocks(tokenizer, mooncake_file):
    trace = generate_trace("mooncake-text", MooncakeTextConfig(str(mooncake_file)), tokenizer)
    token_ids = [tokenizer.encode(r.prompt) for r in trace.requests]  # one encode of the whole text
    assert [len(t) for t in token_ids] == [r["input_length"] for r in RECORDS]
    assert [r.expected_prompt_tokens for r in trace.requests] == [r["input_length"] for r in RECORDS]
    assert [r.max_tokens for r in trace.requests] == [10, 1, 3, 3, 3, 3]
    assert [r.arrival_ms for r in trace.requests] == [0, 5, 9, 9, 12, 20]
    # r0 and r1 share hash ids [0, 1]: exactly their first 1,024 tokens, and differ inside block 2's
    # "Section <id>:" line.
    assert token_ids[0][:1024] == token_ids[1][:1024]
    assert 1024 <= common_prefix(token_ids[0], token_ids[1]) < 1024 + 8
    assert token_ids[2][:1536] == token_ids[0]  # r2 = r0's three blocks + a 1-token block
    assert token_ids[4] == token_ids[0][:1000]  # a cut last block is a token prefix of the full one
    assert common_prefix(token_ids[0], token_ids[5]) < 8  # no shared ids, nothing shared


def test_every_pair_shares_512_tokens_per_shared_leading_id(tokenizer, mooncake_file):
    trace = generate_trace("mooncake-text", MooncakeTextConfig(str(mooncake_file)), tokenizer)
    token_ids = [tokenizer.encode(r.prompt) for r in trace.requests]
    for i, a in enumerate(RECORDS):
        for j, b in enumerate(RECORDS[:i]):
            k = 0
            while k < min(len(a["hash_ids"]), len(b["hash_ids"])) and a["hash_ids"][k] == b["hash_ids"][k]:
                k += 1
            shared = min(512 * k, a["input_length"], b["input_length"])
            assert token_ids[i][:shared] == token_ids[j][:shared]


def test_real_trace_keeps_the_token_id_readers_hit_rate(tokenizer, shared_data):
    path = shared_data / "mooncake" / "conversation_trace.jsonl"
    trace = generate_trace("mooncake-text", MooncakeTextConfig(str(path), num_requests=60), tokenizer)
    text_requests = trace_requests(trace, tokenizer)
    id_requests = read_mooncake(path, limit=60)
    assert [t.num_tokens for t in text_requests] == [t.num_tokens for t in id_requests]
    for block_size in (512, 64):
        text_rate = ideal_hit_rate(prepare_prompts(text_requests, block_size)).token_hit_rate
        id_rate = ideal_hit_rate(prepare_prompts(id_requests, block_size)).token_hit_rate
        assert text_rate == pytest.approx(id_rate, abs=1e-3)
    assert tokenizer.encode(trace.requests[7].prompt) == text_requests[7].token_ids.tolist()


def test_bad_input_and_tokenizers_without_line_splits_are_refused(tokenizer, tmp_path, hf_checkpoint):
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps({**RECORDS[0], "hash_ids": [0, 1]}) + "\n")
    with pytest.raises(InputError, match=r"m.jsonl:1: field 'hash_ids'"):
        generate_trace("mooncake-text", MooncakeTextConfig(str(path)), tokenizer)
    path.write_text(
        json.dumps({"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": []}) + "\n"
    )
    with pytest.raises(InputError, match="empty prompt"):
        generate_trace("mooncake-text", MooncakeTextConfig(str(path)), tokenizer)
    with pytest.raises(ValueError, match="does not split exactly at line boundaries"):
        BlockTexts(PieceCounter(HFTokenizer(hf_checkpoint)), seed=0)
