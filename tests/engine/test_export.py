"""``kvbench model export`` (kvbench/engine/export.py): a checkpoint transformers reloads exactly.

The model tests use a scaled-down random Llama with cl100k's vocabulary (so the exported tokenizer
fits it) to keep the files small; one slow test exports the full default model.
"""

import json
import os

import numpy as np
import pytest
import torch
from tiny_workloads import TINY_LLAMA
from transformers import AutoModelForCausalLM, AutoTokenizer

from kvbench.engine.cpu_kernels import use_few_row_linears
from kvbench.engine.export import export_model as engine_export_model
from kvbench.engine.hf_tokenizer import HFTokenizer
from kvbench.engine.model import (
    CL100K_VOCAB_SIZE,
    ModelConfig,
    default_llama_config,
    load_model,
    random_model,
)
from kvbench.engine.one_query import use_cpu_attention
from kvbench.engine.tokenizer_export import (
    CHATML_TEMPLATE,
    ExportCheckError,
    check_cl100k_tokenizer,
    cl100k_special_tokens,
    oniguruma_pattern,
)
from kvbench.errors import InputError
from kvbench.workloads.conversations import ChatConfig
from kvbench.workloads.generators import SharedPrefixConfig
from kvbench.workloads.kinds import generate_trace
from kvbench.workloads.tokenizer import TiktokenTokenizer


def export_model(out_dir, loaded, overwrite=False):
    """What ``kvbench model export`` does: the engine's export, checked against kvbench's cl100k."""
    return engine_export_model(out_dir, loaded, overwrite, reference=TiktokenTokenizer())


@pytest.fixture(scope="module")
def small_model():
    return random_model(default_llama_config(**TINY_LLAMA), seed=7)


@pytest.fixture(scope="module")
def exported(tmp_path_factory, small_model):
    path = tmp_path_factory.mktemp("export") / "checkpoint"
    return export_model(path, small_model)


def logits(model, token_ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor([token_ids])).logits[0]  # (seq, vocab)


def test_export_writes_a_complete_checkpoint(exported):
    assert {
        "config.json",
        "model.safetensors",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    } <= set(exported.files)
    assert exported.num_checked_texts > 0
    generation = json.loads((exported.path / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [100257, 100265]


def test_reload_with_transformers_gives_the_same_logits(exported, small_model):
    reloaded = AutoModelForCausalLM.from_pretrained(exported.path, local_files_only=True).eval()
    use_few_row_linears(reloaded)  # the kernels kvbench's loaded model runs (engine/cpu_kernels.py)
    use_cpu_attention(reloaded)
    ids = (
        TiktokenTokenizer().render_prompt("The same weights give the same logits, token for token.").tolist()
    )
    assert torch.equal(logits(reloaded, ids), logits(small_model.model, ids))
    assert reloaded.lm_head.weight.data_ptr() == reloaded.model.embed_tokens.weight.data_ptr()  # still tied


def test_kvbench_loads_the_export_with_its_tokenizer(exported, small_model):
    loaded = load_model(ModelConfig(path=exported.path))
    assert loaded.vocab_size == CL100K_VOCAB_SIZE
    assert set(loaded.eos_token_ids) == {100257, 100265}
    assert loaded.chat_template == CHATML_TEMPLATE
    ids = list(range(0, 100_000, 997))
    assert torch.equal(logits(loaded.model, ids), logits(small_model.model, ids))


def test_tokenizer_ids_match_tiktoken_and_chatml_on_generated_traces(exported):
    """Every request of a shared-prefix and a chat trace renders to kvbench's ids through the template."""
    reference, hf = TiktokenTokenizer(), HFTokenizer(exported.path)
    traces = (
        generate_trace("shared-prefix", SharedPrefixConfig(num_requests=3, system_tokens=300), reference),
        generate_trace("chat", ChatConfig(num_conversations=2, system_tokens=200), reference),
    )
    for trace in traces:
        for request in trace.requests:
            assert hf.render(request).tolist() == reference.render(request).tolist()


def test_special_tokens_keep_their_tiktoken_ids(exported):
    tokenizer = AutoTokenizer.from_pretrained(exported.path, local_files_only=True)
    specials = cl100k_special_tokens()
    assert specials["<|endoftext|>"] == 100257 and specials["<|im_start|>"] == 100264
    assert sorted(specials.values()) == [i for i in range(100256, CL100K_VOCAB_SIZE)]  # every id decodes
    for token, token_id in specials.items():
        assert tokenizer.convert_tokens_to_ids(token) == token_id
    assert tokenizer.decode([100256, 100276]) == "<|kvbench_reserved_100256|><|endofprompt|>"


def test_digit_runs_split_like_tiktoken(exported):
    tokenizer = AutoTokenizer.from_pretrained(exported.path, local_files_only=True)
    text = "numbers 1234567 and 3.14159265"
    assert tokenizer.encode(text, add_special_tokens=False) == TiktokenTokenizer().encode(text)
    assert oniguruma_pattern(r"\p{N}{1,3}+|\s++$") == r"\p{N}{1,3}|\s++$"


def test_check_catches_a_wrong_tokenizer(exported, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (broken / name).write_bytes((exported.path / name).read_bytes())
    (broken / "chat_template.jinja").write_text(CHATML_TEMPLATE.replace("'\\n' -}}", "'' -}}", 1))
    with pytest.raises(ExportCheckError, match="chat"):
        check_cl100k_tokenizer(broken, TiktokenTokenizer())


def test_refuses_a_non_empty_directory(tmp_path, small_model):
    (tmp_path / "keep.txt").write_text("x")
    with pytest.raises(InputError, match="not empty"):
        export_model(tmp_path, small_model)


@pytest.mark.slow
def test_default_model_export_round_trip(tmp_path):
    default = load_model()
    result = export_model(tmp_path / "default", default)
    reloaded = AutoModelForCausalLM.from_pretrained(result.path, local_files_only=True).eval()
    ids = np.arange(1, 2000, 37).tolist()
    assert torch.equal(logits(reloaded, ids), logits(default.model, ids))
    assert result.num_parameters == sum(p.numel() for p in default.model.parameters())


def test_exported_files_are_readable_by_others_as_open_would_make_them(exported):
    """safetensors writes model.safetensors with mode 0600; the export gives every file open()'s mode."""
    umask = os.umask(0)
    os.umask(umask)
    modes = {path.name: path.stat().st_mode & 0o777 for path in exported.path.iterdir()}
    assert modes["model.safetensors"] == 0o666 & ~umask and set(modes.values()) == {0o666 & ~umask}
