"""A request's prompt as one ChatML string, the reference for the tokenizer's cached rendering: encoding
the whole string in one call must give what ``render`` builds from per-message pieces."""

from kvbench.workloads.formats.kvbench_trace import TraceRequest
from kvbench.workloads.tokenizer import IM_END, IM_START


def chatml_text(request: TraceRequest) -> str:
    """The rendered prompt as one string with ChatML markers (a plain prompt as it is)."""
    if request.messages is None:
        return request.prompt or ""
    turns = "".join(f"{IM_START}{m.role}\n{m.content}{IM_END}\n" for m in request.messages)
    return f"{turns}{IM_START}assistant\n"
