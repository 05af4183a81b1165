"""``kvbench model export DIR``: the model as a local checkpoint that vLLM and transformers both load."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kvbench.commands.common import make_console

model_app = typer.Typer(help="The model kvbench runs, as files other servers can load.", no_args_is_help=True)


@model_app.command("export")
def export(
    out_dir: Annotated[Path, typer.Argument(help="Directory to write the checkpoint into (created).")],
    model: Annotated[
        Path | None,
        typer.Option(
            "--model", help="A local Hugging Face checkpoint to re-save instead of kvbench's default model."
        ),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the default model's random weights.")] = 0,
    overwrite: Annotated[bool, typer.Option(help="Replace a non-empty DIR.")] = False,
) -> None:
    """Write the default model (or --model PATH) as config + safetensors + tokenizer + chat template.

    The default model's tokenizer is cl100k_base converted to tokenizer.json, with kvbench's ChatML
    chat template; the export checks that it reproduces kvbench's token ids on sample texts and chats.
    Serve it with vLLM: python -m vllm.entrypoints.openai.api_server --model DIR --dtype float32 ...
    """
    from kvbench.engine.export import export_model
    from kvbench.engine.model import ModelConfig, load_model
    from kvbench.workloads.tokenizer import TiktokenTokenizer

    console = make_console()
    with console.status("loading the model"):
        loaded = load_model(ModelConfig(path=model, seed=seed))
    with console.status(f"writing {out_dir}"):
        result = export_model(out_dir, loaded, overwrite=overwrite, reference=TiktokenTokenizer())
    console.print(f"exported {loaded.name} ({result.num_parameters:,} parameters) to {result.path}")
    console.print(f"files: {', '.join(result.files)}")
    if result.num_checked_texts:
        console.print(f"tokenizer check: {result.num_checked_texts} texts and chats give kvbench's ids")


def register(app: typer.Typer) -> None:
    app.add_typer(model_app, name="model")
