"""The default random model and local-checkpoint loading (kvbench/engine/model.py)."""

import time

import pytest
import torch
from tiny_workloads import TINY_LLAMA

from kvbench.engine.model import (
    CL100K_ENDOFTEXT_ID,
    CL100K_VOCAB_SIZE,
    ModelConfig,
    build_random_model,
    default_llama_config,
    load_model,
    resolve_device,
)
from kvbench.errors import InputError
from kvbench.memory.layout import DType, KvLayout

TINY = dict(TINY_LLAMA, vocab_size=256, max_position_embeddings=512)


@pytest.fixture(scope="module")
def default_model():
    start_s = time.perf_counter()
    loaded = load_model()
    return loaded, time.perf_counter() - start_s


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny Llama checkpoint with a word-level tokenizer and a chat template, built offline."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    path = tmp_path_factory.mktemp("tiny-llama")
    config = default_llama_config(**TINY, bos_token_id=1, eos_token_id=2)
    build_random_model(config, seed=3).save_pretrained(path)
    words = ["[UNK]", "<s>", "</s>", "user", "assistant", ":", "hello", "prefix", "cache", "world"]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="[UNK]", bos_token="<s>", eos_token="</s>"
    )
    tokenizer.chat_template = "{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} {% endfor %}"
    tokenizer.save_pretrained(path)
    return path


def test_default_model_shape_and_kv_bytes(default_model):
    loaded, build_s = default_model
    config = loaded.model.config
    assert (config.num_hidden_layers, config.hidden_size, config.num_attention_heads) == (8, 512, 8)
    assert (config.num_key_value_heads, config.head_dim, config.intermediate_size) == (2, 64, 1408)
    assert loaded.vocab_size == CL100K_VOCAB_SIZE == 100_277
    assert loaded.model.lm_head.weight is loaded.model.model.embed_tokens.weight  # tied
    assert loaded.dtype == torch.float32 and loaded.device.type == "cpu"
    assert loaded.max_context_tokens >= 8192
    assert loaded.eos_token_ids == (CL100K_ENDOFTEXT_ID,)
    assert loaded.tokenizer is None and loaded.chat_template is None
    assert loaded.kv_layout(16).bytes_per_token == 2 * 8 * 2 * 64 * 4 == 8192
    assert loaded.kv_layout(16).bytes_per_block == 16 * 8192
    llama_31_8b = KvLayout(num_layers=32, num_kv_heads=8, head_dim=128, kv_dtype=DType.BF16)
    assert llama_31_8b.bytes_per_token == 131_072
    assert build_s < 30  # "a few seconds"; generous for a loaded 2-core CI box


def test_random_weights_depend_only_on_the_seed():
    config = default_llama_config(**TINY)
    torch.manual_seed(123)
    before = torch.rand(1)
    first, again, other = (build_random_model(config, seed) for seed in (0, 0, 1))
    torch.manual_seed(123)
    assert torch.equal(torch.rand(1), before)  # the global RNG is untouched
    for (name, a), b, c in zip(first.named_parameters(), again.parameters(), other.parameters()):
        assert torch.equal(a, b), name
        assert torch.isfinite(a).all(), name  # every parameter was filled (none left uninitialised)
        if "norm" not in name:
            assert not torch.equal(a, c), name


def test_model_config_validation():
    assert ModelConfig(dtype="bfloat16").dtype is DType.BF16
    assert ModelConfig(dtype="float16").dtype is DType.FP16
    with pytest.raises(InputError):
        ModelConfig(dtype="fp8")
    with pytest.raises(InputError):
        ModelConfig(dtype="int4")
    for device in ("tpu", "cuda:x", "cpu:1", ""):
        with pytest.raises(ValueError, match="device"):
            ModelConfig(device=device)
    assert ModelConfig(device="cuda:1").device == "cuda:1"  # existence is checked at load time


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_missing_cuda_device_is_one_clear_line():
    with pytest.raises(InputError, match="no CUDA device") as error:
        load_model(ModelConfig(device="cuda"))
    assert "\n" not in str(error.value)


def test_missing_mps_device_is_one_clear_line():
    if torch.backends.mps.is_available():
        pytest.skip("this machine has an MPS device")
    with pytest.raises(InputError, match="no Apple MPS device"):
        resolve_device("mps")
    assert resolve_device("cpu") == torch.device("cpu")


def test_local_checkpoint_loads_with_tokenizer_and_chat_template(checkpoint):
    loaded = load_model(ModelConfig(path=checkpoint))
    assert loaded.name == checkpoint.name
    assert loaded.vocab_size == 256 and loaded.max_context_tokens == 512
    assert loaded.eos_token_ids == (2,)
    assert loaded.tokenizer("hello prefix cache")["input_ids"] == [6, 7, 8]
    assert "messages" in loaded.chat_template
    rendered = loaded.tokenizer.apply_chat_template([{"role": "user", "content": "hello"}], tokenize=False)
    assert rendered.strip() == "user : hello"
    saved = build_random_model(default_llama_config(**TINY), seed=3)
    for a, b in zip(saved.parameters(), loaded.model.parameters()):
        assert torch.equal(a, b)
    assert loaded.kv_layout(16).bytes_per_token == 2 * 2 * 2 * 16 * 4


def test_local_checkpoint_in_bfloat16(checkpoint):
    loaded = load_model(ModelConfig(path=checkpoint, dtype="bfloat16"))
    assert loaded.dtype == torch.bfloat16
    assert loaded.kv_layout(16).bytes_per_token == 2 * 2 * 2 * 16 * 2


@pytest.mark.parametrize("problem", ["missing", "file", "no-config", "no-weights", "no-tokenizer"])
def test_bad_checkpoint_paths_are_one_clear_line(tmp_path, checkpoint, problem):
    path = tmp_path / "model"
    if problem == "file":
        path.write_text("not a directory")
    elif problem in ("no-config", "no-weights", "no-tokenizer"):
        path.mkdir()
        (path / "README.md").write_text("hi")
        if problem != "no-config":
            (path / "config.json").write_bytes((checkpoint / "config.json").read_bytes())
        if problem == "no-tokenizer":
            (path / "model.safetensors").write_bytes((checkpoint / "model.safetensors").read_bytes())
    expected = {
        "missing": "no such directory",
        "file": "no config.json",
        "no-config": "no config.json",
        "no-weights": "cannot load the model",
        "no-tokenizer": "tokenizer",
    }[problem]
    with pytest.raises(InputError, match=expected) as error:
        load_model(ModelConfig(path=path))
    assert "\n" not in str(error.value)
    assert str(path) in str(error.value)
