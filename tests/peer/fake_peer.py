"""A fake peer server behind the one backend contract (``async serve(request) -> RequestRecord``), for
the engine comparison's tests; imported by its bare name (tests/peer is on ``sys.path`` while its
tests run)."""

import asyncio

from kvbench.request import RequestRecord, Status

FORBIDDEN_IN_SALT = "@/\\\0"  # vLLM 0.32's cache_salt rule (vllm/entrypoints/generate/base/protocol.py)


class FakeServer:
    """A server behind the one backend contract that records what it was sent and how many requests
    were in flight at once; answers every request after ``delay_s`` (0 cached tokens, TPOT 1 ms), or,
    as vLLM 0.32 does, a 400 error to a ``cache_salt`` over 128 characters or holding ``@ / \\`` or NUL."""

    def __init__(self, delay_s):
        self.delay_s = delay_s
        self.seen = []
        self.in_flight = self.most_in_flight = 0

    async def serve(self, request):
        self.seen.append(request)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        await asyncio.sleep(self.delay_s)
        self.in_flight -= 1
        if request.salt and (len(request.salt) > 128 or any(c in FORBIDDEN_IN_SALT for c in request.salt)):
            return RequestRecord(Status.ERROR, request.num_tokens, error="400: cache_salt", http_status=400)
        return RequestRecord(
            Status.OK,
            request.num_tokens,
            cached_prompt_tokens=0,
            output_tokens=request.max_tokens,
            ttft_ms=self.delay_s * 1e3,
            e2e_ms=self.delay_s * 1e3 + (request.max_tokens - 1) * 1.0,  # TPOT 1 ms
        )

    def describe(self):
        return {"backend": "fake"}
