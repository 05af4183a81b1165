"""The CI gate: ``--assert 'KEY OP NUMBER'`` over a run's summary, and ``--max-error-rate``.

An assertion names any numeric key of the result JSON (:func:`kvbench.results.result_json.result_dict`:
vLLM's keys such as ``median_ttft_ms`` or ``failed``, kvbench's such as ``token_hit_rate``, and
``error_rate``; ``hit_rate`` is short for ``token_hit_rate``), one of ``>= <= == != > <``, and a
number. A key that was not measured (``None``: no successful request, no ``/metrics``) fails its
assertion. Keys are checked before the run, so a typo exits 2 before anything is sent.

Exit codes of ``kvbench run`` (and every command): 0 ok; 1 requests failed (any, or more than
``--max-error-rate`` of them); 2 bad input; 3 an assertion failed (checked first: a failed
assertion exits 3 even when requests failed too); 130 interrupted.
"""

from __future__ import annotations

import difflib
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from kvbench.results.result_json import SERVER_RATES
from kvbench.results.summary import SummaryOptions, summarize

EXIT_ASSERTION_FAILED = 3
OPERATORS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
    ">": operator.gt,
    "<": operator.lt,
}
ALIASES = {"hit_rate": "token_hit_rate"}
_PATTERN = re.compile(r"^\s*([A-Za-z_][\w.]*)\s*(>=|<=|==|!=|>|<)\s*(\S+)\s*$")


def gate_keys(options: SummaryOptions | None = None) -> frozenset[str]:
    """Every key an assertion may name for a run summarized with ``options``."""
    summary_keys = summarize([], options).as_dict().keys()
    return frozenset((*summary_keys, *SERVER_RATES, "error_rate", *ALIASES))


@dataclass(frozen=True)
class Assertion:
    """``key op threshold``, parsed from ``text`` (what the user typed)."""

    text: str
    key: str
    op: str
    threshold: float

    @classmethod
    def parse(cls, text: str, known_keys: frozenset[str]) -> Assertion:
        """Raises ``ValueError`` (naming ``--assert``) for bad syntax or an unknown key."""
        match = _PATTERN.match(text)
        if match is None:
            raise ValueError(
                f"--assert {text!r}: write KEY OP NUMBER, e.g. 'median_ttft_ms<=250' (OP: >= <= == != > <)"
            )
        key, op, number = match.groups()
        if key not in known_keys:
            close = difflib.get_close_matches(key, sorted(known_keys), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else "; see the keys --save-result writes"
            raise ValueError(f"--assert {text!r}: unknown key {key!r}{hint}")
        try:
            threshold = float(number)
        except ValueError:
            raise ValueError(f"--assert {text!r}: {number!r} is not a number") from None
        return cls(text.strip(), ALIASES.get(key, key), op, threshold)


@dataclass(frozen=True)
class Check:
    """One assertion against a run: the value found (``None`` = not measured) and the verdict."""

    assertion: Assertion
    value: float | None

    @property
    def passed(self) -> bool:
        return self.value is not None and OPERATORS[self.assertion.op](self.value, self.assertion.threshold)


@dataclass(frozen=True)
class GateConfig:
    """``--assert`` and ``--max-error-rate``. Raises ``ValueError`` naming the flag."""

    assertions: tuple[Assertion, ...] = ()
    max_error_rate: float | None = None  # failed / all requests; None = any failure exits 1

    def __post_init__(self) -> None:
        if self.max_error_rate is not None and not 0 <= self.max_error_rate <= 1:
            raise ValueError(f"--max-error-rate: {self.max_error_rate} must lie in 0..1")

    @classmethod
    def from_flags(
        cls,
        asserts: Sequence[str] | None,
        max_error_rate: float | None,
        options: SummaryOptions | None = None,
    ) -> GateConfig:
        keys = gate_keys(options)
        return cls(tuple(Assertion.parse(text, keys) for text in asserts or ()), max_error_rate)

    def check(self, values: Mapping[str, object]) -> list[Check]:
        """Every assertion against ``values`` (the result JSON's keys)."""
        checks = []
        for assertion in self.assertions:
            value = values.get(assertion.key)
            checks.append(Check(assertion, float(value) if isinstance(value, (int, float)) else None))
        return checks

    def errors_fail(self, num_failed: int, num_rows: int) -> bool:
        """Whether failed requests make the run fail (exit 1)."""
        if not num_failed:
            return False
        return self.max_error_rate is None or num_failed / num_rows > self.max_error_rate
