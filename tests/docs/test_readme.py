"""The README stays a front page (<= 15 KB) whose links all lead somewhere, and keeps the
two set-up commands .ci/run and the lead rely on."""

import re

from site_paths import REPO

README = (REPO / "README.md").read_text(encoding="utf-8")
SETUP = "python3 -m venv .venv && . .venv/bin/activate && pip install -c constraints-cpu.txt -e '.[{}]'"


def test_the_readme_is_at_most_15_kb():
    assert len(README.encode("utf-8")) <= 15 * 1024


def test_every_relative_link_of_the_readme_exists():
    targets = [t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", README) if "://" not in t]
    assert targets and [t for t in targets if not (REPO / t).exists()] == []


def test_the_two_set_up_commands_are_there():
    assert SETUP.format("all") + " && kvbench run scenarios/shared_2k.toml" in README
    assert SETUP.format("test") + " && pytest" in README
