"""KV-cache layout and byte accounting: bytes per token and per block, weights, what fits a budget.

The rule (PagedAttention, Kwon et al., SOSP'23, section 3; vLLM's ``get_kv_cache_spec``): every
layer keeps one key and one value vector per KV head for every token, so

    kv_bytes_per_token = 2 (K and V) x num_layers x num_kv_heads x head_dim x dtype_bytes

Llama 3.1 8B in bf16: 2 x 32 x 8 x 128 x 2 = 131,072 B = 128 KiB per token; a 16-token block is
2 MiB; a 2,000-token prompt 250 MiB; 131,072 tokens 16 GiB.

The rule holds only when every layer attends to every earlier token with plain multi-head / grouped
KV heads. Shapes it does not cover are refused by :mod:`kvbench.memory.presets` rather than
mis-computed. Nothing here imports torch.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from enum import Enum

from kvbench.errors import InputError


class DType(str, Enum):
    """Element types of weights or KV entries, named as on the command line."""

    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"
    FP8 = "fp8"  # vLLM's --kv-cache-dtype fp8 (e4m3 or e5m2; one byte either way)

    @property
    def num_bytes(self) -> int:
        return _DTYPE_BYTES[self]


_DTYPE_BYTES = {DType.FP32: 4, DType.FP16: 2, DType.BF16: 2, DType.FP8: 1}
_DTYPE_ALIASES = {
    "fp32": DType.FP32,
    "float32": DType.FP32,
    "float": DType.FP32,
    "fp16": DType.FP16,
    "float16": DType.FP16,
    "half": DType.FP16,
    "bf16": DType.BF16,
    "bfloat16": DType.BF16,
    "fp8": DType.FP8,
    "fp8_e4m3": DType.FP8,
    "fp8_e5m2": DType.FP8,
    "float8_e4m3fn": DType.FP8,
}


def parse_dtype(text: str) -> DType:
    """``"bf16"``, ``"bfloat16"``, ``"float32"``, ... -> :class:`DType`.

    Raises:
        InputError: an unknown name (the message lists the accepted ones).
    """
    try:
        return _DTYPE_ALIASES[str(text).strip().lower()]
    except KeyError:
        raise InputError(f"unknown dtype {text!r}: use one of fp32, fp16, bf16, fp8") from None


@dataclass(frozen=True)
class ModelShape:
    """The numbers of a decoder-only transformer that decide its KV bytes and weight bytes.

    Attributes mirror a Hugging Face ``config.json`` (Llama / Mistral / Qwen2 naming):
        name: preset name or the config's path.
        num_layers: ``num_hidden_layers``.
        hidden_size: model width.
        num_attention_heads: query heads.
        num_kv_heads: ``num_key_value_heads`` (GQA when fewer than the query heads).
        head_dim: per-head width (``hidden_size // num_attention_heads`` unless the config says).
        intermediate_size: MLP width (gate, up and down projections).
        vocab_size: embedding rows.
        tie_word_embeddings: the LM head reuses the embedding matrix (no separate weights).
        max_position_embeddings: the model's context length, tokens.
        dtype: the published weight dtype (``torch_dtype`` in the config).
        qkv_bias: q/k/v projections have biases (Qwen2).
        o_proj_bias: the output projection has a bias (Llama's ``attention_bias`` sets both).
        mlp_bias: the MLP projections have biases.
    """

    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    max_position_embeddings: int
    dtype: DType = DType.BF16
    qkv_bias: bool = False
    o_proj_bias: bool = False
    mlp_bias: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", DType(self.dtype))
        for field_name in (
            "num_layers",
            "hidden_size",
            "num_attention_heads",
            "num_kv_heads",
            "head_dim",
            "intermediate_size",
            "vocab_size",
            "max_position_embeddings",
        ):
            value = getattr(self, field_name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{field_name} must be a positive integer, got {value!r}")
        if self.num_attention_heads % self.num_kv_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_kv_heads ({self.num_kv_heads})"
            )


@dataclass(frozen=True)
class ParameterCounts:
    """Parameter counts of a :class:`ModelShape`, by component (Llama-style decoder).

    Attributes:
        embedding: ``vocab_size x hidden_size``.
        attention: all layers' q, k, v, o projections (and their biases, if any).
        mlp: all layers' gate, up and down projections (and biases).
        norms: two RMSNorm weight vectors per layer plus the final norm.
        lm_head: ``vocab_size x hidden_size``, or 0 when tied to the embedding.
    """

    embedding: int
    attention: int
    mlp: int
    norms: int
    lm_head: int

    @property
    def total(self) -> int:
        return self.embedding + self.attention + self.mlp + self.norms + self.lm_head

    @classmethod
    def of(cls, shape: ModelShape) -> ParameterCounts:
        """Count from the shape; checked against the published checkpoints' index files (Llama 3.1
        8B: 8,030,261,248; Qwen2.5 7B: 7,615,616,512)."""
        q_width = shape.num_attention_heads * shape.head_dim
        kv_width = shape.num_kv_heads * shape.head_dim
        attention = shape.hidden_size * (q_width + 2 * kv_width) + q_width * shape.hidden_size
        if shape.qkv_bias:
            attention += q_width + 2 * kv_width
        if shape.o_proj_bias:
            attention += shape.hidden_size
        mlp = 3 * shape.hidden_size * shape.intermediate_size
        if shape.mlp_bias:
            mlp += 2 * shape.intermediate_size + shape.hidden_size
        embedding = shape.vocab_size * shape.hidden_size
        return cls(
            embedding=embedding,
            attention=shape.num_layers * attention,
            mlp=shape.num_layers * mlp,
            norms=(2 * shape.num_layers + 1) * shape.hidden_size,
            lm_head=0 if shape.tie_word_embeddings else embedding,
        )


@dataclass(frozen=True)
class KvLayout:
    """How one model's KV cache is laid out in memory: bytes per token, per block.

    Attributes:
        num_layers, num_kv_heads, head_dim: from the model shape.
        kv_dtype: element type of the cached keys and values.
        block_size: tokens per block (16 is vLLM's default).
    """

    num_layers: int
    num_kv_heads: int
    head_dim: int
    kv_dtype: DType
    block_size: int = 16  # vLLM's default block size

    def __post_init__(self) -> None:
        object.__setattr__(self, "kv_dtype", DType(self.kv_dtype))
        for field_name in ("num_layers", "num_kv_heads", "head_dim", "block_size"):
            value = getattr(self, field_name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{field_name} must be a positive integer, got {value!r}")

    @classmethod
    def of(cls, shape: ModelShape, kv_dtype: DType | None = None, block_size: int = 16) -> KvLayout:
        """The layout of ``shape``'s cache; ``kv_dtype`` defaults to the model's dtype."""
        return cls(shape.num_layers, shape.num_kv_heads, shape.head_dim, kv_dtype or shape.dtype, block_size)

    @property
    def bytes_per_token(self) -> int:
        """``2 x num_layers x num_kv_heads x head_dim x dtype bytes`` (K and V of every layer)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.kv_dtype.num_bytes

    @property
    def bytes_per_block(self) -> int:
        return self.block_size * self.bytes_per_token

    def bytes_for_tokens(self, num_tokens: int) -> int:
        """KV bytes of ``num_tokens`` tokens stored densely (no block rounding)."""
        return num_tokens * self.bytes_per_token


@dataclass(frozen=True)
class BudgetFit:
    """What fits in a memory budget once the weights are loaded.

    Attributes:
        budget_bytes: memory the server may use (device memory x utilization).
        weight_bytes: parameters x weight dtype bytes.
        kv_bytes: ``budget_bytes - weight_bytes``, or 0 when the weights do not fit.
        num_tokens: whole tokens of KV that fit in ``kv_bytes``.
        num_blocks: whole blocks that fit in ``kv_bytes``.
        num_max_len_sequences: sequences of the model's full context length that fit at once.

    Activations, CUDA graphs and the allocator's own overhead are ignored, so real servers fit
    somewhat less (vLLM measures them with a profiling run before sizing its block pool).
    """

    budget_bytes: int
    weight_bytes: int
    kv_bytes: int
    num_tokens: int
    num_blocks: int
    num_max_len_sequences: int

    @property
    def weights_fit(self) -> bool:
        return self.weight_bytes <= self.budget_bytes


def fit_in_budget(
    shape: ModelShape, layout: KvLayout, budget_bytes: int, weight_dtype: DType | None = None
) -> BudgetFit:
    """Tokens and blocks of ``layout`` that fit in ``budget_bytes`` after ``shape``'s weights.

    Raises:
        ValueError: ``budget_bytes`` is negative.
    """
    if budget_bytes < 0:
        raise ValueError(f"budget_bytes must be >= 0, got {budget_bytes}")
    weight_bytes = ParameterCounts.of(shape).total * (weight_dtype or shape.dtype).num_bytes
    kv_bytes = max(0, budget_bytes - weight_bytes)
    num_tokens = kv_bytes // layout.bytes_per_token
    return BudgetFit(
        budget_bytes=budget_bytes,
        weight_bytes=weight_bytes,
        kv_bytes=kv_bytes,
        num_tokens=num_tokens,
        num_blocks=kv_bytes // layout.bytes_per_block,
        num_max_len_sequences=num_tokens // shape.max_position_embeddings,
    )


_BYTE_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "k": 2**10,
    "m": 2**20,
    "g": 2**30,
    "t": 2**40,  # bare letters are binary, as in `free -h`
}
_BYTES_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)


def parse_bytes(text: str) -> int:
    """A byte size as people write it -> whole bytes.

    Accepts a number (``"1e9"``, ``"1048576"``) with an optional unit: binary ``KiB MiB GiB TiB``
    (and bare ``K M G T``, also binary), decimal ``KB MB GB TB``, case-insensitive. Fractions are
    fine as long as the result is a whole number of bytes (``"1.5GiB"``).

    Raises:
        InputError: not a size, a negative or fractional byte count, or an unknown unit.
    """
    match = _BYTES_PATTERN.match(str(text))
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _BYTE_UNITS:
        raise InputError(
            f"{text!r} is not a byte size: write a number with an optional unit "
            "(KiB, MiB, GiB, TiB or KB, MB, GB, TB), e.g. 2GiB or 1e9"
        )
    value = float(match.group(1)) * _BYTE_UNITS[unit]
    if not math.isfinite(value) or value != int(value):
        raise InputError(f"{text!r} is not a whole number of bytes")
    return int(value)


def format_bytes(num_bytes: float) -> str:
    """``131072 -> "128 KiB"``, ``262144000 -> "250 MiB"``: binary units, about 3 significant digits."""
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1000 or unit == "TiB":  # 1,000-1,023 MiB reads better as 0.98 GiB
            break
        value /= 1024
    if unit == "B" or value == int(value):
        return f"{int(value):,} {unit}"
    digits = 0 if abs(value) >= 100 else 1 if abs(value) >= 10 else 2
    return f"{value:.{digits}f} {unit}"
