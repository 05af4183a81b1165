"""How often a simulated policy picks the replica a real router picked, request by request.

The real router's choices are replayed into the model: after each request the model records the
replica the router actually chose (:meth:`commit` of the tree routers), so one tie broken differently
does not shift every later decision. Where the router breaks a tie by something no model can see (a
hash map's per-process seed, a random draw), the model names every replica it could have picked.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvbench.route.policies import RequestView, Router


@dataclass(frozen=True)
class Agreement:
    """Over ``requests`` requests: ``same`` where the model's own pick equals the router's;
    ``allowed`` where the router's pick is one the model allows (ties included); ``ties``: requests
    where the model allows more than one replica; ``mismatches``: request positions outside
    ``allowed``."""

    requests: int
    same: int
    allowed: int
    ties: int
    mismatches: tuple[int, ...]

    @property
    def same_rate(self) -> float:
        return self.same / self.requests if self.requests else 1.0

    @property
    def allowed_rate(self) -> float:
        return self.allowed / self.requests if self.requests else 1.0


def agreement(
    router: Router, views: Sequence[RequestView], observed: Sequence[int], num_replicas: int
) -> Agreement:
    """Replay ``views`` (the router's arrival order) with zero loads (one request in flight at a time:
    concurrency 1) against ``observed`` replica indexes. Raises ``ValueError`` on a length mismatch."""
    if len(views) != len(observed):
        raise ValueError(f"{len(views)} requests but {len(observed)} observed replicas")
    same = allowed = ties = 0
    mismatches, loads = [], [0] * num_replicas
    for position, (view, real) in enumerate(zip(views, observed)):
        if hasattr(router, "choices"):
            options, why = router.choices(view, loads)
            router.commit(view, real, why)  # the model's tree learns what the router's did
        else:
            options = [router.choose(view, loads)]
        same += options[0] == real
        allowed += real in options
        ties += len(options) > 1
        if real not in options:
            mismatches.append(position)
    return Agreement(len(views), same, allowed, ties, tuple(mismatches))
