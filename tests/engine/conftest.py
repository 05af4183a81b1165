"""Fixtures shared by the engine tests (tests/engine and tests/engine/paged)."""

import pytest

from kvbench.engine.model import default_llama_config, random_model


@pytest.fixture(scope="session")
def loaded():
    """A small random Llama with the default model's head layout (2 KV heads of 64) and a 1,000-id
    vocabulary (2 layers): the mechanics, fast on 2 cores. One per session: no test changes its weights."""
    return random_model(
        default_llama_config(
            vocab_size=1000,
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=2,
            bos_token_id=1,
            eos_token_id=2,
            max_position_embeddings=1024,
        ),
        seed=1,
    )
