"""The model the in-process engine runs: kvbench's default random Llama, or a local checkpoint.

Default model (no ``--model``): a Llama-architecture ``LlamaForCausalLM`` built from
:func:`default_llama_config` with seeded random weights, fp32, on the CPU. It needs no download and
builds in about two seconds. Its vocabulary is cl100k_base's (100,277 ids, ``tiktoken``'s
``n_vocab``), so the tokenizer the workloads use produces valid ids. Weights are random, so text is
gibberish, but outputs are deterministic given the seed: greedy cache-on and cache-off outputs must
be token-identical, and any difference is a cache bug.

KV bytes per token (``2 x layers x kv_heads x head_dim x dtype bytes``; :meth:`LoadedModel.kv_layout`
gives a :class:`kvbench.memory.layout.KvLayout`):

* default model, fp32: 2 x 8 x 2 x 64 x 4 = 8,192 B (8 KiB); a 16-token block is 128 KiB.
* Llama 3.1 8B, bf16: 2 x 32 x 8 x 128 x 2 = 131,072 B (128 KiB), 16x the default model.

``--model PATH`` loads a local Hugging Face checkpoint directory (``local_files_only``) together with
its tokenizer and chat template, on ``--device`` in ``--dtype``. Every failure the user can fix (no
such directory, not a checkpoint, no tokenizer, a device this machine lacks) raises
:class:`kvbench.errors.InputError` with one line.

engine/ is the only folder that imports torch and transformers.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedModel

from kvbench.engine.cpu_kernels import (
    keep_freed_memory,
    use_few_row_linears,
    use_native_gqa,
    use_small_batch_lm_head,
)
from kvbench.engine.one_query import use_cpu_attention
from kvbench.errors import InputError
from kvbench.memory.layout import DType, KvLayout, parse_dtype

try:  # transformers >= 5
    from transformers.initialization import no_init_weights
except ImportError:  # transformers 4.x
    from transformers.modeling_utils import no_init_weights

CL100K_VOCAB_SIZE = 100_277  # tiktoken.get_encoding("cl100k_base").n_vocab, special tokens included
CL100K_ENDOFTEXT_ID = 100_257  # "<|endoftext|>" in cl100k_base: the default model's EOS
DEFAULT_MODEL_SEED = 0
DEFAULT_MAX_CONTEXT_TOKENS = 8192  # Llama 3's original context; leaves room for 2k-token prompts + turns
_TORCH_DTYPES = {DType.FP32: torch.float32, DType.BF16: torch.bfloat16, DType.FP16: torch.float16}


def torch_dtype(dtype: DType) -> torch.dtype:
    """The torch dtype of a weight dtype. Raises ``InputError`` for one torch cannot compute in (fp8)."""
    if dtype not in _TORCH_DTYPES:
        raise InputError(f"--dtype {dtype.value}: the engine runs in float32, bfloat16 or float16")
    return _TORCH_DTYPES[dtype]


@dataclass(frozen=True)
class ModelConfig:
    """Which model to load and where.

    Attributes:
        path: a local Hugging Face checkpoint directory, or ``None`` for the default random model.
        device: ``cpu``, ``cuda``, ``cuda:N`` or ``mps``; whether it exists is checked at load time.
        dtype: weight (and so KV) dtype; any spelling ``memory.parse_dtype`` accepts (``float32``,
            ``bf16``, ...), stored as :class:`kvbench.memory.layout.DType`. fp8 is refused.
        seed: seeds the default model's weights (ignored with ``path``).
    """

    path: Path | None = None
    device: str = "cpu"
    dtype: DType | str = DType.FP32  # fp32 keeps cache-on and cache-off greedy outputs identical
    seed: int = DEFAULT_MODEL_SEED

    def __post_init__(self) -> None:
        if self.path is not None:
            object.__setattr__(self, "path", Path(self.path).expanduser())
        dtype = self.dtype if isinstance(self.dtype, DType) else parse_dtype(self.dtype)
        torch_dtype(dtype)  # refuses fp8
        object.__setattr__(self, "dtype", dtype)
        kind, _, index = self.device.partition(":")
        if kind not in ("cpu", "cuda", "mps") or (index and (kind != "cuda" or not index.isdigit())):
            raise ValueError(f"device must be cpu, cuda, cuda:N or mps, got {self.device!r}")


@dataclass(frozen=True, eq=False)
class LoadedModel:
    """A model ready for the engine.

    Attributes:
        model: the causal LM, in eval mode, on ``device``.
        tokenizer: the checkpoint's tokenizer (with its chat template), or ``None`` for the default
            model, whose tokenizer is cl100k_base through tiktoken (built by the workloads).
        name: a label for results (the directory name, or the default model's name and seed).
        vocab_size: ids the engine accepts are ``0 .. vocab_size - 1``.
        max_context_tokens: prompt + output tokens may not exceed this (``max_position_embeddings``);
            ``None`` when the config states no limit.
        eos_token_ids: ids that end a response unless the request ignores EOS.
    """

    model: PreTrainedModel
    tokenizer: Any | None
    name: str
    vocab_size: int
    max_context_tokens: int | None
    eos_token_ids: tuple[int, ...]

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    def kv_layout(self, block_size: int = 16) -> KvLayout:
        """KV bytes per token and per block of this model in its dtype (see :mod:`memory`)."""
        text = self.model.config.get_text_config()
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        num_kv_heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
        kv_dtype = parse_dtype(str(self.dtype).removeprefix("torch."))
        return KvLayout(text.num_hidden_layers, num_kv_heads, head_dim, kv_dtype, block_size)

    @property
    def chat_template(self) -> str | None:
        return getattr(self.tokenizer, "chat_template", None) if self.tokenizer is not None else None


def default_llama_config(**overrides: Any) -> LlamaConfig:
    """The default model's config; ``overrides`` replace fields (tests scale it down).

    8 layers, hidden 512, 8 query heads, 2 KV heads (GQA 4:1), head_dim 64, intermediate 1408,
    tied embeddings, cl100k's vocabulary, Llama 3's RoPE theta (500,000) and an 8,192-token context.
    """
    fields: dict[str, Any] = dict(
        vocab_size=CL100K_VOCAB_SIZE,
        hidden_size=512,
        intermediate_size=1408,  # ~2.75 x hidden, Llama's SwiGLU ratio
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=DEFAULT_MAX_CONTEXT_TOKENS,
        rope_parameters={"rope_type": "default", "rope_theta": 500_000.0},  # Llama 3's theta
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=CL100K_ENDOFTEXT_ID,
        eos_token_id=CL100K_ENDOFTEXT_ID,
    )
    fields.update(overrides)
    return LlamaConfig(**fields)


def build_random_model(config: LlamaConfig, seed: int = DEFAULT_MODEL_SEED) -> LlamaForCausalLM:
    """A ``LlamaForCausalLM`` with seeded random weights, fp32, CPU, eval mode.

    Skips transformers' default initialisation (which initialises every matrix twice and takes
    ~3 s for the default model) and fills each parameter once from a private ``torch.Generator``:
    N(0, ``initializer_range``) for matrices, 1 for norm weights. The global RNG is untouched and the
    weights depend only on ``config`` and ``seed``.
    """
    with no_init_weights():
        # a copy: the engines set the model's attention in its config
        model = LlamaForCausalLM(copy.deepcopy(config))
    model.tie_weights()  # no_init_weights skips init_weights, which is what ties lm_head
    generator = torch.Generator().manual_seed(seed)
    std = config.initializer_range
    with torch.no_grad():
        for name, parameter in model.named_parameters():  # a tied weight is listed once
            if name.endswith("norm.weight"):
                parameter.fill_(1.0)
            elif name.endswith("bias"):
                parameter.zero_()
            else:
                parameter.normal_(0.0, std, generator=generator)
    return model.eval()


def resolve_device(device: str) -> torch.device:
    """``torch.device`` for a ``ModelConfig.device`` string. Raises ``InputError`` if it is absent."""
    kind, _, index = device.partition(":")
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise InputError(f"--device {device}: no CUDA device is available on this machine")
        if index and int(index) >= torch.cuda.device_count():
            raise InputError(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA devices")
    elif kind == "mps" and not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
        raise InputError(f"--device {device}: no Apple MPS device is available on this machine")
    return torch.device(device)


def load_model(config: ModelConfig = ModelConfig()) -> LoadedModel:
    """Load the model ``config`` names: the default random model, or a local checkpoint.

    Raises:
        InputError: the device does not exist; ``config.path`` is missing, is not a checkpoint
            directory (no ``config.json`` or no weights), or has no tokenizer.
    """
    device = resolve_device(config.device)
    if config.path is None:
        return random_model(default_llama_config(), config.seed, device, config.dtype)
    model, tokenizer = _load_checkpoint(config.path, torch_dtype(config.dtype))
    return _loaded(model.to(device=device, dtype=torch_dtype(config.dtype)), tokenizer, config.path.name)


def random_model(
    llama_config: LlamaConfig,
    seed: int = DEFAULT_MODEL_SEED,
    device: str | torch.device = "cpu",
    dtype: DType = DType.FP32,
) -> LoadedModel:
    """:func:`build_random_model` ready for the engine, named like ``random-llama-8L-512h-seed0``.

    ``load_model`` uses it for the default model; tests and benchmarks pass scaled configs.
    """
    model = build_random_model(llama_config, seed).to(device=device, dtype=torch_dtype(dtype))
    name = f"random-llama-{llama_config.num_hidden_layers}L-{llama_config.hidden_size}h-seed{seed}"
    return _loaded(model, None, name)


def _loaded(model: PreTrainedModel, tokenizer: Any | None, name: str) -> LoadedModel:
    keep_freed_memory()  # the CPU fixes of engine/cpu_kernels.py; none changes a one-row forward
    if not use_few_row_linears(model):
        use_small_batch_lm_head(model)
    use_native_gqa(model.device)
    use_cpu_attention(model)  # one query token's attention through kvbench's kernel (engine/one_query.py)
    text = model.config.get_text_config()
    return LoadedModel(
        model=model.eval().requires_grad_(False),
        tokenizer=tokenizer,
        name=name,
        vocab_size=text.vocab_size,
        max_context_tokens=getattr(text, "max_position_embeddings", None),
        eos_token_ids=_eos_token_ids(model, tokenizer),
    )


def _load_checkpoint(path: Path, dtype: torch.dtype) -> tuple[PreTrainedModel, Any]:
    """Model and tokenizer from a local directory; every fixable failure is one ``InputError`` line."""
    if not path.exists():
        raise InputError(f"--model {path}: no such directory")
    if not path.is_dir() or not (path / "config.json").is_file():
        raise InputError(f"--model {path}: not a Hugging Face checkpoint directory (no config.json)")
    try:
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=dtype)
    except (OSError, ValueError, KeyError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(f"--model {path}: cannot load the model: {reason}") from exc
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(f"--model {path}: cannot load its tokenizer (no tokenizer files?)") from exc
    return model, tokenizer


def _eos_token_ids(model: PreTrainedModel, tokenizer: Any | None) -> tuple[int, ...]:
    """EOS ids from the generation config, the model config and the tokenizer, deduplicated."""
    found: list[int] = []
    sources = (getattr(model, "generation_config", None), model.config, tokenizer)
    for source in sources:
        value = getattr(source, "eos_token_id", None) if source is not None else None
        for token_id in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(token_id, int) and token_id not in found:
                found.append(token_id)
    return tuple(found)
