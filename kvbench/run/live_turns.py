"""``kvbench run --turns live``: a session's later turns built at send time from the server's real replies.

Scripted turns (the default) send a trace as written: turn k+1 carries the trace's own assistant
text. Live turns send what a real chat client sends: turn k+1's messages are the messages turn k
was *sent* with, then the reply the server streamed (:attr:`RequestRecord.output_text`) as the
assistant message, then what the trace adds after its scripted reply (the next user message, an
agent step's observation). Chat and agent traces and imported ShareGPT have this shape. A request
that does not extend its session's previous turn by one assistant message and more (or has no
messages), or whose previous turn failed, is sent as written and counted.

Expected cached tokens are computed as requests go, each when it finished, in the order they
finished, by the project's predictor in its one-request-at-a-time form
(:class:`kvbench.sim.predict.OnlinePrediction`) through two caches of the server's block size and
pool (:class:`kvbench.backends.openai.server_cache.ServerCache`; a vLLM pool or an unbounded one is
replayed unbounded here). Completion order is the service order of a server that serves one request
at a time (``kvbench serve``), so there the replay is exact even when an open loop sends requests
that overlap; send order would miss the blocks of a request that finished while the next one
waited. (On a batching server, at concurrency above 1, it is an estimate.) The two caches:

* **generated blocks cached** (vLLM v1, ``kvbench serve``): a finished request stores every full block
  of prompt + output - 1 tokens (the last sampled token has no KV; :mod:`kvbench.sim.outputs`), the
  output being the ids the server generated (vLLM's ``return_token_ids``), else the server's
  ``/tokenize`` of the reply text, else the local tokenizer's. This is each request's
  ``expected_cached_tokens``.
* **prompt only** (``kvbench serve --prompt-only``): only the prompt's full blocks. (A cache known to
  store prompts only, ``CacheConfig.prompt_only``, makes this one the ``expected_cached_tokens``.)

``kvbench run --backend inprocess --turns live`` uses the same hook with the engine's own cache
config; the reply text there is the tokenizer's decoding of the generated ids.

The next turn's prompt renders the reply *text*, so when the text re-tokenizes differently from the
generated ids the hit stops at the first differing block; both expectations include that. The
report says which expectation the server's reported ``cached_tokens`` agree with, and how many
replies re-tokenize differently (the server's ids vs the local tokenizer's encoding of the text).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from kvbench.cache.base import CacheConfig
from kvbench.cache.block_hash import HashConfig
from kvbench.request import Message, Request, RequestRecord
from kvbench.sim.predict import OnlinePrediction
from kvbench.workloads.tokenizer import Tokenizer

UNBOUNDED_BLOCKS = 1 << 40  # "never evicts": the hash cache holds blocks in a dict, nothing is preallocated


@dataclass(frozen=True)
class LivePlan:
    """How one request is built live: after ``previous`` (a request index) finished, its sent
    messages + the reply + ``added`` (the trace's messages after its scripted reply)."""

    previous: int
    added: tuple[Message, ...]


def plan_live_turns(requests: Sequence[Request]) -> dict[int, LivePlan]:
    """Per request index that can be built live (module docstring), its plan; a session's previous
    turn is its last earlier request in ``requests`` (the send loop's order)."""
    last_of_session: dict[str, Request] = {}
    plans = {}
    for request in requests:
        previous = last_of_session.get(request.session_id)
        last_of_session[request.session_id] = request
        if previous is None or previous.messages is None or request.messages is None:
            continue
        before, now = previous.messages, request.messages
        if (
            len(now) > len(before) + 1
            and now[: len(before)] == before
            and now[len(before)].role == "assistant"
        ):
            plans[request.index] = LivePlan(previous.index, now[len(before) + 1 :])
    return plans


@dataclass
class LiveReport:
    """What a live run found. Token sums are over requests whose server reported ``cached_tokens``.

    Attributes:
        num_live / num_as_written: requests built from a real reply / sent as the trace wrote them
            (first turns, other shapes, a failed previous turn).
        reported_cached_tokens / expected_with_generated_tokens / expected_prompt_only_tokens: sums.
        num_replies_checked / num_retokenized_differently: replies whose generated ids were known
            (returned by the server, or its ``/tokenize``), and of those, how many the local tokenizer
            encodes differently; ``first_difference``: one example in words, or ``None``.
        output_ids_source: where the stored output ids came from (``backend``: the server's
            ``return_token_ids`` or the engine's; ``server /tokenize``; ``local tokenizer``: the last used).
    """

    num_live: int = 0
    num_as_written: int = 0
    reported_cached_tokens: int = 0
    expected_with_generated_tokens: int = 0
    expected_prompt_only_tokens: int = 0
    num_compared: int = 0
    num_replies_checked: int = 0
    num_retokenized_differently: int = 0
    first_difference: str | None = None
    output_ids_source: str | None = None

    @property
    def generated_blocks_cached(self) -> bool | None:
        """``True`` / ``False`` when the reported tokens equal one expectation and not the other,
        else ``None`` (no difference to tell, or neither matches)."""
        reported, with_generated = self.reported_cached_tokens, self.expected_with_generated_tokens
        if not self.num_compared or with_generated == self.expected_prompt_only_tokens:
            return None
        if reported == with_generated:
            return True
        return False if reported == self.expected_prompt_only_tokens else None

    def verdict(self) -> str:
        cached = self.generated_blocks_cached
        if not self.num_compared:
            return "no cached_tokens reported: generated-block caching not checked"
        if not self.num_live:
            return "no turn was built from a reply (no chat messages extending a previous turn)"
        if self.expected_with_generated_tokens == self.expected_prompt_only_tokens:
            return "no reply filled a block the next turn could hit: generated-block caching not told apart"
        if cached is None:
            return "the reported tokens match neither expectation"
        return "the generated blocks were cached" if cached else "the generated blocks were NOT cached"

    def lines(self) -> list[str]:
        """The run's note lines."""
        lines = [
            f"live turns: {self.num_live} requests built from the real replies, "
            f"{self.num_as_written} sent as written (first turns, other shapes, failed replies)",
            f"live turns: reported {self.reported_cached_tokens:,} cached tokens; expected "
            f"{self.expected_with_generated_tokens:,} if generated blocks are cached, "
            f"{self.expected_prompt_only_tokens:,} if only prompts: {self.verdict()}",
        ]
        if self.num_replies_checked:
            line = (
                f"live turns: {self.num_retokenized_differently} of {self.num_replies_checked} replies "
                "re-tokenize differently from the ids generated"
            )
            lines.append(line + (f" (first: {self.first_difference})" if self.first_difference else ""))
        else:
            lines.append(
                "live turns: no reply ids returned (nor a server /tokenize): re-tokenization not checked"
            )
        return lines

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "generated_blocks_cached": self.generated_blocks_cached}


@dataclass
class LiveTurns:
    """The send loop's turn hook for ``--turns live`` (:class:`kvbench.run.loop.Turns`; module docstring).

    Args:
        requests: the run's requests as prepared (hygiene applied), in send order.
        tokenizer: renders each live request's messages (the ids the server prefills).
        cache: the server's cache as the expectations assume it: a ``CacheConfig``, ``None`` (prefix
            caching off: every request expects 0), or an unbounded one of ``block_size`` (any other
            model).
        reference: the server's tokenizer (``/tokenize``) for reply ids the server did not return.
    """

    requests: Sequence[Request]
    tokenizer: Tokenizer
    cache: CacheConfig | None
    reference: Tokenizer | None = None
    report: LiveReport = field(default_factory=LiveReport)

    def __post_init__(self) -> None:
        self.plans = plan_live_turns(self.requests)
        self.sent: dict[int, Request] = {}
        self.replies: dict[int, RequestRecord] = {}
        self.expected_generated: dict[int, int] = {}  # request index -> tokens, generated blocks cached
        self.expected_prompt_only: dict[int, int] = {}  # ... prompt blocks only
        self._generated = OnlinePrediction(self.cache, store_outputs=True)
        self._prompt_only = OnlinePrediction(self.cache, store_outputs=False)

    def prepare(self, request: Request) -> Request:
        """The request to send now: built from its session's real history where it can be."""
        plan = self.plans.get(request.index)
        reply = self.replies.get(plan.previous) if plan is not None else None
        if (
            plan is not None
            and reply is not None
            and reply.ok
            and (text := self._reply_text(reply)) is not None
        ):
            history = self.sent[plan.previous].messages
            messages = (*history, Message("assistant", text), *plan.added)
            request = replace(request, messages=messages, token_ids=self.tokenizer.render_messages(messages))
            self.report.num_live += 1
        else:
            self.report.num_as_written += 1
        request = replace(request, expected_cached_tokens=None)  # known when it finished
        self.sent[request.index] = request
        return request

    def _reply_text(self, record: RequestRecord) -> str | None:
        """The reply as a client reads it: the streamed text (HTTP), else the decoded ids (in-process)."""
        if record.output_text is not None:
            return record.output_text
        return self.tokenizer.decode(record.output_token_ids) if record.output_token_ids is not None else None

    def finished(self, request: Request, record: RequestRecord) -> Request:
        """Replay the request through both caches (its expectation, then its blocks stored where it
        succeeded), keep its reply for the next turn; returns it with ``expected_cached_tokens``."""
        self.replies[request.index] = record
        output_ids = self._output_ids(request, record) if record.ok else None
        with_generated = self.expected_generated[request.index] = self._generated.finished(
            request, output_ids, record.ok
        )
        prompt_only = self.expected_prompt_only[request.index] = self._prompt_only.finished(
            request, None, record.ok
        )
        # a cache known to store prompts only
        known_prompt_only = self.cache is not None and self.cache.prompt_only
        request = self.sent[request.index] = replace(
            request, expected_cached_tokens=prompt_only if known_prompt_only else with_generated
        )
        if record.cached_prompt_tokens is not None and record.ok:
            report = self.report
            report.num_compared += 1
            report.reported_cached_tokens += record.cached_prompt_tokens
            report.expected_with_generated_tokens += with_generated
            report.expected_prompt_only_tokens += prompt_only
        return request

    def _output_ids(self, request: Request, record: RequestRecord) -> list[int] | None:
        """The generated ids: the server's, else its ``/tokenize`` of the text, else the local encoding;
        checks the local encoding of the text against the first two."""
        text = self._reply_text(record) or ""
        local = self.tokenizer.encode(text) if text else []
        if record.output_token_ids is not None:
            generated, source = list(record.output_token_ids), "backend"
        elif self.reference is not None and text:
            generated, source = self.reference.encode(text), "server /tokenize"
        else:
            self.report.output_ids_source = "local tokenizer"
            return local or None
        self.report.output_ids_source = source
        self._check_retokenization(request, generated, local)
        return generated

    def _check_retokenization(self, request: Request, generated: list[int], local: list[int]) -> None:
        report = self.report
        report.num_replies_checked += 1
        if generated == local:
            return
        report.num_retokenized_differently += 1
        if report.first_difference is None:
            at = next(
                (i for i, (a, b) in enumerate(zip(generated, local)) if a != b),
                min(len(generated), len(local)),
            )
            report.first_difference = (
                f"request {request.request_id}, reply token {at}: server "
                f"{generated[at : at + 3]} vs local {local[at : at + 3]} "
                f"({len(generated)} vs {len(local)} tokens)"
            )

    def sent_requests(self, requests: Sequence[Request]) -> list[Request]:
        """``requests`` with each sent one replaced by what was really sent (same order)."""
        return [self.sent.get(request.index, request) for request in requests]


def live_cache_config(model: Any, block_size: int) -> CacheConfig | None:
    """The cache a live run replays for a server cache model: a ``CacheConfig`` as it is, ``None``
    (prefix caching off) as it is, anything else (unbounded, the vLLM pool) a never-evicting hash cache."""
    if model is None or isinstance(model, CacheConfig):
        return model
    return CacheConfig(UNBOUNDED_BLOCKS, block_size, hash=getattr(model, "hash", HashConfig()))
