"""A live ``kvbench serve`` app on a free loopback port, over a tiny random model (fast to build)."""

import pytest

from kvbench.engine.model import default_llama_config, random_model
from live_server import LiveServer, tiny_service

MODEL = "tiny"


@pytest.fixture(scope="session")
def tiny_loaded():
    """cl100k's vocabulary (the tokenizer's ids must be valid), everything else tiny."""
    return random_model(default_llama_config(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                             num_attention_heads=4, num_key_value_heads=2, head_dim=16))


@pytest.fixture
def service(tiny_loaded):
    """A fresh service (64-block cache) over the tiny model, no HTTP."""
    return tiny_service(tiny_loaded, capacity_blocks=64)


@pytest.fixture(scope="module")
def live(tiny_loaded):
    service = tiny_service(tiny_loaded)
    server = LiveServer(service)
    yield server
    server.stop()
