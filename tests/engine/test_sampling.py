"""engine/sampling.py: the greedy token is torch.argmax's answer on every kind of input."""

import pytest
import torch

from kvbench.engine.sampling import SamplingParams, greedy_token, sample_next_token


@pytest.mark.parametrize("case", ["random", "ties", "nan", "all_minus_inf", "strided", "bf16", "one"])
def test_the_greedy_token_is_torch_s_argmax(case):
    logits = torch.randn(100277, generator=torch.Generator().manual_seed(0))
    if case == "ties":
        logits[[17, 4000, 99999]] = 50.0  # the first maximum wins
    elif case == "nan":
        logits[[300, 20]] = float("nan")  # a NaN counts as the maximum: the first one
    elif case == "all_minus_inf":
        logits = torch.full((1000,), float("-inf"))
    elif case == "strided":
        logits = torch.randn(2, 5000, generator=torch.Generator().manual_seed(1)).T[:, 1]  # stride 2
    elif case == "bf16":
        logits = logits.to(torch.bfloat16)
    elif case == "one":
        logits = torch.tensor([3.0])
    with torch.inference_mode():
        assert greedy_token(logits) == int(torch.argmax(logits))
        assert sample_next_token(logits, SamplingParams(temperature=0), None) == int(torch.argmax(logits))
