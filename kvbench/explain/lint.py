"""``kvbench explain --lint``: prompt-layout rules checked on a trace without running anything.

* **Stable first**: a volatile value (:mod:`kvbench.explain.volatile`; plain counters are left out,
  numbers are everywhere; a value the session's previous turn sent at the same place is resent
  unchanged, not volatile) anywhere but the prompt's last message (the new turn) sits before content
  that every later turn resends, so every block after it differs per request. Move it to the end.
* **Append-only sessions**: turn ``t`` of a session should resend turn ``t - 1``'s whole prompt;
  the first token where it does not is reported (history rewritten, reasoning dropped, a template
  that renders earlier turns differently).
* **Tokens after the first volatile value**: the share of all prompt tokens that sit after the first
  volatile value of their prompt that breaks the rule above (one in the last message costs only the
  new turn): what a prefix cache cannot share while that value changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvbench.explain.content import decode, excerpt, last_message_offset
from kvbench.explain.prefixes import common_prefix_tokens
from kvbench.explain.volatile import find_volatile, token_offset_of_char
from kvbench.request import Request

LINT_KINDS = ("uuid", "date", "timestamp", "time", "request id", "hex id")  # not "counter"


@dataclass(frozen=True)
class LintFinding:
    """One broken rule: ``rule`` (``stable first`` / ``append-only``), the request, the token offset,
    a one-line ``detail``, an excerpt around the offset, and ``kind``: the volatile value's kind
    (``timestamp``, ``date``...) for ``stable first``, ``history rewritten`` for ``append-only``."""

    rule: str
    request_id: str
    offset_tokens: int
    detail: str
    excerpt: str
    kind: str = ""


@dataclass(frozen=True)
class LintReport:
    """Findings plus the trace totals: ``num_tokens_after_volatile`` of ``num_prompt_tokens``;
    ``num_turns_checked`` later turns, ``num_turns_append_only`` of them resend the previous prompt."""

    findings: list[LintFinding]
    num_prompt_tokens: int
    num_tokens_after_volatile: int
    num_turns_checked: int
    num_turns_append_only: int

    @property
    def share_after_volatile(self) -> float:
        return self.num_tokens_after_volatile / self.num_prompt_tokens if self.num_prompt_tokens else 0.0

    def by_kind(self) -> list[tuple[str, str, int, str]]:
        """Per (rule, kind), in order of first appearance: ``(rule, kind, findings, first request id)``."""
        counts: dict[tuple[str, str], list] = {}
        for finding in self.findings:
            entry = counts.setdefault((finding.rule, finding.kind), [0, finding.request_id])
            entry[0] += 1
        return [(rule, kind, count, first) for (rule, kind), (count, first) in counts.items()]


def lint(requests: Sequence[Request], tokenizer) -> LintReport:
    """Check every request (module docstring); ``tokenizer`` decodes ids (and renders messages)."""
    findings: list[LintFinding] = []
    after = 0
    by_turn = {(r.session_id, r.turn): r for r in requests}
    for request in requests:
        ids = np.asarray(request.token_ids)
        text = decode(tokenizer, ids)
        resent = _resent_chars(tokenizer, ids, by_turn.get((request.session_id, request.turn - 1)))
        spans = [span for span in find_volatile(text, LINT_KINDS) if span.end > resent]
        if not spans:
            continue
        offset = token_offset_of_char(
            lambda part: decode(tokenizer, np.asarray(part)), ids.tolist(), spans[0].start
        )
        if offset < last_message_offset(tokenizer, request.messages):
            after += len(ids) - offset
            findings.append(
                LintFinding(
                    "stable first",
                    request.request_id,
                    offset,
                    f"{spans[0].kind} {spans[0].text!r} at token {offset:,} of {len(ids):,}, "
                    "before content later turns resend: move it to the end",
                    excerpt(tokenizer, ids, offset),
                    spans[0].kind,
                )
            )
    checked, append_only = _sessions(requests, tokenizer, findings)
    return LintReport(findings, sum(r.num_tokens for r in requests), after, checked, append_only)


def _resent_chars(tokenizer, ids: np.ndarray, previous: Request | None) -> int:
    """Characters at the start of ``ids``' text that the session's previous turn sent too: a value
    there was resent unchanged (a timestamp in an earlier tool output), so it breaks no prefix."""
    if previous is None:
        return 0
    shared = common_prefix_tokens(np.asarray(previous.token_ids), ids)
    return len(decode(tokenizer, ids[:shared])) if shared else 0


def _sessions(requests: Sequence[Request], tokenizer, findings: list[LintFinding]) -> tuple[int, int]:
    by_turn = {(r.session_id, r.turn): r for r in requests}
    checked = append_only = 0
    for request in requests:
        previous = by_turn.get((request.session_id, request.turn - 1))
        if previous is None:
            continue
        checked += 1
        shared = common_prefix_tokens(np.asarray(previous.token_ids), np.asarray(request.token_ids))
        if shared >= previous.num_tokens:
            append_only += 1
            continue
        findings.append(
            LintFinding(
                "append-only",
                request.request_id,
                shared,
                f"turn {request.turn} resends only {shared:,} of turn {previous.turn}'s "
                f"{previous.num_tokens:,} prompt tokens",
                excerpt(tokenizer, np.asarray(request.token_ids), shared),
                "history rewritten",
            )
        )
    return checked, append_only
