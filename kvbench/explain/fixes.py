"""``kvbench explain``'s fix list: for each loss, the change that recovers it, measured by replaying it.

Each fix is applied to the traffic (:mod:`kvbench.explain.rewrite`) or to the cache settings and
replayed through the explain replay (:func:`kvbench.explain.api.replay_requests`, the one replay of
:mod:`kvbench.sim.replay`); its gain is the token hit rate after minus before, in points (cached /
prompt tokens, each of its own trace). Kinds, by the waterfall bar or the cause that calls for them:

=================  ==========================================================================
kind               change (and its cost)
=================  ==========================================================================
capacity           the smallest cache reaching 99% of the ideal (:mod:`kvbench.explain.capacity`)
volatile value     the volatile lines moved after the stable part (or removed), re-rendered
JSON key order     tool-call JSON with sorted keys; ``reasoning stripped``: reasoning resent;
                   ``text re-rendered``: one renderer; ``re-tokenized``: the ids resent
salt               one namespace for all tenants (cost: tenants share cached prefixes)
block size         smaller blocks for the block-floor loss (cost: more block-table entries)
ttl                no TTL (cost: idle blocks stay until capacity evicts them)
provider minimum   the minimum not applied (cost: pad short prompts to it)
last token         no setting recovers it (vLLM, SGLang always recompute the last prompt token)
routing            across ``num_replicas`` replicas, the :mod:`kvbench.route` policy that hits most
                   (vs round robin), with its load imbalance
=================  ==========================================================================

Fixes are ranked by gain. TTFT p50 is an estimate from a fit ``TTFT p50 = a + b x (1 - hit rate)``
(:func:`kvbench.results.sweep.fit_ttft_vs_miss_rate`) of the user's run or sweep; the bill prices
each replay's hits as reads with :func:`kvbench.bill.invoice.make_bill` (writes at the input price).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvbench.bill.invoice import make_bill
from kvbench.bill.rules import CacheRules
from kvbench.bill.simulate import Usage
from kvbench.cache.base import CacheConfig
from kvbench.explain.api import Explanation, Replayed, replay_requests
from kvbench.explain.ran import RunRules
from kvbench.memory.layout import ModelShape
from kvbench.request import Request
from kvbench.results.sweep import Fit
from kvbench.sim.outputs import output_length


@dataclass(frozen=True)
class FixOptions:
    """What the fixes are priced and sized with.

    Attributes:
        model_shapes: the shapes the capacity fix gives bytes for (the run's model first).
        fit: TTFT p50 against the miss rate (``None``: no TTFT column).
        rules: a provider's prices for the bill columns (``None``: no bill).
        num_replicas: > 1 adds the routing fix.
    """

    model_shapes: tuple[ModelShape, ...] = ()
    fit: Fit | None = None
    rules: CacheRules | None = None
    num_replicas: int = 1


@dataclass(frozen=True)
class FixContext:
    """What every fix is measured against: the explained requests (arrival order), their cache, the
    baseline (the replay, or the run's reported hits where the rules take them) and the explanation;
    every change is replayed by the rules of what ran (``explanation.rules``)."""

    requests: list[Request]
    config: CacheConfig
    tokenizer: object | None
    min_cacheable_tokens: int | None
    base: Replayed
    explanation: Explanation
    options: FixOptions

    def replay(
        self,
        requests: Sequence[Request] | None = None,
        config: CacheConfig | None = None,
        without_minimum: bool = False,
    ) -> Replayed:
        """The explain replay of ``requests`` (default: the explained ones) through ``config`` (default:
        theirs), with the provider minimum unless ``without_minimum``."""
        minimum = None if without_minimum else self.min_cacheable_tokens
        requests = list(requests or self.requests)
        return replay_requests(requests, config or self.config, None, minimum, self.rules)

    @property
    def rules(self) -> RunRules:
        return self.explanation.rules


@dataclass(frozen=True)
class Measured:
    """One change as replayed: ``after`` (and ``before`` when the baseline is not the explain
    replay's, e.g. round robin across replicas): the requests and their hit tokens."""

    kind: str
    change: str
    cost: str
    after: tuple[Sequence[Request], np.ndarray] | None
    before: tuple[Sequence[Request], np.ndarray] | None = None
    setting: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Fix:
    """A change and what it buys. Rates are token hit rates (0..1); ``num_saved_tokens``: prompt
    tokens no longer prefilled; ``ttft_p50_change_ms``: the fit's estimate; bills in USD."""

    kind: str
    change: str
    cost: str
    hit_rate_before: float
    hit_rate_after: float
    num_saved_tokens: int
    setting: dict[str, Any] = field(default_factory=dict)
    ttft_p50_change_ms: float | None = None
    bill_before_usd: float | None = None
    bill_after_usd: float | None = None

    @property
    def gain_points(self) -> float:
        """Hit rate after minus before, in percentage points."""
        return 100.0 * (self.hit_rate_after - self.hit_rate_before)

    def line(self, rank: int) -> str:
        """``1. raise the cache to >= 1,056 blocks (...): +97.2 points (...)`` and the rest."""
        text = (
            f"{rank}. {self.change}: {self.gain_points:+.1f} points (hit rate {self.hit_rate_before:.1%} -> "
            f"{self.hit_rate_after:.1%}), {self.num_saved_tokens:,} prompt tokens saved"
        )
        if self.ttft_p50_change_ms is not None:
            text += f", TTFT p50 ~{_seconds(self.ttft_p50_change_ms)} (estimate)"
        if self.bill_before_usd is not None:
            text += f", bill ${self.bill_before_usd:,.4f} -> ${self.bill_after_usd:,.4f}"
        return text + (f"; cost: {self.cost}" if self.cost else "")

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "change": self.change,
            "cost": self.cost,
            "gain_points": self.gain_points,
            "hit_rate_before": self.hit_rate_before,
            "hit_rate_after": self.hit_rate_after,
            "saved_prompt_tokens": self.num_saved_tokens,
            "ttft_p50_change_ms": self.ttft_p50_change_ms,
            "bill_before_usd": self.bill_before_usd,
            "bill_after_usd": self.bill_after_usd,
            "setting": self.setting,
        }


def _seconds(ms: float) -> str:
    return f"{ms / 1e3:+.1f} s" if abs(ms) >= 1000 else f"{ms:+,.0f} ms"


def rate(requests: Sequence[Request], hits: np.ndarray) -> float:
    """Cached prompt tokens / prompt tokens (0 for no tokens)."""
    total = sum(r.num_tokens for r in requests)
    return float(np.sum(hits)) / total if total else 0.0


def bill_usd(requests: Sequence[Request], hits: np.ndarray, rules: CacheRules) -> float:
    """The bill of ``requests`` whose cached tokens are ``hits`` (read at the read price, the rest input)."""
    usages = [Usage(r.num_tokens - int(h), 0, int(h), output_length(r)) for r, h in zip(requests, hits)]
    return make_bill(usages, rules).total_usd


def priced(measured: Measured, ctx: FixContext) -> Fix:
    """A measured change with its rates, saved tokens, TTFT estimate and bill."""
    before = measured.before or (ctx.base.requests, ctx.base.hit_tokens)
    after = measured.after or before
    rate_before, rate_after = rate(*before), rate(*after)
    uncached = [sum(r.num_tokens for r in side[0]) - int(np.sum(side[1])) for side in (before, after)]
    fit, rules = ctx.options.fit, ctx.options.rules
    ttft = None if fit is None else fit.predict_ms(rate_after) - fit.predict_ms(rate_before)
    bills = (None, None) if rules is None else (bill_usd(*before, rules), bill_usd(*after, rules))
    return Fix(
        measured.kind,
        measured.change,
        measured.cost,
        rate_before,
        rate_after,
        uncached[0] - uncached[1],
        measured.setting,
        ttft,
        *bills,
    )


INFORMATIONAL = ("last token",)  # listed with no gain: no setting recovers the loss


def rank(fixes: Sequence[Fix]) -> list[Fix]:
    """Largest gain first (stable), without the changes that gain nothing or lose (smaller blocks
    on a trace whose shared prefixes are whole blocks), except the :data:`INFORMATIONAL` ones."""
    useful = [fix for fix in fixes if fix.gain_points > 1e-9 or fix.kind in INFORMATIONAL]
    return sorted(useful, key=lambda fix: -fix.gain_points)
