"""A local Hugging Face checkpoint's tokenizer and chat template, behind kvbench's ``Tokenizer``
protocol (:mod:`kvbench.workloads.tokenizer`). It lives in engine/ because it needs transformers;
``kvbench.workloads.tokenizer.load_tokenizer(PATH)`` loads it. Never downloads.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from transformers import AutoTokenizer

from kvbench.constants import CHATML, IM_END, IM_START
from kvbench.errors import InputError
from kvbench.request import Message


class HFTokenizer:
    """A local Hugging Face checkpoint's tokenizer and chat template (never downloads).

    Messages go through the checkpoint's chat template (``add_generation_prompt=True``) rendered
    to text and encoded without adding special tokens (the template writes them), as vLLM does;
    without a template, through the ``chatml`` text template above (whether ``<|im_start|>`` is one
    token then depends on the vocabulary). Plain prompts are encoded with the tokenizer's special
    tokens added (e.g. BOS), as a completions endpoint does.

    Raises:
        InputError: ``path`` is not a directory with a loadable tokenizer.
    """

    splits_at_lines = False

    def __init__(self, path: str | Path) -> None:
        path = Path(path)
        if not path.is_dir():
            raise InputError(f"{path}: not a directory (expected a local Hugging Face checkpoint)")
        try:
            self._tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        except (OSError, ValueError) as exc:
            raise InputError(f"{path}: cannot load a tokenizer ({str(exc).splitlines()[0]})") from None
        self.name = f"hf:{path}"
        template = getattr(self._tokenizer, "chat_template", None)
        self._template = template if isinstance(template, str) and template else None
        self.chat_format = (
            f"hf-template:{hashlib.sha256(self._template.encode()).hexdigest()[:12]}"
            if self._template
            else CHATML
        )

    def encode(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=False))

    def decode(self, token_ids: Sequence[int]) -> str:
        return self._tokenizer.decode([int(t) for t in token_ids], skip_special_tokens=False)

    def render_messages(self, messages: Sequence[Message]) -> np.ndarray:
        dicts = [m.as_dict() for m in messages]
        if self._template:
            text = self._tokenizer.apply_chat_template(dicts, tokenize=False, add_generation_prompt=True)
        else:
            text = "".join(f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n" for m in dicts)
            text += f"{IM_START}assistant\n"
        return np.asarray(self.encode(text), dtype=np.uint32)

    def render_prompt(self, prompt: str) -> np.ndarray:
        return np.asarray(self._tokenizer.encode(prompt, add_special_tokens=True), dtype=np.uint32)

    def render(self, request: Any) -> np.ndarray:
        """A request's prompt token ids: its ``messages`` or its ``prompt``; shape (n,), uint32."""
        if request.messages is not None:
            return self.render_messages(request.messages)
        return self.render_prompt(request.prompt or "")
