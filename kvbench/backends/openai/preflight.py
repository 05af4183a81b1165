"""The preflight: a few short requests before a measured run, so a misconfigured server is caught
before it spoils the numbers (``kvbench run --backend openai``; ``--no-preflight`` skips it).

Checks, in order; each gives a :class:`Check`:

1. **server**: something answers at the base URL (``GET /v1/models``); if not, the rest is skipped
   (the run still goes on and records every request as an error, as without a preflight).
2. **model**: the model is one the server lists (when it lists any); if not, the run stops.
3. **streaming**: a 2-token streamed chat request completes; if not, the run stops (a server or a router
   that fails the probe fails every request, and a router's circuit breaker opens on them).
4. **cached_tokens**: the same probe again reports ``usage.prompt_tokens_details.cached_tokens``.
   If not, hit rates cannot be reported: vLLM needs ``--enable-prompt-tokens-details``, SGLang
   ``--enable-cache-report``.
5. **cache_salt** (with salt hygiene): the probe under a second salt. vLLM keys cached blocks by
   ``cache_salt`` (``../shared/REFERENCES.md`` section 1), so a hit there means the server ignored
   the salt: salt hygiene is off. The run then falls back to nonce hygiene and says so.
6. **token_ids** (a run of token-id prompts): the probe as token ids on ``/v1/completions``; if it is
   refused (sglang-router answers 422: its prompt type takes text), the run stops and names the fix.

The probe is a chat prompt of :data:`PROBE_TOKENS` tokens (several blocks at any usual block size)
that starts with a random nonce, so no earlier traffic can make it hit. Its four requests go to the
server before the run's ``/metrics`` scrape, so they do not count in the run's counters.
"""

from __future__ import annotations

import secrets
from dataclasses import asdict, dataclass, replace

import numpy as np

from kvbench.backends.openai.admin import list_models, unreachable
from kvbench.backends.openai.client import OpenAIBackend, OpenAIConfig
from kvbench.request import Message, Request, RequestRecord
from kvbench.workloads.text import FILLER_WORDS
from kvbench.workloads.tokenizer import Tokenizer

PROBE_TOKENS = 160  # 10 blocks of 16, 2.5 of 64: a hit shows at every common block size
MAX_REPLICA_TRIES = 8  # repeats of a probe to reach the first probe's replica behind a router
CACHE_FLAGS = "vLLM: --enable-prompt-tokens-details; SGLang: --enable-cache-report"


@dataclass(frozen=True)
class Check:
    """One preflight check: ``ok`` True / False, or ``None`` when it could not be told."""

    name: str
    ok: bool | None
    detail: str


@dataclass(frozen=True)
class PreflightResult:
    """Every check in order, and what the run does with them."""

    checks: tuple[Check, ...]

    def check(self, name: str) -> Check | None:
        return next((c for c in self.checks if c.name == name), None)

    @property
    def fatal(self) -> str | None:
        """Why the run must not start (the server lists models, not this one; a streamed probe
        failed), else ``None``. A server that does not answer is not fatal: every request then becomes
        an error row."""
        model = self.check("model")
        if model is not None and model.ok is False:
            return f"model: {model.detail}"
        token_ids = self.check("token_ids")
        if token_ids is not None and token_ids.ok is False:
            return f"token_ids: {token_ids.detail}"
        streaming = self.check("streaming")
        if streaming is not None and streaming.ok is False:
            return (
                f"streaming: {streaming.detail}; every request of the run would fail the same way (and "
                "trip a router's circuit breaker), so none is sent"
            )
        return None

    @property
    def salt_ignored(self) -> bool:
        """Whether the server served a hit across two cache salts."""
        salt = self.check("cache_salt")
        return salt is not None and salt.ok is False

    def lines(self) -> list[str]:
        """One line per check, for the run's notes."""
        mark = {True: "ok", False: "FAILED", None: "unknown"}
        return [f"preflight {c.name}: {mark[c.ok]} - {c.detail}" for c in self.checks]

    def as_dict(self) -> dict:
        return {"checks": [asdict(c) for c in self.checks]}


def probe_request(tokenizer: Tokenizer, nonce: str) -> Request:
    """A chat request whose user message is ``kvbench preflight <nonce>`` and filler words, about
    :data:`PROBE_TOKENS` tokens rendered; 2 output tokens."""
    words = " ".join(FILLER_WORDS[i % len(FILLER_WORDS)] for i in range(PROBE_TOKENS))
    text = f"kvbench preflight {nonce}\n" + words
    ids = tokenizer.encode(text)[:PROBE_TOKENS]
    messages = (Message("user", tokenizer.decode(ids)),)
    return Request(
        0,
        f"preflight-{nonce}",
        f"preflight-{nonce}",
        0,
        np.asarray(tokenizer.render_messages(messages), dtype=np.uint32),
        max_tokens=2,
        messages=messages,
    )


def _served_checks(first: RequestRecord, again: RequestRecord, other: RequestRecord | None) -> list[Check]:
    if not first.ok:
        return [Check("streaming", False, f"a streamed 2-token request failed: {first.error}")]
    checks = [
        Check("streaming", True, f"{first.output_tokens} tokens streamed, TTFT {first.ttft_ms or 0:.0f} ms")
    ]
    if again.cached_prompt_tokens is None:
        checks.append(
            Check(
                "cached_tokens",
                False,
                f"the server does not report cached_tokens, so hit rates cannot "
                f"be reported; turn it on ({CACHE_FLAGS})",
            )
        )
        return checks + [Check("cache_salt", None, "not testable without cached_tokens")] if other else checks
    checks.append(
        Check(
            "cached_tokens",
            True,
            f"reported: {again.cached_prompt_tokens} of {again.prompt_tokens} prompt tokens on a repeat",
        )
    )
    if other is None:
        return checks
    elsewhere = [
        r for r in (again, other) if first.replica_id and r.replica_id not in (None, first.replica_id)
    ]
    if elsewhere:
        return checks + [
            Check(
                "cache_salt",
                None,
                f"the repeats reached other replicas than the first ({first.replica_id}) in "
                f"{MAX_REPLICA_TRIES} tries: cannot tell behind this router",
            )
        ]
    if again.cached_prompt_tokens == 0:
        return checks + [Check("cache_salt", None, "a repeat did not hit (is prefix caching on?)")]
    if (other.cached_prompt_tokens or 0) > 0:
        return checks + [
            Check(
                "cache_salt",
                False,
                f"a second cache_salt hit {other.cached_prompt_tokens} tokens: "
                "the server ignores cache_salt, so salt hygiene is OFF",
            )
        ]
    return checks + [Check("cache_salt", True, "a second cache_salt did not hit: salts keep runs apart")]


async def _on_replica_of(backend: OpenAIBackend, probe: Request, first: RequestRecord) -> RequestRecord:
    """``probe`` served again, resent (up to :data:`MAX_REPLICA_TRIES` times) until the replica that
    served ``first`` serves it: behind a router without session affinity (round robin) a repeat
    reaches another replica, where no hit tells anything about the cache. Servers that name no
    replica are served once."""
    record = await backend.serve(probe)
    for _ in range(MAX_REPLICA_TRIES - 1):
        if first.replica_id is None or record.replica_id in (None, first.replica_id) or not record.ok:
            break
        record = await backend.serve(probe)
    return record


async def _probe(config: OpenAIConfig, tokenizer: Tokenizer, with_salts: bool) -> list[Check]:
    probe = probe_request(tokenizer, secrets.token_hex(8))
    salt = secrets.token_hex(16) if with_salts else None
    async with OpenAIBackend(config, tokenizer, salt) as backend:
        first = await backend.serve(probe)
        if not first.ok:  # the run stops on it: nothing more to ask
            return _served_checks(first, first, None)
        again = await _on_replica_of(backend, probe, first)
    other = None
    if with_salts:
        async with OpenAIBackend(config, tokenizer, secrets.token_hex(16)) as backend:
            other = await _on_replica_of(backend, probe, first)
    return _served_checks(first, again, other)


async def _token_ids_check(config: OpenAIConfig, tokenizer: Tokenizer) -> Check:
    """The probe as token ids on ``/v1/completions``, as the run will send its prompts."""
    probe = probe_request(tokenizer, secrets.token_hex(8))
    probe = replace(probe, messages=None, prompt=None)
    async with OpenAIBackend(config, tokenizer, None) as backend:
        record = await backend.serve(probe)
    if record.ok:
        return Check("token_ids", True, "a prompt of token ids is served")
    return Check(
        "token_ids",
        False,
        f"a prompt of token ids is refused ({record.error}): the server, or a router in front of it "
        "(sglang-router takes text only), needs text; use a trace with text (prompts, ShareGPT, "
        "kvbench trace gen)",
    )


async def preflight(
    config: OpenAIConfig, tokenizer: Tokenizer, with_salts: bool, token_ids: bool = False
) -> PreflightResult:
    """Run the checks of the module docstring against ``config``'s server and model.

    ``with_salts``: also test that ``cache_salt`` is honoured (salt hygiene). ``token_ids``: the run
    sends token-id prompts, so check that they are served. Never raises for a server's answer: each
    problem is a failed :class:`Check`.
    """
    if (problem := unreachable(config.base_url, config.api_key)) is not None:
        return PreflightResult((Check("server", False, f"nothing answers at {config.base_url}: {problem}"),))
    checks = [Check("server", True, f"{config.base_url} answers")]
    models, problem = list_models(config.base_url, config.api_key)
    if models == ["unknown"]:  # sglang-router over workers whose model it could not read
        models, problem = [], "the router lists its model as 'unknown'"
    if models and config.model not in models:
        checks.append(
            Check("model", False, f"{config.model!r} is not served (the server lists {', '.join(models)})")
        )
        return PreflightResult(tuple(checks))
    checks.append(
        Check(
            "model",
            True if models else None,
            f"{config.model!r} is listed"
            if models
            else f"cannot tell ({problem or 'the server lists no model'})",
        )
    )
    checks += await _probe(config, tokenizer, with_salts)
    if token_ids and all(check.ok is not False for check in checks if check.name == "streaming"):
        checks.append(await _token_ids_check(config, tokenizer))
    return PreflightResult(tuple(checks))
