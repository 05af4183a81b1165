"""The input rules both engines apply before a request touches the model or a block."""

from __future__ import annotations

from kvbench.engine.model import LoadedModel
from kvbench.engine.sampling import SamplingParams
from kvbench.errors import InputError


def check_attention_only(loaded: LoadedModel) -> None:
    """Raise ``InputError`` for models with non-attention layers (their state is not per-token KV)."""
    layer_types = getattr(loaded.model.config.get_text_config(), "layer_types", None) or ()
    other = sorted(set(layer_types) - {"full_attention", "sliding_attention"})
    if other:
        raise InputError(f"{loaded.name}: layers of type {', '.join(other)} are not supported by the engine")


def check_request(loaded: LoadedModel, ids: list[int], sampling: SamplingParams) -> str | None:
    """Why ``loaded`` cannot run ``ids`` with ``sampling`` (empty prompt, an id outside the vocabulary,
    prompt + ``max_tokens`` beyond the context), or ``None``. Both engines refuse with this message."""
    if not ids:
        return "empty prompt"
    vocab_size = loaded.vocab_size
    if min(ids) < 0 or max(ids) >= vocab_size:
        return f"token id outside the model's vocabulary of {vocab_size} ids"
    limit = loaded.max_context_tokens
    if limit is not None and len(ids) + sampling.max_tokens > limit:
        return (
            f"prompt ({len(ids)} tokens) + max_tokens ({sampling.max_tokens}) exceeds the "
            f"model's context of {limit} tokens"
        )
    return None
