"""Save a model as a complete local Hugging Face checkpoint that vLLM and transformers both load.

``kvbench model export DIR`` writes, for the default random model::

    config.json               LlamaConfig (8 layers, hidden 512, cl100k vocabulary, fp32)
    model.safetensors         the seeded random weights (tied embeddings stored once)
    generation_config.json    EOS = <|endoftext|> or <|im_end|> (ChatML)
    tokenizer.json            cl100k + ChatML (:mod:`kvbench.engine.tokenizer_export`), checked
    tokenizer_config.json     against the reference tokenizer the caller passes (kvbench's own)

With ``--model PATH`` the checkpoint is loaded and re-saved with its own tokenizer and template.
engine/ imports nothing from workloads/, so the reference tokenizer is an argument.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvbench.constants import CHATML_EOS_TOKEN_IDS
from kvbench.engine.model import CL100K_ENDOFTEXT_ID, LoadedModel
from kvbench.engine.tokenizer_export import ReferenceTokenizer, export_cl100k_tokenizer
from kvbench.errors import InputError


@dataclass(frozen=True)
class ExportResult:
    """What :func:`export_model` wrote.

    Attributes:
        path: the checkpoint directory.
        files: file names written, sorted.
        num_parameters: parameters of the model (tied weights counted once).
        num_checked_texts: sample texts and chat conversations whose ids were checked (0 for a
            checkpoint's own tokenizer, which has no kvbench reference to check against).
    """

    path: Path
    files: tuple[str, ...]
    num_parameters: int
    num_checked_texts: int


def export_model(
    out_dir: str | Path,
    loaded: LoadedModel,
    overwrite: bool = False,
    reference: ReferenceTokenizer | None = None,
) -> ExportResult:
    """Write ``loaded`` as a checkpoint directory (module docstring).

    ``loaded.tokenizer is None`` (kvbench's default model): the cl100k tokenizer files are written
    and checked against ``reference`` (kvbench's own cl100k tokenizer,
    ``kvbench.workloads.tokenizer.TiktokenTokenizer()``; :mod:`kvbench.engine.tokenizer_export`), and
    the generation config's EOS is ChatML's. Otherwise the checkpoint's own tokenizer and
    generation config are saved.

    Raises:
        InputError: ``out_dir`` exists and is not empty (unless ``overwrite``), or cannot be written.
        ValueError: the default model without a ``reference``.
        ExportCheckError: the exported tokenizer's ids differ from ``reference``'s.
    """
    if loaded.tokenizer is None and reference is None:
        raise ValueError("a model without its own tokenizer needs the reference tokenizer to check against")
    out_dir = Path(out_dir).expanduser()
    _prepare_directory(out_dir, overwrite)
    model = loaded.model
    try:
        model.generation_config = _generation_config(loaded, CHATML_EOS_TOKEN_IDS)
        model.save_pretrained(out_dir, safe_serialization=True)
        if loaded.tokenizer is not None:
            loaded.tokenizer.save_pretrained(out_dir)
    except OSError as exc:
        raise InputError(f"{out_dir}: cannot write the checkpoint ({exc.strerror or exc})") from None
    checked = 0
    if loaded.tokenizer is None:
        try:
            checked = export_cl100k_tokenizer(out_dir, reference)
        except OSError as exc:
            raise InputError(f"{out_dir}: cannot write the tokenizer ({exc.strerror or exc})") from None
    _readable_files(out_dir)
    num_parameters = sum(p.numel() for p in model.parameters())  # parameters() lists a tied weight once
    files = tuple(sorted(p.name for p in out_dir.iterdir()))
    return ExportResult(out_dir, files, num_parameters, checked)


def _readable_files(out_dir: Path) -> None:
    """Give every exported file the mode a plain ``open()`` would (0666 less the umask): safetensors
    writes its file with mode 0600, which other users and containers then cannot read."""
    umask = os.umask(0)
    os.umask(umask)
    for path in out_dir.iterdir():
        if path.is_file():
            path.chmod(0o666 & ~umask)


def _generation_config(loaded: LoadedModel, eos_token_ids: Sequence[int]) -> Any:
    """The model's generation config; for the default model, EOS = any of ``eos_token_ids``."""
    from transformers import GenerationConfig

    if loaded.tokenizer is not None and getattr(loaded.model, "generation_config", None) is not None:
        return loaded.model.generation_config
    return GenerationConfig(bos_token_id=CL100K_ENDOFTEXT_ID, eos_token_id=list(eos_token_ids))


def _prepare_directory(out_dir: Path, overwrite: bool) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"{out_dir}: exists and is not a directory")
    if out_dir.is_dir() and any(out_dir.iterdir()):
        if not overwrite:
            raise InputError(f"{out_dir}: directory is not empty (pass --overwrite to replace it)")
        shutil.rmtree(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"{out_dir}: cannot create ({exc.strerror})") from None
