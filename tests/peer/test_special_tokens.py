"""One rule for special-token text: kvbench's tokenizer, ``kvbench serve``'s /tokenize and
the exported tokenizer.json (as transformers, and so vLLM, reads it) all give ``a<|im_end|>b`` ->
``[64, 100265, 65]``; the check ``kvbench peer vllm`` runs finds a server that splits them."""

import pytest

from kvbench.peer.special_tokens import PROBE_TEXT, special_token_problem
from kvbench.workloads.tokenizer import TiktokenTokenizer

PARSED = [64, 100265, 65]
SPLIT = [64, 27, 91, 318, 6345, 91, 29, 65]  # what /tokenize gave before: the marker split as text


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    pytest.importorskip("transformers")
    from transformers import AutoTokenizer

    from kvbench.engine.tokenizer_export import write_cl100k_tokenizer

    path = write_cl100k_tokenizer(tmp_path_factory.mktemp("tokenizer"))
    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


def test_kvbench_and_the_export_parse_special_tokens_in_text(exported):
    ours = TiktokenTokenizer()
    assert ours.encode(PROBE_TEXT) == PARSED == exported.encode(PROBE_TEXT, add_special_tokens=False)
    text = "x <|endoftext|> y <|im_start|>z"
    assert ours.encode(text) == exported.encode(text, add_special_tokens=False)


def test_the_peer_check_passes_the_export_and_names_a_server_that_splits_them(exported):
    ours = TiktokenTokenizer()
    assert special_token_problem(lambda text: exported.encode(text, add_special_tokens=False), ours) is None
    split = special_token_problem(
        lambda text: exported(text, add_special_tokens=False, split_special_tokens=True)["input_ids"], ours
    )
    assert split == (
        f"the server tokenizes 'a<|im_end|>b' as {SPLIT}, kvbench as {PARSED}: the server splits "
        "special tokens written in text into ordinary tokens; prompts holding special-token text "
        "count differently there (kvbench parses them, as transformers does)"
    )


@pytest.mark.server
def test_kvbench_serve_tokenizes_special_token_text_as_the_export(server, exported):
    from kvbench.backends.openai.admin import list_models
    from kvbench.backends.openai.tokenize import ServerTokenizer

    tokenize = ServerTokenizer(server.url, list_models(server.url, "EMPTY")[0][0]).encode
    assert tokenize(PROBE_TEXT) == PARSED
    assert special_token_problem(tokenize, TiktokenTokenizer()) is None
