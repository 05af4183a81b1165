"""Integer distributions for generator parameters (turns, steps, token counts), written as strings.

Spellings (also accepted as TOML strings; a bare integer means a constant)::

    "6" or 6                   always 6
    "uniform:2,12"             uniform on 2..12, both ends included
    "geometric:6"              geometric on 1, 2, ... with mean 6
    "lognormal:300,0.6"        round(300 * exp(0.6 * z)), z standard normal (median 300)

Samples are drawn from the generator's seeded ``numpy.random.Generator``; values below a caller's
minimum are raised to it (each generator documents its minimums).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_KINDS = {"const": 1, "uniform": 2, "geometric": 1, "lognormal": 2}  # kind -> number of parameters


@dataclass(frozen=True)
class IntDist:
    """A distribution over positive integers; build it with :meth:`parse`.

    Raises:
        ValueError: an unknown kind, a wrong number of parameters, or parameters out of range.
    """

    kind: str
    params: tuple[float, ...]

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ValueError(f"unknown distribution {self.kind!r} (known: {', '.join(_KINDS)})")
        if len(self.params) != _KINDS[self.kind]:
            raise ValueError(f"{self.kind} takes {_KINDS[self.kind]} parameter(s), got {len(self.params)}")
        if self.kind == "uniform" and not 1 <= self.params[0] <= self.params[1]:
            raise ValueError(f"uniform:A,B needs 1 <= A <= B, got {self.spec}")
        if self.kind == "lognormal" and not (self.params[0] >= 1 and self.params[1] >= 0):
            raise ValueError(f"lognormal:MEDIAN,SIGMA needs MEDIAN >= 1 and SIGMA >= 0, got {self.spec}")
        if self.kind in ("const", "geometric") and not self.params[0] >= 1:
            raise ValueError(f"{self.kind} needs a value >= 1, got {self.spec}")
        if self.kind in ("const", "uniform") and any(p != int(p) for p in self.params):
            raise ValueError(f"{self.kind} takes integers, got {self.spec}")

    @classmethod
    def parse(cls, value: str | int | IntDist) -> IntDist:
        """Parse a spelling from the module docstring. Raises ``ValueError`` on a bad one."""
        if isinstance(value, IntDist):
            return value
        if isinstance(value, bool):
            raise ValueError(f"expected a distribution, got {value!r}")
        if isinstance(value, int):
            return cls("const", (float(value),))
        if not isinstance(value, str):
            raise ValueError(f"expected a distribution such as 'uniform:2,12', got {value!r}")
        kind, _, rest = value.strip().partition(":")
        if not rest:
            kind, rest = "const", kind
        try:
            params = tuple(float(p) for p in rest.split(","))
        except ValueError:
            raise ValueError(f"bad distribution {value!r}: parameters must be numbers") from None
        return cls(kind.strip(), params)

    def __str__(self) -> str:
        return self.spec

    @classmethod
    def parse_field(cls, config: object, name: str) -> None:
        """Parse ``config.<name>`` in place (frozen dataclasses); errors name the field."""
        try:
            object.__setattr__(config, name, cls.parse(getattr(config, name)))
        except ValueError as exc:
            raise ValueError(f"{name} must be a distribution: {exc}") from None

    @property
    def spec(self) -> str:
        """The string spelling (what trace headers record)."""
        return f"{self.kind}:" + ",".join(f"{p:g}" for p in self.params)

    @property
    def mean(self) -> float:
        """The distribution's mean (before any minimum is applied)."""
        if self.kind == "uniform":
            return (self.params[0] + self.params[1]) / 2
        if self.kind == "lognormal":
            return self.params[0] * float(np.exp(self.params[1] ** 2 / 2))
        return self.params[0]

    def sample(self, rng: np.random.Generator, size: int, minimum: int = 1) -> np.ndarray:
        """``size`` draws as int64, each at least ``minimum``; shape (size,)."""
        if self.kind == "const":
            values = np.full(size, self.params[0])
        elif self.kind == "uniform":
            values = rng.integers(int(self.params[0]), int(self.params[1]) + 1, size=size)
        elif self.kind == "geometric":
            values = rng.geometric(1.0 / self.params[0], size=size)
        else:
            values = np.rint(self.params[0] * np.exp(self.params[1] * rng.standard_normal(size)))
        return np.maximum(values.astype(np.int64), minimum)
