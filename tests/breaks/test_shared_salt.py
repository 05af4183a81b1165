"""``kvbench break shared-salt``: salted tenants never share blocks; the test statistic is sound."""

import itertools

import numpy as np
import pytest

from kvbench.breaks.shared_salt import (
    CORRECT, PRIVATE, WRONG, SharedSaltConfig, mann_whitney_less, run_shared_salt, shared_salt_table, trial_requests,
)
from kvbench.breaks.common import token_run_requests


def exact_p(first, second):
    """P(U <= u) by enumerating every split of the pooled sample (no ties)."""
    pooled = list(first) + list(second)
    u_of = lambda x: sum(a > b for a in x for b in pooled if b not in x)  # noqa: E731
    observed = u_of(first)
    splits = list(itertools.combinations(pooled, len(first)))
    return sum(u_of(split) <= observed for split in splits) / len(splits)


def test_mann_whitney_matches_the_exact_test_roughly():
    rng = np.random.default_rng(0)
    first, second = rng.normal(0, 1, 6), rng.normal(1, 1, 7)
    u, p = mann_whitney_less(first, second)
    assert u == sum(a > b for a in first for b in second)
    assert p == pytest.approx(exact_p(first, second), abs=0.03)
    assert mann_whitney_less([1, 2, 3], [4, 5, 6])[1] < 0.05 < mann_whitney_less([4, 5, 6], [1, 2, 3])[1]
    assert mann_whitney_less([1, 1], [1, 1]) == (2.0, 1.0)  # all ties: no evidence
    with pytest.raises(ValueError):
        mann_whitney_less([], [1.0])


def test_trials_alternate_owner_then_both_guesses():
    prompts = token_run_requests([np.arange(i, i + 20) for i in range(6)], max_tokens=1)
    requests, steps = trial_requests(prompts, 3, ("sa", "sb"), seed=0)
    assert [s.probe for s in steps[0::3]] == [PRIVATE] * 3
    assert all({steps[i].probe, steps[i + 1].probe} == {CORRECT, WRONG} for i in range(1, 9, 3))
    for request, step in zip(requests, steps):
        assert request.salt == ("sa" if step.tenant == "a" else "sb")
        source = step.trial + (3 if step.probe == WRONG else 0)
        assert np.array_equal(request.token_ids, prompts[source].token_ids)


def test_salted_tenants_never_share_blocks(small_model, tokenizer):
    result = run_shared_salt(small_model, SharedSaltConfig(num_trials=4, prompt_tokens=32), tokenizer)
    salted, unsalted = (next(run for run in result.runs if run.variant == v) for v in ("salted", "unsalted"))
    assert all(row["cached_prompt_tokens"] == 0 for row in salted.rows)
    correct = [row for row in unsalted.rows if row["probe"] == CORRECT]
    wrong = [row for row in unsalted.rows if row["probe"] == WRONG]
    assert all(row["cached_prompt_tokens"] >= 32 for row in correct)  # A's blocks, hit by B
    assert all(row["cached_prompt_tokens"] == 0 for row in wrong)
    assert "verdict" in str(shared_salt_table(result).caption)


def test_config_is_validated():
    with pytest.raises(ValueError, match="alpha"):
        SharedSaltConfig(alpha=1.5)
