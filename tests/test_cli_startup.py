"""``kvbench sim`` imports only its own command module; every command word maps to its module."""

import subprocess
import sys
from pathlib import Path

import typer

from kvbench import cli

REPO = Path(__file__).resolve().parents[1]


def test_every_registered_command_word_is_mapped_to_its_module():
    for module, words in cli._COMMAND_MODULES.items():
        app = typer.Typer()

        @app.callback()
        def _root() -> None:
            pass

        __import__(module, fromlist=["register"]).register(app)
        names = {c.name for c in app.registered_commands} | {
            g.name or g.typer_instance.info.name for g in app.registered_groups
        }
        assert names == set(words), module


def test_sim_imports_no_other_command_and_nothing_heavy():
    probe = (
        "import sys\nfrom kvbench.cli import main\ntry:\n    main(['sim', '--help'])\nexcept SystemExit:\n  "
        "  pass\n"
        "print(' '.join(sorted(sys.modules)))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, check=True)
    loaded = set(done.stdout.strip().splitlines()[-1].split())
    assert "kvbench.commands.sim" in loaded
    others = {
        m
        for m in loaded
        if m.startswith("kvbench.commands.")
        and m.split(".")[2] in {name.split(".")[2] for name in cli._COMMAND_MODULES} - {"sim"}
    }
    assert others == set()
    assert not loaded & {"torch", "transformers", "fastapi", "uvicorn", "openai", "matplotlib", "httpx"}
