"""engine/cpu_kernels.py: the kept heap and the LM head over a few rows, on a model whose head qualifies
(the oneDNN head where kvbench's own kernel is off; that kernel is tests/engine/test_native.py's)."""

import pytest
import torch

from kvbench.cache.base import CacheConfig
from kvbench.engine.cpu_kernels import (
    SMALL_BATCH_MIN_WEIGHT_BYTES,
    SMALL_BATCH_ROWS,
    SmallBatchLinear,
    keep_freed_memory,
    onednn_linear_available,
)
from kvbench.engine.model import CL100K_VOCAB_SIZE, default_llama_config, random_model
from kvbench.engine.native import native_kernels, native_kernels_reason
from kvbench.engine.paged.config import PagedConfig
from kvbench.engine.paged.engine import PagedEngine
from kvbench.engine.sampling import SamplingParams

pytestmark = pytest.mark.skipif(not onednn_linear_available(), reason="this torch build has no oneDNN linear")


def _wide():
    """Two small layers under the default model's full cl100k head: 100,277 x 64 fp32 = 25.7 MB."""
    return random_model(
        default_llama_config(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=2,
            head_dim=32,
            max_position_embeddings=512,
        ),
        seed=3,
    )


@pytest.fixture(scope="module")
def wide():
    """:func:`_wide` loaded with kvbench's few-row kernel off: its head is the oneDNN fallback."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KVBENCH_NATIVE_KERNELS", "0")
        return _wide()


@pytest.fixture(scope="module", params=["onednn", "kvbench"])
def either(request, wide):
    """The wide model with either few-row path: the oneDNN head, or kvbench's kernel for every linear."""
    if request.param == "onednn":
        return wide
    if native_kernels() is None:
        pytest.skip(f"no few-row kernel here: {native_kernels_reason()}")
    return _wide()


def test_the_default_sized_head_becomes_a_small_batch_linear_and_keeps_its_weight_and_keys(wide):
    head = wide.model.get_output_embeddings()
    assert head.weight.numel() * 4 > SMALL_BATCH_MIN_WEIGHT_BYTES
    assert type(head) is SmallBatchLinear
    assert head.weight is wide.model.get_input_embeddings().weight  # still tied
    assert "lm_head.weight" in wide.model.state_dict()


def test_a_small_head_stays_a_plain_linear(monkeypatch):
    monkeypatch.setenv("KVBENCH_NATIVE_KERNELS", "0")
    small = random_model(
        default_llama_config(
            vocab_size=1000,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=1,
            num_attention_heads=2,
            head_dim=32,
        ),
        seed=1,
    )
    assert type(small.model.get_output_embeddings()) is torch.nn.Linear


@pytest.mark.parametrize("num_rows", [1, 2, 3, 8, 48, 49, 64])
def test_every_row_count_gives_the_plain_linear_s_values_and_one_or_two_rows_its_bits(wide, num_rows):
    head = wide.model.get_output_embeddings()
    x = torch.randn(1, num_rows, head.in_features, generator=torch.Generator().manual_seed(num_rows))
    with torch.inference_mode():
        got, plain = head(x), torch.nn.functional.linear(x, head.weight)
    assert got.shape == (1, num_rows, CL100K_VOCAB_SIZE)
    if num_rows in SMALL_BATCH_ROWS:
        torch.testing.assert_close(got, plain, rtol=1e-4, atol=1e-4)
    else:
        assert torch.equal(got, plain)  # MKL, as before: the copy engine's one-row forwards are unchanged


def test_a_batched_decode_on_the_paged_engine_still_matches_the_cache_off_reference(either):
    engine = PagedEngine(either, PagedConfig(CacheConfig(capacity_blocks=256, block_size=16), verify=True))
    prompts = [[(7 * i + 11 * j) % 5000 + 10 for j in range(40 + 5 * i)] for i in range(6)]
    futures = [engine.submit(p, SamplingParams(max_tokens=8, ignore_eos=True)) for p in prompts]
    records = [f.result(timeout=300) for f in futures]
    engine.wait_idle(60)
    assert [r.output_tokens for r in records] == [8] * 6
    assert all(r.output_matches_reference for r in records)
    totals = engine.verify_report.totals
    assert totals.num_compared_tokens == 6 * 8 and totals.num_mismatches == 0


def test_keeping_freed_memory_is_accepted_by_glibc_and_idempotent():
    import sys

    if not sys.platform.startswith("linux"):
        pytest.skip("mallopt is glibc's")
    assert keep_freed_memory() is True
    assert keep_freed_memory() is True


@pytest.mark.parametrize("num_query, num_context", [(66, 2050), (300, 300), (1, 700), (349, 700)])
def test_grouped_heads_read_in_place_give_the_repeated_heads_bits(monkeypatch, num_query, num_context):
    from types import SimpleNamespace

    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from kvbench.engine.paged.attention import causal_mask

    generator = torch.Generator().manual_seed(num_query)
    query = torch.randn(1, 8, num_query, 64, generator=generator)
    key, value = (torch.randn(1, 2, num_context, 64, generator=generator) for _ in range(2))
    mask = causal_mask(num_query, num_context, torch.device("cpu"))
    # the default model's 8 query / 2 KV heads
    module = SimpleNamespace(num_key_value_groups=4, is_causal=True)
    outputs = {}
    for setting in ("0", "1"):
        monkeypatch.setenv("TRANSFORMERS_SDPA_FORCE_GQA", setting)
        outputs[setting], _ = sdpa_attention_forward(module, query, key, value, mask)
    assert torch.equal(outputs["0"], outputs["1"])


@pytest.mark.parametrize("num_query, num_context", [(66, 2050), (7, 40), (300, 301)])
def test_an_additive_mask_gives_the_bool_mask_s_bits(num_query, num_context):
    from kvbench.engine.paged.attention import causal_mask

    generator = torch.Generator().manual_seed(num_context)
    query = torch.randn(1, 8, num_query, 64, generator=generator)
    key, value = (torch.randn(1, 2, num_context, 64, generator=generator) for _ in range(2))
    masks = [
        causal_mask(num_query, num_context, torch.device("cpu"), additive)
        for additive in (None, torch.float32)
    ]
    assert masks[0].dtype == torch.bool and masks[1].dtype == torch.float32
    assert torch.equal(masks[1] == 0, masks[0]) and masks[1].min() == float("-inf")
    outputs = [
        torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=m, enable_gqa=True)
        for m in masks
    ]
    assert torch.equal(*outputs)


def test_a_cpu_model_turns_grouped_heads_in_place_on_unless_the_user_chose(monkeypatch):
    from kvbench.engine.cpu_kernels import GQA_VARIABLE, use_native_gqa

    monkeypatch.delenv(GQA_VARIABLE, raising=False)
    assert use_native_gqa(torch.device("cpu")) is True
    monkeypatch.setenv(GQA_VARIABLE, "0")
    assert use_native_gqa(torch.device("cpu")) is False  # the user's setting wins
