"""KV layout, byte accounting, presets and config.json reading (kvbench.memory.layout*)."""

import json

import pytest

from kvbench.errors import InputError
from kvbench.memory.layout import (
    DType,
    KvLayout,
    ModelShape,
    ParameterCounts,
    fit_in_budget,
    format_bytes,
    parse_bytes,
    parse_dtype,
)
from kvbench.memory.presets import DEFAULT_PRESET, PRESETS, read_config_json, resolve_model

MiB, GiB = 2**20, 2**30

# The public config.json of meta-llama/Llama-3.1-8B (fields this module reads, plus some it ignores).
LLAMA_31_8B_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "attention_bias": False,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 128256,
}
# Qwen/Qwen2.5-7B: sliding_window is present but switched off.
QWEN25_7B_CONFIG = {
    "model_type": "qwen2",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "max_position_embeddings": 32768,
    "max_window_layers": 28,
    "num_attention_heads": 28,
    "num_hidden_layers": 28,
    "num_key_value_heads": 4,
    "sliding_window": 131072,
    "use_sliding_window": False,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 152064,
}


def write_config(tmp_path, config, name="config.json"):
    path = tmp_path / name
    path.write_text(json.dumps(config))
    return path


# -- check values of real model shapes ----------------------------------------------------------------


def test_llama_31_8b_bf16_check_values():
    layout = KvLayout.of(PRESETS["llama-3.1-8b"], block_size=16)
    assert layout.bytes_per_token == 2 * 32 * 8 * 128 * 2 == 131_072  # 128 KiB
    assert layout.bytes_per_block == 2 * MiB
    assert layout.bytes_for_tokens(2000) == 250 * MiB
    assert layout.bytes_for_tokens(128 * 1024) == 16 * GiB
    assert format_bytes(layout.bytes_per_token) == "128 KiB"
    assert format_bytes(layout.bytes_for_tokens(2000)) == "250 MiB"


def test_default_model_is_8_kib_per_token_in_fp32():
    shape = PRESETS[DEFAULT_PRESET]
    assert KvLayout.of(shape).bytes_per_token == 2 * 8 * 2 * 64 * 4 == 8192
    assert KvLayout.of(shape, DType.BF16).bytes_per_token == 4096


@pytest.mark.parametrize(
    "name, total",
    [
        ("llama-3.1-8b", 8_030_261_248),  # model.safetensors.index.json total_size 16,060,522,496 / 2
        ("llama-3.1-70b", 70_553_706_496),
        ("mistral-7b", 7_248_023_552),
        ("qwen2.5-7b", 7_615_616_512),  # total_size 15,231,233,024 / 2
        (DEFAULT_PRESET, 73_894_912),
    ],
)
def test_parameter_counts_match_published_checkpoints(name, total):
    assert ParameterCounts.of(PRESETS[name]).total == total


def test_parameter_components_and_tied_head():
    counts = ParameterCounts.of(PRESETS["llama-3.1-8b"])
    assert counts.embedding == counts.lm_head == 128_256 * 4096
    assert counts.norms == (2 * 32 + 1) * 4096
    assert ParameterCounts.of(PRESETS[DEFAULT_PRESET]).lm_head == 0


# -- budget -----------------------------------------------------------------------------------------


def test_fit_in_budget_counts_tokens_and_blocks_after_weights():
    shape = PRESETS["llama-3.1-8b"]
    layout = KvLayout.of(shape)
    fit = fit_in_budget(shape, layout, 72 * GiB)
    assert fit.weight_bytes == 16_060_522_496
    assert fit.kv_bytes == 72 * GiB - 16_060_522_496
    assert fit.num_tokens == fit.kv_bytes // 131_072
    assert fit.num_blocks == fit.kv_bytes // (2 * MiB)
    assert fit.num_max_len_sequences == fit.num_tokens // 131_072


def test_weights_that_do_not_fit_leave_no_kv_space():
    shape = PRESETS["llama-3.1-70b"]
    fit = fit_in_budget(shape, KvLayout.of(shape), 72 * GiB)
    assert not fit.weights_fit
    assert (fit.kv_bytes, fit.num_tokens, fit.num_blocks) == (0, 0, 0)
    with pytest.raises(ValueError):
        fit_in_budget(shape, KvLayout.of(shape), -1)


# -- parsing ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("2GiB", 2 * GiB),
        ("512MiB", 512 * MiB),
        ("1e9", 10**9),
        ("1048576", 2**20),
        ("1.5GiB", 3 * GiB // 2),
        ("16 KB", 16_000),
        ("2g", 2 * GiB),
        ("80gib", 80 * GiB),
        ("4TB", 4 * 10**12),
        ("0", 0),
    ],
)
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["", "abc", "-1GiB", "2XB", "1.5", "GiB", "1e400", "nan"])
def test_parse_bytes_refuses_with_one_line(text):
    with pytest.raises(InputError) as error:
        parse_bytes(text)
    assert "\n" not in str(error.value)


def test_format_bytes():
    assert format_bytes(512) == "512 B"
    assert format_bytes(2 * MiB) == "2 MiB"
    assert format_bytes(1.5 * GiB) == "1.50 GiB"
    assert format_bytes(1002 * MiB) == "0.98 GiB"


def test_parse_dtype_aliases():
    assert parse_dtype("bfloat16") is DType.BF16
    assert parse_dtype("float32") is DType.FP32
    assert parse_dtype("FP8") is DType.FP8
    assert parse_dtype("half").num_bytes == 2
    with pytest.raises(InputError, match="fp32, fp16, bf16, fp8"):
        parse_dtype("int3")


def test_model_shape_validates():
    fields = dict(
        name="x",
        num_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        num_kv_heads=2,
        head_dim=16,
        intermediate_size=128,
        vocab_size=100,
        tie_word_embeddings=True,
        max_position_embeddings=128,
    )
    ModelShape(**fields)
    with pytest.raises(ValueError, match="num_layers"):
        ModelShape(**{**fields, "num_layers": 0})
    with pytest.raises(ValueError, match="multiple"):
        ModelShape(**{**fields, "num_kv_heads": 3})


# -- config.json ------------------------------------------------------------------------------------


def test_config_json_reads_like_the_preset(tmp_path):
    path = write_config(tmp_path, LLAMA_31_8B_CONFIG)
    shape = read_config_json(path)
    preset = PRESETS["llama-3.1-8b"]
    assert {**shape.__dict__, "name": preset.name} == preset.__dict__
    assert resolve_model(str(tmp_path)).num_layers == 32  # a folder with config.json works too


def test_qwen2_config_counts_qkv_bias_and_ignores_unused_window(tmp_path):
    shape = read_config_json(write_config(tmp_path, QWEN25_7B_CONFIG))
    assert shape.qkv_bias and not shape.o_proj_bias
    assert ParameterCounts.of(shape).total == 7_615_616_512
    assert KvLayout.of(shape).bytes_per_token == 2 * 28 * 4 * 128 * 2


def test_missing_head_dim_and_kv_heads_take_transformers_defaults(tmp_path):
    config = {key: value for key, value in LLAMA_31_8B_CONFIG.items() if key != "num_key_value_heads"}
    shape = read_config_json(write_config(tmp_path, config))
    assert (shape.num_kv_heads, shape.head_dim) == (32, 128)


@pytest.mark.parametrize(
    "extra, reason",
    [
        ({"kv_lora_rank": 512}, "multi-head latent attention"),
        ({"sliding_window": 4096}, "sliding-window"),
        ({"layer_types": ["sliding_attention", "full_attention"]}, "hybrid attention"),
        ({"layer_types": ["linear_attention", "full_attention"]}, "hybrid attention"),
        ({"mamba_d_state": 16}, "state-space"),
        ({"hybrid_override_pattern": "M-M*"}, "hybrid"),
        ({"num_local_experts": 8}, "mixture of experts"),
        ({"text_config": {}}, "text_config"),
    ],
)
def test_refused_shapes_say_why(tmp_path, extra, reason):
    path = write_config(tmp_path, {**LLAMA_31_8B_CONFIG, **extra})
    with pytest.raises(InputError, match=reason) as error:
        read_config_json(path)
    assert str(path) in str(error.value)


def test_window_as_long_as_the_context_is_accepted(tmp_path):
    config = {**LLAMA_31_8B_CONFIG, "sliding_window": 131072}
    assert read_config_json(write_config(tmp_path, config)).num_layers == 32
    all_full = {**LLAMA_31_8B_CONFIG, "layer_types": ["full_attention"] * 32}
    assert read_config_json(write_config(tmp_path, all_full)).num_layers == 32


@pytest.mark.parametrize(
    "change, message",
    [
        ({"num_hidden_layers": None}, "field 'num_hidden_layers': missing"),
        ({"hidden_size": "big"}, "field 'hidden_size': expected a positive integer"),
        ({"num_key_value_heads": 5}, "field 'num_key_value_heads'"),
        ({"torch_dtype": "int4"}, "field 'torch_dtype'"),
    ],
)
def test_bad_config_fields_are_named(tmp_path, change, message):
    config = {**LLAMA_31_8B_CONFIG, **change}
    config = {key: value for key, value in config.items() if value is not None}
    with pytest.raises(InputError, match=message):
        read_config_json(write_config(tmp_path, config))


def test_unreadable_config_and_unknown_model(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(InputError, match="not valid JSON"):
        read_config_json(bad)
    with pytest.raises(InputError, match="unknown model 'gpt-9'.*llama-3.1-8b"):
        resolve_model("gpt-9")
    assert resolve_model("LLAMA-3.1-8B") is PRESETS["llama-3.1-8b"]


# -- against transformers itself ----------------------------------------------------------------------


def test_default_preset_matches_the_engine_default_model(tmp_path):
    pytest.importorskip("transformers")
    from kvbench.engine.model import default_llama_config

    path = write_config(tmp_path, default_llama_config().to_dict())
    shape = read_config_json(path)
    preset = PRESETS[DEFAULT_PRESET]
    assert {**shape.__dict__, "name": preset.name, "dtype": preset.dtype} == preset.__dict__


@pytest.mark.parametrize(
    "model_type, extra",
    [
        ("llama", {"tie_word_embeddings": False}),
        ("llama", {"attention_bias": True, "mlp_bias": True}),
        ("mistral", {"sliding_window": None, "tie_word_embeddings": False}),
        ("qwen2", {"tie_word_embeddings": True, "use_sliding_window": False}),
    ],
)
def test_parameter_count_equals_transformers_model(tmp_path, model_type, extra):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = transformers.AutoConfig.for_model(
        model_type,
        hidden_size=64,
        intermediate_size=176,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=1000,
        max_position_embeddings=256,
        **extra,
    )
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    expected = sum(parameter.numel() for parameter in model.parameters())  # tied weights count once
    shape = read_config_json(write_config(tmp_path, config.to_dict()))
    assert ParameterCounts.of(shape).total == expected
