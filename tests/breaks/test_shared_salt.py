"""``kvbench break shared-salt``: salted tenants never share blocks; the test statistic is sound."""

import itertools

import numpy as np
import pytest

from kvbench.breaks.common import BreakRow, token_run_requests
from kvbench.breaks.shared_salt import (
    CORRECT,
    PRIVATE,
    WRONG,
    SharedSaltConfig,
    mann_whitney_less,
    run_shared_salt,
    shared_salt_table,
    trial_requests,
)
from kvbench.commands.break_tables import verdict_table
from kvbench.results.rows import ResultRow


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
    assert all(row.result.cached_prompt_tokens == 0 for row in salted.rows)
    correct = [row for row in unsalted.rows if row.extra["probe"] == CORRECT]
    wrong = [row for row in unsalted.rows if row.extra["probe"] == WRONG]
    assert all(row.result.cached_prompt_tokens >= 32 for row in correct)  # A's blocks, hit by B
    assert all(row.result.cached_prompt_tokens == 0 for row in wrong)
    assert "verdict" in str(verdict_table(shared_salt_table(result)).caption)


def test_config_is_validated():
    with pytest.raises(ValueError, match="alpha"):
        SharedSaltConfig(alpha=1.5)


def test_what_a_number_of_trials_can_show():
    from statistics import NormalDist

    from kvbench.breaks.rank_test import (
        detectable_effect,
        smallest_p_value,
        trials_for_effect,
        trials_to_reach,
    )

    # complete separation is the smallest p: 3 + 3 TTFTs give 0.040 at best, never below alpha 0.01
    assert (
        smallest_p_value(3, 3)
        == mann_whitney_less([1, 2, 3], [4, 5, 6])[1]
        == pytest.approx(0.0404, abs=1e-4)
    )
    assert smallest_p_value(3, 3) == pytest.approx(exact_p([1, 2, 3], [4, 5, 6]), abs=0.01)  # exact: 1/20
    assert [trials_to_reach(alpha) for alpha in (0.05, 0.01, 0.001)] == [3, 5, 8]
    assert smallest_p_value(4, 4) > 0.01 > smallest_p_value(5, 5)
    # Noether (1987), equal samples: n = (z_{1-alpha} + z_power)^2 / (6 (P - 1/2)^2), by hand for P = 0.7
    z = NormalDist().inv_cdf(0.99) + NormalDist().inv_cdf(0.8)
    assert trials_for_effect(0.7, 0.01) == int(np.ceil(z * z / (6 * 0.2**2))) == 42
    assert trials_for_effect(0.5, 0.01) is None and trials_for_effect(1.0, 0.01) >= trials_to_reach(0.01)
    assert detectable_effect(42, 0.01) <= 0.7 < detectable_effect(41, 0.01)


def fake_result(num_trials, correct_ms, wrong_ms, salted_cached=0):
    """A SharedSaltResult from TTFTs alone (no model): B's correct and wrong guesses per variant."""
    from kvbench.breaks.common import VariantRun
    from kvbench.breaks.shared_salt import SharedSaltResult

    def row(probe, ttft_ms, cached):
        return BreakRow(
            ResultRow(ttft_ms=ttft_ms, cached_prompt_tokens=cached), "shared-salt", "", {"probe": probe}
        )

    def rows(correct, wrong, cached):
        return [row(CORRECT, t, cached) for t in correct] + [row(WRONG, t, 0) for t in wrong]

    return SharedSaltResult(
        SharedSaltConfig(num_trials=num_trials),
        [
            VariantRun("unsalted", rows(correct_ms, wrong_ms, 128)),
            VariantRun("salted", rows(wrong_ms[::-1], wrong_ms, salted_cached)),
        ],
    )


def test_the_verdict_says_what_the_trials_can_and_cannot_show():
    small = fake_result(3, [60.0, 61.0, 62.0], [150.0, 151.0, 152.0])  # every correct guess 2.5x faster
    # as good as 3 trials get
    assert small.test("unsalted").smallest_p_value == small.test("unsalted").p_value
    assert small.leak_text("unsalted") == small.leak_text("salted") == "inconclusive"
    assert (
        "inconclusive: 3 trials cannot reach p < 0.01 whatever the TTFTs (the smallest p of a one-sided "
        "Mann-Whitney U test over 3 + 3 TTFTs is 0.040, every correct guess faster); --trials 5 or more can"
        in small.verdict
    )
    assert "cannot tell" not in small.verdict
    assert (
        "0 cached tokens for B: A's blocks are out of B's reach, nothing leaks through the cache"
        in small.verdict
    )
    big = fake_result(8, [60.0 + i for i in range(8)], [150.0 + i for i in range(8)])
    assert big.leak_text("unsalted") == "yes" and "so B learns whether A sent that prompt" in big.verdict
    mixed = fake_result(8, [60, 200, 61, 201, 62, 202, 63, 203], [100, 101, 102, 103, 104, 105, 106, 107])
    assert mixed.leak_text("unsalted") == "no" and mixed.test("unsalted").prob_correct_faster == 0.5
    assert (
        "not shown at 8 trials, P(correct faster) = 0.50 (no sign that correct guesses are faster"
        in mixed.verdict
    )
    assert (
        "B still got 16 cached tokens of A's"
        in fake_result(3, [1.0] * 3, [2.0] * 3, salted_cached=16).verdict
    )
