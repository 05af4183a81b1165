import pytest

from kvbench.engine.model import default_llama_config, random_model
from kvbench.workloads.tokenizer import load_tokenizer


@pytest.fixture(scope="session")
def small_model():
    """A 2-layer random Llama with cl100k's vocabulary (so text workloads fit) and the default
    model's head layout (2 KV heads of 64): 2 KiB of fp32 KV per token, 32 KiB per 16-token block.

    Weights drawn with std 0.1 instead of 0.02: at 0.02 two random layers barely move the residual
    stream, greedy decoding mostly echoes the input token, and a wrong past (tiny-hash) rarely
    changes the output."""
    return random_model(
        default_llama_config(
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=2,
            initializer_range=0.1,
        ),
        seed=1,
    )


@pytest.fixture(scope="session")
def tokenizer():
    return load_tokenizer()
