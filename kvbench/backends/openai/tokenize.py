"""``--tokenizer server``: the server's own tokenizer through its ``/tokenize`` and ``/detokenize``
endpoints (vLLM's API, as ``vllm bench serve`` uses it; ``kvbench serve`` has them too).

``POST /tokenize`` with ``{"model", "prompt", "add_special_tokens"}`` or ``{"model", "messages",
"add_generation_prompt": true}`` answers ``{"tokens": [...]}``: exactly the ids the server prefills
for ``/v1/completions`` and ``/v1/chat/completions`` (chat template and BOS included), so the
expected cached tokens are computed on the server's ids. ``POST /detokenize`` with ``{"model",
"tokens"}`` answers ``{"prompt": text}``. Both are served at the server's root (not under ``/v1``).
One HTTP call per distinct text (answers are cached); fine for replaying a trace, too slow to
generate text to exact lengths with (``splits_at_lines`` is False, so generators refit).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from kvbench.backends.openai.admin import call, redact, server_root
from kvbench.errors import InputError
from kvbench.request import Message
from kvbench.workloads.tokenizer import render

_MAX_CACHED = 1 << 14  # answers kept per tokenizer


class ServerTokenizer:
    """A :class:`kvbench.workloads.tokenizer.Tokenizer` answered by the server (module docstring).

    Raises:
        InputError: (at construction, and on any later call) the server has no working
            ``/tokenize``: the message names the endpoint and its answer, and how to do without.
    """

    splits_at_lines = False

    def __init__(self, base_url: str, model: str, api_key: str = "EMPTY", timeout_s: float = 30.0) -> None:
        self.root, self.model, self._key, self._timeout_s = server_root(base_url), model, api_key, timeout_s
        self.name = f"server:{self.root}/tokenize"
        self.chat_format = f"server-template:{model}"
        self._answers: dict[str, list[int]] = {}
        self.num_calls = 0
        self.encode("kvbench")  # fails here, once, when the server has no /tokenize

    def _post(self, endpoint: str, body: dict[str, Any]) -> dict[str, Any]:
        self.num_calls += 1
        status, text = call(
            self.root + endpoint, self._key, self._timeout_s, "POST", {"model": self.model, **body}
        )
        if status != 200:
            problem = f"HTTP {status}: {text[:200]}" if status else text
            raise InputError(
                redact(
                    f"--tokenizer server: POST {self.root}{endpoint}: {problem} (the server needs "
                    "vLLM's /tokenize; else give a local tokenizer directory)",
                    self._key,
                )
            )
        try:
            return json.loads(text)
        except ValueError:
            raise InputError(f"--tokenizer server: POST {self.root}{endpoint}: not JSON") from None

    def _tokens(self, body: dict[str, Any]) -> list[int]:
        key = json.dumps(body, sort_keys=True)
        if (found := self._answers.get(key)) is None:
            answer = self._post("/tokenize", body)
            if not isinstance(answer.get("tokens"), list):
                raise InputError(
                    f"--tokenizer server: POST {self.root}/tokenize: no 'tokens' list in the answer"
                )
            found = [int(t) for t in answer["tokens"]]
            if len(self._answers) < _MAX_CACHED:
                self._answers[key] = found
        return found

    def encode(self, text: str) -> list[int]:
        """Text as the server's ``/tokenize`` encodes it (special tokens in it parsed on vLLM and
        ``kvbench serve``), no special tokens added."""
        return self._tokens({"prompt": text, "add_special_tokens": False})

    def decode(self, token_ids: Sequence[int]) -> str:
        return str(self._post("/detokenize", {"tokens": [int(t) for t in token_ids]}).get("prompt", ""))

    def render_messages(self, messages: Sequence[Message]) -> np.ndarray:
        body = {"messages": [m.as_dict() for m in messages], "add_generation_prompt": True}
        return np.asarray(self._tokens(body), dtype=np.uint32)

    def render_prompt(self, prompt: str) -> np.ndarray:
        return np.asarray(self._tokens({"prompt": prompt, "add_special_tokens": True}), dtype=np.uint32)

    def render(self, request: Any) -> np.ndarray:
        return render(self, request)
