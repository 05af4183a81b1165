"""A run is a plan: every ``--backend`` has a registered planner, a plan built by hand runs through
the one executor, and the executor's notes and end hooks behave the same for every backend."""

import contextlib

import numpy as np
import pyarrow.parquet as pq
import pytest

from kvbench.request import Request, RequestRecord, Status
from kvbench.results.parquet import read_metadata
from kvbench.run.config import BackendKind
from kvbench.run.execute import execute
from kvbench.run.loop import LoadConfig
from kvbench.run.plan import RunPlan, planner_for, register_backend


class EchoBackend:
    """A backend in a few lines: every prompt served at once, half of it cached."""

    def __init__(self) -> None:
        self.served: list[int] = []

    async def serve(self, request: Request) -> RequestRecord:
        self.served.append(request.index)
        return RequestRecord(
            status=Status.OK,
            prompt_tokens=request.prompt_tokens,
            cached_prompt_tokens=request.prompt_tokens // 2,
            output_tokens=2,
            ttft_ms=1.0,
            itl_ms=(2.0,),
        )

    def describe(self) -> dict:
        return {"backend": "echo", "model": "none", "cache_enabled": True, "block_size": 4}


def test_every_backend_kind_has_a_registered_planner():
    planners = {kind: planner_for(kind) for kind in BackendKind}
    assert {kind: planner.__name__ for kind, planner in planners.items()} == {
        BackendKind.INPROCESS: "inprocess_plan",
        BackendKind.OPENAI: "openai_plan",
        BackendKind.ANTHROPIC: "anthropic_plan",
    }


def test_a_second_planner_for_one_backend_is_refused():
    planner_for(BackendKind.OPENAI)  # the registry is filled
    with pytest.raises(ValueError, match="--backend openai has a planner already"):
        register_backend(BackendKind.OPENAI)(lambda config, say, stack: None)


def _plan(tmp_path, backend, **hooks) -> RunPlan:
    requests = [
        Request(i, f"r{i}", f"s{i}", 0, np.arange(8 + i, dtype=np.uint32), max_tokens=2) for i in range(3)
    ]
    metadata = {"command": "run", "run": {"run_id": "echo-1", "scenario": "echo"}}
    return RunPlan(requests, backend, LoadConfig(), tmp_path / "echo.parquet", metadata, **hooks)


def test_a_plan_built_by_hand_runs_through_the_one_executor(tmp_path):
    backend, ended = EchoBackend(), []
    plan = _plan(
        tmp_path,
        backend,
        on_end=lambda records: plan.metadata["run"].update(ended=len(records)) or ended.append(1),
        notes=["before the run"],
        finish=lambda outcome: outcome.notes.append("finished") or False,
        num_asked=10,
        num_source_requests=3,
    )
    outcome = execute(plan)
    assert backend.served == [0, 1, 2]
    assert [row.cached_prompt_tokens for row in outcome.rows] == [4, 4, 5]
    assert outcome.notes == [
        "before the run",
        "--requests 10: the source has only 3 requests; all of them were run",
        "finished",
    ]
    table = pq.read_table(plan.out)
    assert table.column("cached_prompt_tokens").to_pylist() == [4, 4, 5]
    assert table.column("backend").to_pylist() == ["echo"] * 3
    metadata = read_metadata(plan.out)
    assert (metadata["complete"], metadata["run"]["ended"], ended) == (False, 3, [1])


def test_the_end_hook_runs_when_the_backend_breaks(tmp_path):
    class Broken(EchoBackend):
        async def serve(self, request):
            if request.index == 1:
                raise RuntimeError("the model is gone")
            return await super().serve(request)

    plan = _plan(tmp_path, Broken(), on_end=lambda records: plan.metadata["run"].update(ended=len(records)))
    with pytest.raises(RuntimeError, match="the model is gone"), contextlib.suppress(KeyboardInterrupt):
        execute(plan)
    metadata = read_metadata(plan.out)
    assert (metadata["complete"], metadata["run"]["ended"]) == (False, 1)
