"""Readable, deterministic text pieces for prompts: rules, tool schemas, questions, observations.

Every function takes a seeded ``numpy.random.Generator`` and nothing else random, so equal seeds
give equal text. Every *piece* starts with a non-whitespace character and ends with ``"\\n"``: at
such boundaries cl100k's tokenization splits exactly (``kvbench.workloads.tokenizer``), which is
what lets :mod:`kvbench.workloads.text_fit` assemble texts of an exact token length. A piece may
span several lines (a JSON schema, a stack trace, a function); inner lines may be indented.

Streams (``*_pieces``) are infinite iterators; the fitter takes what it needs. The words come from
:mod:`kvbench.workloads.vocabulary`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from kvbench.workloads.vocabulary import (
    COMPONENTS,
    DETAILS,
    DIRS,
    FILES,
    GOALS,
    LOG_EVENTS,
    LOG_LEVELS,
    PROJECTS,
    RULES,
    SENTENCES,
    SYMPTOMS,
)

FILLER_WORDS = (
    "please keep the answer short and clear and note each step in order with the name of "
    "the file and the line that changed and the reason it matters for the team so that "
    "the next person can follow the work without asking again"
).split()


def _sentence_case(phrase: str) -> str:
    return phrase[:1].upper() + phrase[1:]


def pick(rng: np.random.Generator, items: Sequence):
    """One item of ``items``, uniformly."""
    return items[int(rng.integers(len(items)))]


def file_path(rng: np.random.Generator) -> str:
    """A made-up source path such as ``src/core/retry.py``."""
    return f"{pick(rng, DIRS)}/{pick(rng, DIRS)}/{pick(rng, FILES)}.py"


@dataclass(frozen=True)
class Tool:
    """A made-up tool: name, description, parameters (name, JSON type, description), output style."""

    name: str
    description: str
    parameters: tuple[tuple[str, str, str], ...]
    observation: str  # "listing" | "code" | "json" | "logs" | "traceback"

    def schema(self) -> dict:
        """The tool as an OpenAI-style function schema."""
        properties = {name: {"type": kind, "description": text} for name, kind, text in self.parameters}
        return {
            "name": self.name,
            "description": self.description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": [name for name, _, _ in self.parameters[:1]],
            },
        }


AGENT_TOOLS = (
    Tool(
        "list_directory",
        "List the files under a directory of the repository.",
        (
            ("path", "string", "Directory relative to the repository root."),
            ("max_depth", "integer", "How deep to recurse; 1 lists only the directory."),
        ),
        "listing",
    ),
    Tool(
        "read_file",
        "Read a range of lines from a file.",
        (
            ("path", "string", "File relative to the repository root."),
            ("start_line", "integer", "First line to read, 1-based."),
            ("end_line", "integer", "Last line to read, inclusive."),
        ),
        "code",
    ),
    Tool(
        "search_code",
        "Search the repository for a regular expression.",
        (
            ("query", "string", "The pattern to search for."),
            ("path_glob", "string", "Only search files matching this glob."),
        ),
        "json",
    ),
    Tool(
        "run_tests",
        "Run a test target and return its output.",
        (("target", "string", "Test file or test id."), ("verbose", "boolean", "Print every test name.")),
        "traceback",
    ),
    Tool(
        "query_logs",
        "Fetch recent log lines of a service.",
        (
            ("service", "string", "Service name."),
            ("since_minutes", "integer", "How far back to look."),
            ("level", "string", "Minimum level: DEBUG, INFO, WARN or ERROR."),
        ),
        "logs",
    ),
    Tool(
        "http_get",
        "Call an internal HTTP endpoint and return the JSON body.",
        (
            ("url", "string", "Absolute URL inside the cluster."),
            ("timeout_s", "number", "Give up after this many seconds."),
        ),
        "json",
    ),
)


def made_up_tool(rng: np.random.Generator, index: int) -> Tool:
    """An extra tool with a generated name and schema (pads system prompts with realistic JSON)."""
    verb = pick(rng, ("get", "create", "update", "archive", "summarize", "validate", "export", "sync"))
    noun = pick(rng, ("invoice", "ticket", "customer", "order", "deployment", "report", "alert", "shipment"))
    params = [("id", "string", f"The {noun} id.")]
    for name, kind, text in (
        ("include_history", "boolean", "Also return past versions."),
        ("limit", "integer", "Maximum number of items."),
        ("region", "string", "Data region, e.g. eu-west-1."),
    ):
        if rng.random() < 0.6:
            params.append((name, kind, text))
    return Tool(
        f"{verb}_{noun}_v{index}",
        f"{verb.capitalize()} the {noun} in the back office system.",
        tuple(params),
        "json",
    )


def tool_spec(tool: Tool) -> str:
    """A tool's description and JSON schema as one piece."""
    return f"Tool {tool.name}:\n{json.dumps(tool.schema(), indent=2)}\n"


def question_lines(rng: np.random.Generator) -> Iterator[str]:
    """A user question: a short opening line with a ticket number (unique in practice), details."""
    yield f"Ticket #{int(rng.integers(100_000, 1_000_000))} ({pick(rng, PROJECTS)}):\n"
    yield f"{_sentence_case(pick(rng, COMPONENTS))} {pick(rng, SYMPTOMS)}.\n"
    yield f"How can I {pick(rng, GOALS)}?\n"
    while True:
        for index in rng.permutation(len(DETAILS)):
            yield DETAILS[index] + "\n"


def followup_lines(rng: np.random.Generator) -> Iterator[str]:
    """A follow-up user message in a conversation."""
    yield pick(rng, ("Thanks, that helps.\n", "One more thing:\n", "I tried that.\n", "Follow-up:\n"))
    yield f"Now {pick(rng, COMPONENTS)} {pick(rng, SYMPTOMS)}.\n"
    yield f"Can you help me {pick(rng, GOALS)}?\n"
    while True:
        yield pick(rng, DETAILS) + "\n"


def reply_pieces(rng: np.random.Generator) -> Iterator[str]:
    """An assistant reply: a short opener, then explanatory sentences, one per line."""
    yield pick(
        rng,
        (
            "Here is what I would check:\n",
            "Short answer first:\n",
            "Let's go step by step.\n",
            "Good question.\n",
            "This usually has one of three causes.\n",
        ),
    )
    while True:
        yield pick(rng, SENTENCES) + "\n"


def task_lines(rng: np.random.Generator) -> Iterator[str]:
    """An agent's task: a short opening line with a task number, then the problem and details."""
    yield f"Task {int(rng.integers(100_000, 1_000_000))} ({pick(rng, PROJECTS)}):\n"
    yield f"{_sentence_case(pick(rng, COMPONENTS))} {pick(rng, SYMPTOMS)}.\n"
    yield f"Your goal: {pick(rng, GOALS)}. Use the tools, then report what you changed.\n"
    while True:
        for index in rng.permutation(len(DETAILS)):
            yield DETAILS[index] + "\n"


def system_prompt_pieces(rng: np.random.Generator, role_line: str, tools: Sequence[Tool]) -> Iterator[str]:
    """A system prompt: role, numbered rules, tool schemas, then few-shot examples (endless)."""
    yield role_line
    yield "Rules:\n"
    order = rng.permutation(len(RULES))
    for number, index in enumerate(order[:10], start=1):
        yield f"{number}. {RULES[index]}\n"
    yield "Tools (call them with a JSON object of the arguments):\n"
    for tool in tools:
        yield tool_spec(tool)
    example = 1
    while True:
        question = (
            f"{_sentence_case(pick(rng, COMPONENTS))} {pick(rng, SYMPTOMS)}. How can I {pick(rng, GOALS)}?"
        )
        yield (
            f"Example {example}:\nUser: {question}\nAssistant: {pick(rng, SENTENCES)} "
            f"{pick(rng, SENTENCES)}\n"
        )
        example += 1


def _string_argument(rng: np.random.Generator, name: str) -> str:
    choices = {
        "service": PROJECTS,
        "level": ("INFO", "WARN", "ERROR"),
        "region": ("eu-west-1", "us-east-2"),
        "path_glob": ("src/**/*.py", "tests/*.py", "*.yaml"),
        "query": ("def retry_", "TimeoutError", "account_id", "TODO", "cache.get("),
    }
    if name in choices:
        return pick(rng, choices[name])
    return f"{pick(rng, FILES)}-{int(rng.integers(1000, 10_000))}"


def tool_call_line(rng: np.random.Generator, tool: Tool) -> str:
    """An assistant tool call as one JSON line, arguments drawn to fit the schema."""
    arguments: dict = {}
    for name, kind, _ in tool.parameters:
        if name == "end_line":
            arguments[name] = arguments.get("start_line", 1) + int(rng.integers(20, 120))
        elif name == "max_depth":
            arguments[name] = int(rng.integers(1, 4))
        elif kind == "integer":
            arguments[name] = int(rng.integers(1, 400))
        elif kind == "number":
            arguments[name] = float(rng.integers(1, 60))
        elif kind == "boolean":
            arguments[name] = bool(rng.random() < 0.5)
        elif name in ("path", "target"):
            directory = f"{pick(rng, DIRS)}/{pick(rng, DIRS)}"
            arguments[name] = directory if tool.name == "list_directory" else file_path(rng)
        elif name == "url":
            arguments[name] = f"http://{pick(rng, PROJECTS)}.internal/v1/status/{int(rng.integers(1000))}"
        else:
            arguments[name] = _string_argument(rng, name)
    return json.dumps({"tool": tool.name, "arguments": arguments}) + "\n"


def _log_line(rng: np.random.Generator) -> str:
    minute, second, milli = int(rng.integers(60)), int(rng.integers(60)), int(rng.integers(1000))
    event = pick(rng, LOG_EVENTS).format(n=int(rng.integers(1, 100_000)), ms=int(rng.integers(1, 5000)))
    return (
        f"2025-03-14T10:{minute:02d}:{second:02d}.{milli:03d}Z {pick(rng, LOG_LEVELS):<5} "
        f"[{pick(rng, PROJECTS)}] {event}\n"
    )


def _listing_line(rng: np.random.Generator) -> str:
    size = int(rng.integers(120, 90_000))
    day, minute = int(rng.integers(1, 29)), int(rng.integers(60))
    return f"-rw-r--r--  1 dev  staff  {size:>6}  Mar {day:>2} 09:{minute:02d}  {file_path(rng)}\n"


def _code_block(rng: np.random.Generator) -> str:
    name = f"{pick(rng, ('load', 'save', 'parse', 'retry', 'flush', 'render'))}_{pick(rng, FILES)}"
    return (
        f"def {name}(item, timeout_s={int(rng.integers(1, 60))}):\n"
        f'    """{pick(rng, SENTENCES)}"""\n'
        f"    result = client.call(item.id, timeout=timeout_s)\n"
        f"    if result.status != {pick(rng, (200, 201, 204))}:\n"
        f'        raise RuntimeError(f"{name} failed: {{result.status}}")\n'
        f"    return result.body\n"
    )


def _traceback(rng: np.random.Generator) -> str:
    frames = "".join(
        f'  File "{file_path(rng)}", line {int(rng.integers(1, 900))}, in {pick(rng, FILES)}\n'
        f"    return handler(request)\n"
        for _ in range(int(rng.integers(2, 5)))
    )
    error = pick(
        rng,
        (
            "KeyError: 'account_id'",
            "TimeoutError: read timed out after 30.0s",
            "ValueError: invalid literal for int() with base 10: ''",
        ),
    )
    return f"Traceback (most recent call last):\n{frames}{error}\n"


def _json_result(rng: np.random.Generator) -> str:
    items = [
        {"path": file_path(rng), "line": int(rng.integers(1, 900)), "score": round(float(rng.random()), 3)}
        for _ in range(int(rng.integers(1, 4)))
    ]
    return json.dumps({"status": "ok", "matches": items}, indent=2) + "\n"


_OBSERVATION_PIECES = MappingProxyType(
    {
        "listing": _listing_line,
        "code": _code_block,
        "json": _json_result,
        "logs": _log_line,
        "traceback": _traceback,
    }
)


def observation_pieces(rng: np.random.Generator, tool: Tool, step: int) -> Iterator[str]:
    """A tool's output as pieces: a header line naming the tool and step, then its output style."""
    yield f"Observation {step} from {tool.name}:\n"
    make = _OBSERVATION_PIECES[tool.observation]
    if tool.observation == "traceback":
        yield f"FAILED {file_path(rng)}::test_{pick(rng, FILES)} - {int(rng.integers(1, 9))} failed\n"
    while True:
        yield make(rng) if tool.observation != "traceback" else pick(rng, (_traceback, _log_line))(rng)


def document_pieces(rng: np.random.Generator) -> Iterator[str]:
    """Mixed document text (prose, logs, code, listings): the body of Mooncake blocks."""
    makers = (lambda r: pick(r, SENTENCES) + "\n", _log_line, _code_block, _listing_line, _json_result)
    while True:
        yield pick(rng, makers)(rng)
