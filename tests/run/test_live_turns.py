"""``--turns live``: a session's next turn built from the real reply, the expectations that follow
from it (generated blocks cached or not), the re-tokenization check, and the send loop's hook."""

import numpy as np

from kvbench.cache.base import CacheConfig
from kvbench.request import Message, Request, RequestRecord, Status
from kvbench.run.clock import VirtualClock
from kvbench.run.live_turns import LiveTurns, plan_live_turns
from kvbench.run.loop import LoadConfig, send_requests
from kvbench.workloads.tokenizer import TiktokenTokenizer

TOKENIZER = TiktokenTokenizer()
SYSTEM = Message("system", "You answer questions about inference servers in one short line. " * 3)
Q1, A1, Q2 = (
    Message("user", "What is a block?"),
    Message("assistant", "Sixteen tokens."),
    Message("user", "Why?"),
)


def chat_request(index, session, turn, messages, max_tokens=24):
    return Request(
        index,
        f"r{index}",
        session,
        turn,
        TOKENIZER.render_messages(messages),
        max_tokens=max_tokens,
        messages=tuple(messages),
    )


def two_turns():
    return [chat_request(0, "a", 0, [SYSTEM, Q1]), chat_request(1, "a", 1, [SYSTEM, Q1, A1, Q2])]


def reply(text, ids=None, cached=None):
    ids = TOKENIZER.encode(text) if ids is None else ids
    return RequestRecord(
        Status.OK,
        0,
        cached_prompt_tokens=cached,
        output_tokens=len(ids),
        output_token_ids=tuple(ids),
        output_text=text,
    )


REPLY = "A fixed-size page of keys and values, so that prefixes are shared block by block and freed alike."


def test_only_turns_that_extend_the_previous_one_by_a_reply_are_planned():
    other = chat_request(2, "b", 0, [Q2])
    rewritten = chat_request(3, "b", 1, [Q1, A1, Q2])  # does not start with turn 0's messages
    plans = plan_live_turns([*two_turns(), other, rewritten])
    assert list(plans) == [1] and plans[1].previous == 0 and plans[1].added == (Q2,)


def test_the_next_turn_carries_the_real_reply_and_expects_its_blocks():
    first, second = two_turns()
    live = LiveTurns([first, second], TOKENIZER, CacheConfig(1024, 16))
    assert live.finished(live.prepare(first), reply(REPLY, cached=0)).expected_cached_tokens == 0
    reply_ids = TOKENIZER.encode(REPLY)
    sent_second = live.prepare(second)
    assert sent_second.messages == (SYSTEM, Q1, Message("assistant", REPLY), Q2)
    prefix = np.concatenate([first.token_ids, reply_ids])
    np.testing.assert_array_equal(sent_second.token_ids[: len(prefix)], prefix)
    recorded = live.finished(sent_second, reply("ok", cached=first.num_tokens // 16 * 16))
    # generated blocks cached: every full block of prompt + reply - 1 the next prompt shares
    stored = first.num_tokens + len(reply_ids) - 1
    assert recorded.expected_cached_tokens == stored // 16 * 16
    assert live.expected_prompt_only[1] == first.num_tokens // 16 * 16 < recorded.expected_cached_tokens
    report = live.report
    assert (report.num_live, report.num_as_written, report.generated_blocks_cached) == (1, 1, False)
    assert "the generated blocks were NOT cached" in " ".join(report.lines())


def test_a_reply_that_re_tokenizes_differently_is_counted():
    first, second = two_turns()
    live = LiveTurns([first, second], TOKENIZER, None)
    text = "token caching"
    # same text, other ids
    split = [t for piece in ("tok", "en", " caching") for t in TOKENIZER.encode(piece)]
    assert TOKENIZER.decode(split) == text and split != TOKENIZER.encode(text)
    live.finished(live.prepare(first), reply(text, ids=split, cached=0))
    assert live.finished(live.prepare(second), reply("x")).expected_cached_tokens == 0  # prefix caching off
    report = live.report
    assert (report.num_replies_checked, report.num_retokenized_differently) == (2, 1)
    assert "reply token 0" in report.first_difference and report.output_ids_source == "backend"


def test_a_failed_previous_turn_leaves_the_next_as_written():
    first, second = two_turns()
    live = LiveTurns([first, second], TOKENIZER, CacheConfig(64, 16))
    live.finished(live.prepare(first), RequestRecord.failed(first.num_tokens, "boom"))
    assert live.prepare(second).messages == second.messages and live.report.num_as_written == 2


class EchoBackend:
    """A backend that answers every request with a fixed reply text (its ids as the tokenizer's)."""

    def __init__(self):
        self.seen = []

    async def serve(self, request):
        self.seen.append(request)
        return reply(f"Reply to turn {request.turn}.")


def test_the_send_loop_sends_and_records_what_the_hook_built():
    requests = two_turns()
    backend, live = EchoBackend(), LiveTurns(two_turns(), TOKENIZER, CacheConfig(1024, 16))
    clock = VirtualClock()
    records = clock.run(send_requests(requests, backend, LoadConfig(), clock=clock, turns=live))
    assert [r.messages[-2].content for r in backend.seen[1:]] == ["Reply to turn 0."]
    # recorded as sent
    assert [request.messages for request, _ in records] == [r.messages for r in backend.seen]
    assert [request.expected_cached_tokens for request, _ in records] == [0, live.expected_generated[1]]
    assert live.expected_generated[1] > 0


def test_overlapping_requests_expect_what_finished_before_them():
    """An open loop sends b while a runs; a one-at-a-time server serves b after a stored its blocks."""
    a, b = chat_request(0, "a", 0, [SYSTEM, Q1]), chat_request(1, "b", 0, [SYSTEM, Q2])
    live = LiveTurns([a, b], TOKENIZER, CacheConfig(1024, 16))
    sent_a, sent_b = live.prepare(a), live.prepare(b)  # both sent before either finished
    live.finished(sent_a, reply("x"))
    shared = len(TOKENIZER.render_messages([SYSTEM])) // 16 * 16
    assert live.finished(sent_b, reply("y")).expected_cached_tokens == shared > 0
