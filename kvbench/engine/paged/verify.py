"""``--verify`` on the paged engine: logits against the cache-off engine, argmax flips near ties vs
mismatches.

Batched forwards (packed sequences, gathered K/V, other batch shapes) may differ from the cache-off
engine in the last bits, so a greedy output can differ where two tokens are almost equally likely.
vLLM's tests accept exactly that (``tests/models/utils.py`` ``check_logprobs_close``: where two
greedy outputs first differ, each token must be in the other's top logprobs). kvbench's version,
per request (greedy only; :func:`verify_greedy`):

1. the cache-off engine scores the paged engine's own output (``HFEngine.reference_logprobs``:
   prefill, then decode steps fed those tokens), so at every position both saw the same context and
   every position is compared (not only up to the first difference, as a free-running reference
   allows);
2. at a position where the reference's argmax ``r`` is not the paged token ``p``, the gap
   ``logprob_ref(r) - logprob_ref(p)`` (the top-2 gap when ``p`` was the runner-up) decides: below
   the tolerance it is an **argmax flip near a tie**, otherwise a **mismatch** (a real bug: a wrong
   block, a wrong mask);
3. the largest ``|logprob_paged(p) - logprob_ref(p)|`` over the positions is kept, the logit
   comparison itself.

Tolerance (:data:`TIE_TOLERANCE_NATS`, natural-log units): fp32 batched vs single-sequence logits
differ by ~1e-6..1e-5 (reduction order), so 1e-3 nats is far above fp32 noise and far below a
real disagreement; bf16 / fp16 round to 8 / 11 mantissa bits, so their ties are wider.
``output_matches_reference`` is ``True`` exactly when no position differs, which for greedy
decoding is the same answer a free-running cache-off run gives. ``--batch-invariant`` runs one
forward per sequence, so it reports 0 flips and 0 mismatches.
"""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import Future, InvalidStateError
from dataclasses import asdict, dataclass, replace

import torch

from kvbench.request import RequestRecord

# see the module docstring
TIE_TOLERANCE_NATS = {
    torch.float32: 1e-3,
    torch.float16: 5e-2,
    torch.bfloat16: 1e-1,
}
DEFAULT_TIE_TOLERANCE_NATS = 1e-3


@dataclass(frozen=True)
class LogitCheck:
    """One request's comparison (module docstring).

    Attributes:
        num_compared_tokens: output positions compared.
        num_flips_near_ties: positions whose argmax differs with a reference gap below the tolerance.
        num_mismatches: positions whose argmax differs with a larger gap.
        max_abs_logprob_diff: largest ``|logprob_paged - logprob_ref|`` of the paged token, nats.
    """

    num_compared_tokens: int
    num_flips_near_ties: int
    num_mismatches: int
    max_abs_logprob_diff: float

    @property
    def matches(self) -> bool:
        return self.num_flips_near_ties == 0 and self.num_mismatches == 0


def compare_logprobs(
    reference: torch.Tensor, output_ids: list[int], chosen_logprobs: list[float], tolerance_nats: float
) -> LogitCheck:
    """Classify every position (module docstring).

    Args:
        reference: ``(outputs, vocab)`` reference log-probabilities.
        output_ids: the paged engine's tokens, one per row.
        chosen_logprobs: the paged engine's log-probability of each of its tokens, nats.
        tolerance_nats: the tie tolerance.

    Raises:
        ValueError: the three lengths differ.
    """
    if not reference.shape[0] == len(output_ids) == len(chosen_logprobs):
        raise ValueError(
            f"{reference.shape[0]} reference rows, {len(output_ids)} tokens, {len(chosen_logprobs)} logprobs"
        )
    tokens = torch.tensor(output_ids, device=reference.device)  # (outputs,)
    top = reference.argmax(dim=-1)  # (outputs,)
    paged_in_reference = reference.gather(1, tokens[:, None])[:, 0]  # (outputs,)
    gap = reference.gather(1, top[:, None])[:, 0] - paged_in_reference  # (outputs,), >= 0
    differs = top != tokens  # (outputs,)
    near_tie = differs & (gap < tolerance_nats)
    diff = (torch.tensor(chosen_logprobs, device=reference.device) - paged_in_reference).abs()  # (outputs,)
    return LogitCheck(
        len(output_ids), int(near_tie.sum()), int((differs & ~near_tie).sum()), float(diff.max())
    )


class VerifyReport:
    """Counts over every verified request of one engine (thread-safe); ``as_dict`` is the run's
    ``run.verify_logits`` metadata."""

    def __init__(self, tolerance_nats: float) -> None:
        self.tolerance_nats = tolerance_nats
        self._lock = threading.Lock()
        self._totals = LogitCheck(0, 0, 0, 0.0)
        self.num_requests = 0

    def add(self, check: LogitCheck) -> None:
        with self._lock:
            t = self._totals
            self._totals = LogitCheck(
                t.num_compared_tokens + check.num_compared_tokens,
                t.num_flips_near_ties + check.num_flips_near_ties,
                t.num_mismatches + check.num_mismatches,
                max(t.max_abs_logprob_diff, check.max_abs_logprob_diff),
            )
            self.num_requests += 1

    @property
    def totals(self) -> LogitCheck:
        return self._totals

    def as_dict(self) -> dict:
        return {
            **asdict(self._totals),
            "num_requests": self.num_requests,
            "tie_tolerance_nats": self.tolerance_nats,
        }


def tie_tolerance(dtype: torch.dtype) -> float:
    return TIE_TOLERANCE_NATS.get(dtype, DEFAULT_TIE_TOLERANCE_NATS)


class Verifier:
    """``--verify`` for one paged engine: each finished request against the copy engine with the cache
    off on the same model (built on first use). Greedy requests get the logit check
    (:func:`verify_greedy`, counted in ``report``); seeded sampled ones the token comparison. The
    engine hands finished requests to :meth:`defer` and calls :meth:`run_deferred` when idle."""

    def __init__(self, loaded) -> None:
        self.loaded = loaded
        self.report = VerifyReport(tie_tolerance(loaded.dtype))
        self._reference = None
        self._lock = threading.Lock()
        self._deferred: deque[tuple] = deque()  # (future, record, prompt ids, sampling, salt, logprobs)
        self._running: tuple | None = None  # the entry being checked now
        self._running_taken = False  # take_unchecked handed its record back meanwhile

    def reference_engine(self):
        if self._reference is None:
            from kvbench.engine.engine import HFEngine

            self._reference = HFEngine(self.loaded)
        return self._reference

    def defer(
        self,
        future: Future,
        record: RequestRecord,
        prompt_ids: list[int],
        sampling,
        salt: str,
        chosen_logprobs: list[float],
    ) -> None:
        """Queue one finished request's check; :meth:`run_deferred` runs it and resolves ``future``.
        The engine runs deferred checks only while no sequence is running or waiting, so no measured
        step waits on a reference pass (before, every request's TTFT and ITL in a verify
        run included other requests' passes)."""
        with self._lock:
            self._deferred.append((future, record, prompt_ids, sampling, salt, chosen_logprobs))

    @property
    def num_deferred(self) -> int:
        return len(self._deferred)

    def take_unchecked(self, future: Future) -> RequestRecord | None:
        """The record behind ``future`` if its request has finished and its check has not run yet,
        taken off the queue (its check never runs, ``output_matches_reference`` stays ``None``);
        ``None`` otherwise. For a caller cut short (Ctrl-C, SIGTERM) that still writes what was
        measured."""
        with self._lock:
            for entry in self._deferred:
                if entry[0] is future:
                    self._deferred.remove(entry)
                    return entry[1]
            if self._running is not None and self._running[0] is future:  # mid-check: it will not count
                self._running_taken = True
                return self._running[1]
        return None

    def run_deferred(self) -> None:
        """Check the oldest deferred request and resolve its future with the checked record (an
        error in the reference pass goes to that future only; a future cancelled meanwhile is
        skipped, uncounted). Never raises: the engine's worker calls it."""
        with self._lock:
            if not self._deferred:
                return
            self._running, self._running_taken = self._deferred.popleft(), False
        future, record, *args = self._running
        scratch = VerifyReport(self.report.tolerance_nats)  # counted only if the record is handed over
        try:
            outcome = None if future.done() else self.check(record, *args, report=scratch)
        except Exception as error:  # noqa: BLE001 - the caller gets it through the future
            outcome = error
        with self._lock:
            taken, self._running = self._running_taken, None
        if outcome is None or taken:  # cancelled, or taken unchecked (take_unchecked): nobody reads it
            return
        if scratch.num_requests:
            self.report.add(scratch.totals)
        try:
            if isinstance(outcome, Exception):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)
        except InvalidStateError:  # cancelled between the check and now: nobody reads it
            pass

    def check(
        self,
        record: RequestRecord,
        prompt_ids: list[int],
        sampling,
        salt: str,
        chosen_logprobs: list[float],
        report: VerifyReport | None = None,
    ) -> RequestRecord:
        """``record`` with ``output_matches_reference`` set (``None`` for unseeded sampling); a greedy
        check is counted in ``report`` (default: ``self.report``)."""
        if sampling.temperature == 0:
            return verify_greedy(
                self.reference_engine(),
                prompt_ids,
                record,
                chosen_logprobs,
                self.report if report is None else report,
            )
        reference = self.reference_engine().generate(prompt_ids, sampling, salt=salt)
        matches = reference.output_token_ids == record.output_token_ids
        return replace(record, output_matches_reference=matches if sampling.is_reproducible else None)


def verify_greedy(
    reference_engine,
    prompt_ids: list[int],
    record: RequestRecord,
    chosen_logprobs: list[float],
    report: VerifyReport,
) -> RequestRecord:
    """``record`` of a greedy request with ``output_matches_reference`` set from the logit check,
    counted in ``report``. ``reference_engine``: the cache-off ``HFEngine`` on the same model."""
    output_ids = list(record.output_token_ids or ())
    if not output_ids:
        return record
    check = compare_logprobs(
        reference_engine.reference_logprobs(prompt_ids, output_ids),
        output_ids,
        chosen_logprobs,
        report.tolerance_nats,
    )
    report.add(check)
    return replace(record, output_matches_reference=check.matches)
