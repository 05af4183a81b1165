"""Model shapes for the memory calculator: presets with public config values, and ``config.json``.

Presets copy the numbers of the public Hugging Face configs (``config.json`` of
meta-llama/Llama-3.1-8B and -70B, mistralai/Mistral-7B-v0.3, Qwen/Qwen2.5-7B) and kvbench's default
model (DESIGN.md). A local ``config.json`` is read with the same field names.

Shapes the KV rule ``2 x layers x kv_heads x head_dim x dtype bytes`` does not describe are refused
with a reason instead of being mis-computed:

* multi-head latent attention (DeepSeek V2/V3: ``kv_lora_rank``) caches one compressed latent per
  token and layer;
* sliding-window attention (``sliding_window`` in force) caps what a layer keeps at the window;
* hybrid stacks (``layer_types`` mixing kinds, Mamba / linear-attention layers) keep no KV, or a
  fixed-size state, in some layers;
* mixture-of-experts and nested multimodal configs, whose weights this module would miscount.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import MappingProxyType
from typing import Any

from kvbench.errors import InputError
from kvbench.memory.layout import DType, ModelShape, parse_dtype
from kvbench.workloads.formats.jsonl import TOO_DEEP
from kvbench.workloads.formats.lines import bounded_text

DEFAULT_PRESET = "kvbench-default"

# The columns of a preset row: ModelShape's fields after its name, up to dtype (the biases default off).
_COLUMNS = tuple(field.name for field in dataclasses.fields(ModelShape))[1:11]


def _preset(name: str, *columns: Any, qkv_bias: bool = False) -> ModelShape:
    """One preset from a row of :data:`_COLUMNS` values."""
    return ModelShape(name=name, **dict(zip(_COLUMNS, columns, strict=True)), qkv_bias=qkv_bias)


PRESETS: MappingProxyType[str, ModelShape] = MappingProxyType(
    {
        preset.name: preset
        for preset in (
            # kvbench's default model (DESIGN.md; kvbench.engine.model.default_llama_config, which
            # imports torch, so the numbers are repeated here and a test keeps the two equal).
            # name, layers, hidden, heads, KV heads, head_dim, MLP width, vocab, tied, context, dtype
            _preset(DEFAULT_PRESET, 8, 512, 8, 2, 64, 1408, 100_277, True, 8192, DType.FP32),
            _preset("llama-3.1-8b", 32, 4096, 32, 8, 128, 14_336, 128_256, False, 131_072, DType.BF16),
            _preset("llama-3.1-70b", 80, 8192, 64, 8, 128, 28_672, 128_256, False, 131_072, DType.BF16),
            # v0.3: 32,768-token vocab, no sliding window (v0.1 had 4,096)
            _preset("mistral-7b", 32, 4096, 32, 8, 128, 14_336, 32_768, False, 32_768, DType.BF16),
            # sliding_window is in its config but use_sliding_window is false
            _preset(
                "qwen2.5-7b", 28, 3584, 28, 4, 128, 18_944, 152_064, False, 32_768, DType.BF16, qkv_bias=True
            ),
        )
    }
)

_HYBRID_KEYS = (
    "layers_block_type",
    "hybrid_override_pattern",
    "attn_layer_period",
    "attn_layer_indices",
    "attn_type_list",
    "block_types",
)
_MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")


def resolve_model(name_or_path: str) -> ModelShape:
    """A preset name (case-insensitive) or a path to ``config.json`` / its folder -> shape.

    Raises:
        InputError: neither a preset nor a readable config, or a config this module refuses.
    """
    key = name_or_path.strip().lower()
    if key in PRESETS:
        return PRESETS[key]
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise InputError(
            f"unknown model {name_or_path!r}: use a preset ({', '.join(PRESETS)}) "
            "or a path to a config.json or its folder"
        )
    return read_config_json(path)


def read_config_json(path: str | Path) -> ModelShape:
    """Read a Hugging Face ``config.json`` of a Llama-style decoder into a :class:`ModelShape`.

    Defaults as in transformers' Llama/Mistral/Qwen2 config classes: ``num_key_value_heads`` =
    ``num_attention_heads``, ``head_dim`` = ``hidden_size // num_attention_heads``,
    ``tie_word_embeddings`` false; the weight dtype is ``torch_dtype`` (or ``dtype``), fp32 if absent.

    Raises:
        InputError: unreadable or not JSON, a missing or bad field (names the file and field), or a
            shape the KV rule does not cover (see the module docstring).
    """
    path = Path(path)
    try:
        config = json.loads(bounded_text(path))
    except json.JSONDecodeError as exc:
        raise InputError.at(path, exc.lineno, None, f"not valid JSON ({exc.msg})") from None
    except RecursionError:
        raise InputError(f"{path}: {TOO_DEEP}") from None
    if not isinstance(config, dict):
        raise InputError(f"{path}: expected a JSON object")
    _refuse_unsupported(path, config)
    return _shape_from_config(path, config)


def _refuse_unsupported(path: Path, config: dict[str, Any]) -> None:
    """Raise :class:`InputError` for a config whose KV or weights the simple rules would get wrong."""

    def refuse(reason: str) -> InputError:
        return InputError(f"{path}: {reason}; kvbench memory covers full-attention decoders only")

    if config.get("kv_lora_rank") is not None:
        raise refuse(
            "multi-head latent attention (kv_lora_rank): the cache holds a compressed "
            "latent per token, not 2 x kv_heads x head_dim"
        )
    if "text_config" in config:
        raise refuse("a nested text_config (multimodal model): point --model at a text model's config")
    layer_types = config.get("layer_types")
    if isinstance(layer_types, list) and set(layer_types) - {"full_attention", "attention"}:
        kinds = ", ".join(sorted(set(map(str, layer_types))))
        raise refuse(f"hybrid attention (layer_types: {kinds}): some layers keep no full KV")
    hybrid = [key for key in _HYBRID_KEYS if config.get(key) is not None]
    hybrid += [key for key in config if key.startswith(("mamba_", "ssm_", "linear_"))]
    if hybrid:
        raise refuse(f"a hybrid or state-space stack ({hybrid[0]})")
    window = config.get("sliding_window")
    window_used = config.get("use_sliding_window", True) is not False
    max_len = config.get("max_position_embeddings")
    window_binds = not (isinstance(max_len, int) and isinstance(window, int) and window >= max_len)
    if window is not None and window_used and window_binds:
        raise refuse(
            f"sliding-window attention (sliding_window={window}): a layer keeps at most "
            "the window, so KV does not grow with every token"
        )
    moe = [key for key in _MOE_KEYS if config.get(key)]
    if moe:
        raise refuse(f"mixture of experts ({moe[0]}): expert weights are not counted")


def _shape_from_config(path: Path, config: dict[str, Any]) -> ModelShape:
    def integer(field: str, default: int | None = None) -> int:
        value = config.get(field, default)
        if value is None and default is not None:
            value = default
        if value is None:
            raise InputError.at(path, None, field, "missing")
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise InputError.at(path, None, field, f"expected a positive integer, got {value!r}")
        return value

    hidden_size = integer("hidden_size")
    num_heads = integer("num_attention_heads")
    if config.get("head_dim") is None and hidden_size % num_heads:
        raise InputError.at(
            path,
            None,
            "head_dim",
            f"missing, and hidden_size {hidden_size} is not a multiple of num_attention_heads {num_heads}",
        )
    num_kv_heads = integer("num_key_value_heads", num_heads)
    if num_heads % num_kv_heads:
        raise InputError.at(
            path,
            None,
            "num_key_value_heads",
            f"{num_kv_heads} does not divide num_attention_heads {num_heads}",
        )
    dtype_text = config.get("torch_dtype") or config.get("dtype") or "float32"
    is_qwen2 = config.get("model_type") == "qwen2"  # Qwen2 has q/k/v biases and no flag for them
    attention_bias = bool(config.get("attention_bias", False))
    return ModelShape(
        name=str(path),
        num_layers=integer("num_hidden_layers"),
        hidden_size=hidden_size,
        num_attention_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=integer("head_dim", hidden_size // num_heads),
        intermediate_size=integer("intermediate_size"),
        vocab_size=integer("vocab_size"),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        max_position_embeddings=integer("max_position_embeddings"),
        dtype=_config_dtype(path, dtype_text),
        qkv_bias=is_qwen2 or attention_bias,
        o_proj_bias=attention_bias,
        mlp_bias=bool(config.get("mlp_bias", False)),
    )


def _config_dtype(path: Path, text: Any) -> DType:
    try:
        return parse_dtype(str(text))
    except InputError:
        raise InputError.at(path, None, "torch_dtype", f"unsupported dtype {text!r}") from None
