"""The cl100k tokenizer as Hugging Face files, for ``kvbench model export`` (kvbench/engine/export.py).

Why the converted tokenizer needs two fixes (without them, ids differ from tiktoken's):

* ``transformers.integrations.tiktoken.convert_tiktoken_to_fast`` keeps the BPE ranks as ids but adds
  the special tokens as *new* tokens, numbered from the end of the BPE vocabulary (100,256) in dict
  order. cl100k's special ids have gaps (``<|endoftext|>`` is 100,257, 100,256 is unused), so the
  converter gives ``<|endoftext|>`` 100,256 and ``<|im_start|>`` 100,261 instead of 100,264.
  :func:`write_cl100k_tokenizer` puts every special token into the BPE vocabulary at its tiktoken id
  (tokenizers then keeps that id for the added token) and fills each unassigned id below the model's
  vocabulary size (100,256; 100,261-100,263; 100,266-100,275) with a reserved special token, so that
  any id the random model generates decodes.
* the split regex means something else in the tokenizers library's regex engine: ``1234567`` becomes
  one piece instead of ``123|456|7`` (:func:`oniguruma_pattern`).

The chat template (:data:`CHATML_TEMPLATE`) renders exactly the text kvbench's ChatML rendering
encodes (:mod:`kvbench.workloads.tokenizer`), and :func:`check_cl100k_tokenizer` proves on sample text
and chat messages that the exported tokenizer gives the same ids as tiktoken and as
``TiktokenTokenizer.render_messages``. transformers is imported inside the functions that need it
(as :class:`~kvbench.engine.hf_tokenizer.HFTokenizer` does).
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from kvbench.cl100k import PATTERN, RANKS_PATH, SPECIAL_TOKENS, load_ranks
from kvbench.constants import CL100K_IM_END_ID, CL100K_IM_START_ID, CL100K_VOCAB_SIZE, IM_END, IM_START
from kvbench.errors import KvbenchError
from kvbench.request import Message


class ReferenceTokenizer(Protocol):
    """What the check compares against: kvbench's own cl100k tokenizer
    (``kvbench.workloads.tokenizer.TiktokenTokenizer``), passed in by the caller."""

    def encode(self, text: str) -> list[int]: ...

    def render_messages(self, messages: Sequence[Message]): ...


MAX_CONTEXT_TOKENS = 8192  # tokenizer_config's model_max_length: the default model's context

# kvbench's ChatML (kvbench/workloads/tokenizer.py) as a Jinja chat template: per message
# <|im_start|>{role}\n{content}<|im_end|>\n, then <|im_start|>assistant\n as the generation prompt.
CHATML_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)
RESERVED_TOKEN = "<|kvbench_reserved_{id}|>"  # fills cl100k's unassigned ids below the vocabulary size
SAMPLE_TEXTS = (
    "Hello, world! Prefix caching saves the prefill of every repeated prompt.",
    "def f(x):\n    return x ** 2  # squares\n\n\nclass A:\n\tpass\n",
    "Ünïcödé, 中文字符, emoji 🙂🚀, numbers 1234567 3.14159, tabs\tand  double  spaces   .",
    "  leading spaces, trailing newlines\n\n",
    "<|im_start|> inside text is the control token; <|endoftext|> too.",
    "a<|im_end|>b",  # [64, 100265, 65]: the marker is the control token
    'JSON: {"tool": "grep", "args": ["-n", "KV cache"]}\r\nCRLF line\r\n',
)
SAMPLE_MESSAGES = (
    (
        Message("system", "You are a careful assistant.\nAnswer briefly."),
        Message("user", "What is a KV cache?"),
    ),
    (
        Message("system", "Rules:\n1. be kind\n2. be brief\n"),
        Message("user", "Hi!"),
        Message("assistant", "Hello. How can I help?"),
        Message("user", "  Explain   block hashes\n\nwith examples: [1, 2, 3]"),
    ),
)


class ExportCheckError(KvbenchError):
    """The exported tokenizer does not reproduce kvbench's token ids (a converter bug)."""


def cl100k_special_tokens() -> dict[str, int]:
    """Every special token of the exported vocabulary -> its id (tiktoken's, plus ChatML and fillers)."""
    specials = {**SPECIAL_TOKENS, IM_START: CL100K_IM_START_ID, IM_END: CL100K_IM_END_ID}
    used = set(load_ranks().values()) | set(specials.values())
    for token_id in range(CL100K_VOCAB_SIZE):
        if token_id not in used:
            specials[RESERVED_TOKEN.format(id=token_id)] = token_id
    return dict(sorted(specials.items(), key=lambda item: item[1]))


def oniguruma_pattern(pattern: str) -> str:
    """tiktoken's split regex rewritten for the tokenizers library's Oniguruma engine.

    cl100k's ``\\p{N}{1,3}+`` is possessive in tiktoken's regex engine (at most 3 digits per piece) but
    means ``(\\p{N}{1,3})+`` (any run of digits) in Oniguruma's Ruby syntax, so the converted
    tokenizer would split ``1234567`` as one piece (ids differ). Possessiveness is moot on a bounded
    interval at the end of an alternative, so dropping the ``+`` keeps tiktoken's meaning. ``?+``,
    ``*+`` and ``++`` are possessive in both engines and stay.
    """
    return re.sub(r"(\{\d+(?:,\d*)?\})\+", r"\1", pattern)


def write_cl100k_tokenizer(out_dir: Path) -> Path:
    """Write ``tokenizer.json`` + ``tokenizer_config.json`` (ChatML template) for cl100k into ``out_dir``.

    The BPE part comes from transformers' ``TikTokenConverter`` reading kvbench's ranks file (which is
    already in tiktoken's format, so nothing needs writing first: no ``blobfile``); the special
    tokens are then pinned to their tiktoken ids (module docstring). Returns ``out_dir``.
    """
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    specials = cl100k_special_tokens()
    converted = TikTokenConverter(vocab_file=str(RANKS_PATH), pattern=PATTERN, extra_special_tokens=specials)
    with tempfile.TemporaryDirectory(prefix="kvbench-tiktoken-") as scratch:
        converted.converted().save(str(Path(scratch) / "tokenizer.json"))
        data = json.loads((Path(scratch) / "tokenizer.json").read_text(encoding="utf-8"))
    pre_tokenizer = data["pre_tokenizer"]["pretokenizers"][0]  # Split(Regex(pattern)), then ByteLevel
    pre_tokenizer["pattern"]["Regex"] = oniguruma_pattern(pre_tokenizer["pattern"]["Regex"])
    data["model"]["vocab"].update(specials)
    data["added_tokens"] = [
        {
            "id": token_id,
            "content": token,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for token, token_id in specials.items()
    ]
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer_file = out_dir / "tokenizer.json"
    tokenizer_file.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_file=str(tokenizer_file),
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        model_max_length=MAX_CONTEXT_TOKENS,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    tokenizer.save_pretrained(out_dir)
    return out_dir


def check_cl100k_tokenizer(
    path: Path,
    reference: ReferenceTokenizer,
    texts: Sequence[str] = SAMPLE_TEXTS,
    conversations: Sequence[Sequence[Message]] = SAMPLE_MESSAGES,
) -> int:
    """Check that the tokenizer in ``path`` gives tiktoken's ids and kvbench's chat rendering.

    For every text: ``encode(text, add_special_tokens=False)`` (special tokens in the text parsed, the
    transformers default, as kvbench does) equals ``reference.encode``; every special token encodes to
    its id; every conversation rendered with the checkpoint's chat template and encoded as vLLM does
    (template text, no added special tokens) equals ``TiktokenTokenizer.render_messages``.
    Returns the number of texts and conversations checked.

    Raises:
        ExportCheckError: the first mismatch, with the text and the first differing position.
    """
    from transformers import AutoTokenizer

    exported = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    for text in texts:
        got = exported(text, add_special_tokens=False)["input_ids"]
        _compare(f"text {text[:30]!r}", list(got), reference.encode(text))
    for token, token_id in cl100k_special_tokens().items():
        _compare(f"special token {token}", exported.encode(token, add_special_tokens=False), [token_id])
    for messages in conversations:
        rendered = exported.apply_chat_template(
            [m.as_dict() for m in messages], tokenize=False, add_generation_prompt=True
        )
        got = exported.encode(rendered, add_special_tokens=False)
        _compare(f"chat of {len(messages)} messages", got, reference.render_messages(messages).tolist())
    return len(texts) + len(conversations)


def _compare(what: str, got: Sequence[int], expected: Sequence[int]) -> None:
    if list(got) == list(expected):
        return
    position = next(
        (i for i, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected))
    )
    raise ExportCheckError(
        f"exported tokenizer differs from kvbench on {what}: at token {position}, "
        f"got {list(got)[position : position + 5]}, expected {list(expected)[position : position + 5]}"
    )


def export_cl100k_tokenizer(out_dir: Path, reference: ReferenceTokenizer) -> int:
    """Write the cl100k tokenizer files into ``out_dir`` and check them against ``reference``;
    returns the number of texts and conversations checked. Raises ``ExportCheckError`` on the
    first mismatch."""
    write_cl100k_tokenizer(out_dir)
    return check_cl100k_tokenizer(out_dir, reference)
