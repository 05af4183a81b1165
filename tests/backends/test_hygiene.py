"""Cache hygiene: the nonce goes first in every prompt and the token ids follow the changed text."""

import numpy as np

from kvbench.backends.openai.hygiene import nonce_line, with_nonce
from kvbench.request import Message, Request
from kvbench.workloads.tokenizer import load_tokenizer


def test_nonce_goes_first_and_token_ids_follow_the_text():
    tokenizer = load_tokenizer()
    chat = Request(
        0,
        "c",
        "c",
        0,
        np.zeros(0, dtype=np.uint32),
        max_tokens=2,
        messages=(Message("system", "Be brief."), Message("user", "hi")),
    )
    plain = Request(1, "p", "p", 0, np.zeros(0, dtype=np.uint32), max_tokens=2, prompt="Once upon a time")
    ids = Request(2, "t", "t", 0, np.array([7, 8, 9], dtype=np.uint32), max_tokens=2)
    changed = with_nonce([chat, plain, ids], "abc123", tokenizer)
    line = nonce_line("abc123")
    assert changed[0].messages[0].content == line + "Be brief." and changed[0].messages[1].content == "hi"
    assert changed[1].prompt == line + "Once upon a time"
    for request in changed[:2]:
        assert np.array_equal(request.token_ids, tokenizer.render(request))
    assert changed[0].num_tokens == len(tokenizer.render_messages(changed[0].messages))
    assert changed[2].token_ids.tolist() == tokenizer.encode(line) + [7, 8, 9]
