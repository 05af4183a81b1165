"""BurstGPT CSV logs (HPMLL/BurstGPT) as requests with synthesized text of the logged lengths.

Columns (the header row names them; extra columns are ignored): ``Timestamp`` (seconds, shifted so
the first request arrives at 0), ``Request tokens`` (prompt length, >= 1), ``Response tokens``
(output length; 0 for a failed request, which gets a budget of 1), and, in BurstGPT v2, ``Session
ID`` (``../shared/REFERENCES.md`` section 5). The logs carry no text, so each prompt is text of
exactly ``Request tokens`` tokens (with a line-splitting tokenizer such as cl100k; another
tokenizer's count is taken as rendered): a unique ``Request <tag>:`` line and document pieces
(:mod:`kvbench.workloads.text_fit`), seeded by ``(seed, row)``. In a session, a request at least as
long as the session's previous prompt extends that prompt (the history is resent, so the cache can
reuse it); a shorter one starts afresh. ``max_tokens`` = ``output_tokens`` = ``Response tokens``.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvbench.errors import InputError
from kvbench.workloads import text
from kvbench.workloads.formats.lines import numbered_lines, open_binary
from kvbench.workloads.formats.rows import BadRows
from kvbench.workloads.generators import Draft, one_off_text
from kvbench.workloads.text_fit import PieceCounter, filler_line, fit_text

TIMESTAMP, REQUEST_TOKENS, RESPONSE_TOKENS, SESSION_ID = (
    "Timestamp",
    "Request tokens",
    "Response tokens",
    "Session ID",
)
REQUIRED_COLUMNS = (TIMESTAMP, REQUEST_TOKENS, RESPONSE_TOKENS)


def is_burstgpt_header(line: str) -> bool:
    """Whether a CSV header line names BurstGPT's required columns."""
    names = {name.strip() for name in line.split(",")}
    return all(column in names for column in REQUIRED_COLUMNS)


def _number(path: Path, row: int, values: dict[str, str], column: str, integer: bool) -> float:
    raw = (values.get(column) or "").strip()
    try:
        value = int(raw) if integer else float(raw)
    except ValueError:
        kind = "an integer" if integer else "a number"
        raise InputError.at(path, row, column, f"expected {kind} >= 0, got {raw!r}") from None
    if not value >= 0:
        raise InputError.at(path, row, column, f"expected a value >= 0, got {raw!r}")
    return value


def _fresh(counter: PieceCounter, rng: np.random.Generator, num_tokens: int) -> str:
    try:
        return one_off_text(counter, rng, num_tokens)
    except ValueError:  # shorter than the tag line
        return filler_line(counter, num_tokens, rng)


def _continued(counter: PieceCounter, rng: np.random.Generator, history: str, num_tokens: int) -> str:
    """``history`` plus new text, ``num_tokens`` in all; fresh text when that cannot be exact."""
    extra = num_tokens - counter.count(history)
    if extra == 0:
        return history
    try:
        tail = fit_text(counter, text.document_pieces(rng), extra, rng)
    except ValueError:
        tail = filler_line(counter, extra, rng)
    joined = history + tail
    return joined if counter.count(joined) == num_tokens else _fresh(counter, rng, num_tokens)


def _columns(path: Path, reader: csv.DictReader) -> None:
    names = [name.strip() for name in reader.fieldnames or []]
    missing = [column for column in REQUIRED_COLUMNS if column not in names]
    if missing:
        raise InputError.at(
            path, 1, None, f"not a BurstGPT CSV: no column {missing[0]!r} (header: {', '.join(names)})"
        )
    reader.fieldnames = names


def read_burstgpt_drafts(
    path: Path, counter: PieceCounter, bad: BadRows, seed: int, limit: int | None = None
) -> list[Draft]:
    """The drafts of a BurstGPT CSV, in file order (at most ``limit``).

    Rows are read through :func:`.lines.numbered_lines` (each line bounded in size).

    Raises:
        InputError: unreadable file, a line over the bound or not UTF-8, a missing column, or
            (without ``bad.skip``) a malformed row (names the file, the row's line and the column).
    """
    drafts: list[Draft] = []
    sessions: dict[str, _Session] = {}
    with open_binary(path) as handle:
        reader = csv.DictReader(text for _, text in numbered_lines(handle, path, keep_ends=True))
        try:
            _columns(path, reader)
            for values in reader:
                row = reader.line_num
                parsed = bad.guard(
                    lambda: (
                        _number(path, row, values, TIMESTAMP, False),
                        _number(path, row, values, REQUEST_TOKENS, True),
                        _number(path, row, values, RESPONSE_TOKENS, True),
                    )
                )
                if parsed is None:
                    continue
                if parsed[1] < 1:
                    bad.guard(lambda: _raise(InputError.at(path, row, REQUEST_TOKENS, "an empty prompt")))
                    continue
                drafts.append(_draft(counter, seed, row, values, parsed, sessions))
                if limit is not None and len(drafts) >= limit:
                    break
        except csv.Error as exc:  # a quoted field over csv's field_size_limit, a NUL byte, ...
            raise InputError.at(path, reader.line_num, None, f"not a valid CSV row ({exc})") from None
    return drafts


def _raise(error: InputError) -> None:
    raise error


@dataclass
class _Session:
    """The last prompt of a session (its text and tokens) and how many requests it has had."""

    prompt: str
    num_tokens: int
    num_turns: int


def _draft(
    counter: PieceCounter,
    seed: int,
    row: int,
    values: dict[str, str],
    parsed: tuple,
    sessions: dict[str, _Session],
) -> Draft:
    timestamp_s, prompt_tokens, response_tokens = parsed
    name = (values.get(SESSION_ID) or "").strip()
    rng = np.random.default_rng([seed, row])
    session = sessions.get(name) if name else None
    if session is not None and prompt_tokens >= session.num_tokens:
        prompt = _continued(counter, rng, session.prompt, prompt_tokens)
    else:
        prompt = _fresh(counter, rng, prompt_tokens)
    turn = session.num_turns if session is not None else 0
    if name:
        sessions[name] = _Session(prompt, prompt_tokens, turn + 1)
    budget = max(1, response_tokens)
    return Draft(
        f"burstgpt-{name}" if name else f"row-{row}",
        turn,
        timestamp_s * 1e3,
        budget,
        prompt=prompt,
        output_tokens=budget,
    )
