"""One rule for special-token text, checked against a real server.

kvbench parses special tokens written in prompt text (``a<|im_end|>b`` -> ``[64, 100265, 65]``), as
Hugging Face tokenizers do by default, and so vLLM and SGLang on ``kvbench model export``'s
``tokenizer.json`` (:mod:`kvbench.workloads.tokenizer`). ``kvbench peer vllm`` asks the server's
``/tokenize`` for the probe text and says when the server follows another rule: then every
prompt holding such text has other token counts, and other cache expectations, there than here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

PROBE_TEXT = "a<|im_end|>b"  # SGLang's random-id prompts held such text (1,104 client vs 1,109 server tokens)


def special_token_problem(tokenize: Callable[[str], Sequence[int]], reference) -> str | None:
    """``None`` when ``tokenize`` (a server's ``/tokenize``, no special tokens added) encodes
    :data:`PROBE_TEXT` as ``reference`` (kvbench's tokenizer) does; else one line saying how."""
    expected, got = list(reference.encode(PROBE_TEXT)), [int(t) for t in tokenize(PROBE_TEXT)]
    if got == expected:
        return None
    rule = (
        "splits special tokens written in text into ordinary tokens"
        if len(got) > len(expected)
        else "differs"
    )
    return (
        f"the server tokenizes {PROBE_TEXT!r} as {got}, kvbench as {expected}: the server {rule}; prompts "
        "holding special-token text count differently there (kvbench parses them, as transformers does)"
    )
