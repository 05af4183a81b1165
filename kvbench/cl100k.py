"""cl100k_base, loaded offline from the ranks file kvbench ships, verified by its SHA-256.

``kvbench/data/cl100k_base.tiktoken`` is OpenAI's published ranks file (one ``base64(token) rank`` line per
BPE token, 100,256 lines; https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken),
byte for byte: its SHA-256 is the one tiktoken itself checks (``tiktoken_ext/openai_public.py``).
The split pattern and special-token ids below are tiktoken's ``cl100k_base`` definition from the
same file. tiktoken builds the encoding (``tiktoken.Encoding``); nothing is downloaded and nothing
is written into tiktoken's plugin namespace. Top level (beside constants.py) because both the
workloads' tokenizer and the engine's tokenizer export use it, and neither may import the other.
"""

from __future__ import annotations

import base64
import functools
import hashlib
from pathlib import Path
from typing import TYPE_CHECKING

from kvbench.errors import InputError
from kvbench.extras import install_command

if TYPE_CHECKING:
    import tiktoken

RANKS_PATH = Path(__file__).with_name("data") / "cl100k_base.tiktoken"  # package data
RANKS_SHA256 = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"  # tiktoken's expected_hash
PATTERN = r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""  # noqa: E501
SPECIAL_TOKENS = {
    "<|endoftext|>": 100257,
    "<|fim_prefix|>": 100258,
    "<|fim_middle|>": 100259,
    "<|fim_suffix|>": 100260,
    "<|endofprompt|>": 100276,
}

_REINSTALL = f"reinstall kvbench (from a checkout: {install_command(None)})"


def load_ranks(path: Path = RANKS_PATH, sha256: str = RANKS_SHA256) -> dict[bytes, int]:
    """The BPE ranks (token bytes -> rank) of a tiktoken ranks file, after checking its SHA-256.

    Raises:
        InputError: the file is missing or its SHA-256 differs (a damaged or replaced install).
    """
    try:
        with open(path, "rb") as file:  # builtin open, as tiktoken reads its files
            data = file.read()
    except OSError as exc:
        raise InputError(
            f"{path}: cannot read the cl100k ranks file ({exc.strerror}); {_REINSTALL}"
        ) from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha256:
        raise InputError(f"{path}: SHA-256 {digest} is not cl100k_base's {sha256}; {_REINSTALL}")
    return {
        base64.b64decode(token): int(rank)
        for token, rank in (line.split() for line in data.splitlines() if line)
    }


@functools.lru_cache(maxsize=1)
def _shipped_ranks() -> dict[bytes, int]:
    """The shipped ranks, read and checked once per process (tiktoken caches its encodings too)."""
    return load_ranks()


def cl100k_encoding(
    extra_special_tokens: dict[str, int] | None = None, name: str = "cl100k_base"
) -> tiktoken.Encoding:
    """tiktoken's ``cl100k_base`` from the shipped ranks, plus ``extra_special_tokens`` (e.g. ChatML's)."""
    import tiktoken

    return tiktoken.Encoding(
        name=name,
        pat_str=PATTERN,
        mergeable_ranks=_shipped_ranks(),
        special_tokens={**SPECIAL_TOKENS, **(extra_special_tokens or {})},
    )
