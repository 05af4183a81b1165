"""Every test marked by kind, in one place: ``engine`` (loads the torch model), ``server`` (starts
``kvbench serve`` or another HTTP server), ``slow`` (> ~5 s on a quiet 2-core machine, or a
``kvbench serve`` child process). tests/conftest.py calls :func:`mark_by_kind` from
``pytest_collection_modifyitems``; marks put on by hand stay.

The fast loop is ``pytest -m "not slow"`` (its target: <= 3 min on a quiet 2-core machine);
``pytest`` runs all.
A test gets a kind from the fixtures it uses (directly or through other fixtures) or from its module
(or its node id) in the lists below: modules whose tests build a model, start a server or a child
process in the test body. When a new module does that, add it here; tests/test_kinds.py checks
that every entry names a file and every test of a kvbench-serve fixture is deselected by "not slow".

Imported by its bare name (tests/ is on ``sys.path`` through tests/conftest.py)."""

import pytest

# A kvbench serve child process: imports torch and builds the default 8-layer model (10-60 s).
SERVE_FIXTURES = frozenset({"server", "serve_session", "paged_radix_server", "prompt_only_server"})
# In-process HTTP servers: uvicorn over the tiny model (tests/server), the fake servers (tests/backends).
HTTP_FIXTURES = frozenset({"live", "paged_live", "two_seq_server", "guarded", "fake_server", "failing_run"})
# Models: the engine tests' 2-layer one, the tiny one (server, peer, run checks), the breaks' and export's
# small ones, the default one.
MODEL_FIXTURES = frozenset({"loaded", "tiny_loaded", "small_model", "default_model"})

# Modules whose tests load the default model in the body, mostly through an in-process `kvbench run`.
ENGINE_MODULES = frozenset(
    {
        "tests/breaks/test_break_cli.py",
        "tests/breaks/test_breaks_paged.py",
        "tests/commands/test_cli_input_checks.py",
        "tests/commands/test_explain_cli.py",
        "tests/commands/test_interrupted_end_metadata.py",
        "tests/commands/test_memory_cli.py",
        "tests/commands/test_memory_paged_cli.py",
        "tests/commands/test_report_engine_cli.py",
        "tests/commands/test_result_cli.py",
        "tests/commands/test_run_checks.py",
        "tests/commands/test_run_cli.py",
        "tests/commands/test_run_kv_memory.py",
        "tests/commands/test_run_paged_cli.py",
        "tests/commands/test_run_paged_verify_cli.py",
        "tests/commands/test_serve_and_http.py",
        "tests/commands/test_sweep_cli.py",
        "tests/commands/test_sweep_engine_cli.py",
        "tests/engine/paged/test_attention.py",
        "tests/engine/paged/test_cuda.py",  # skipped without CUDA
        "tests/engine/paged/test_exit_with_work.py",
        "tests/engine/paged/test_in_flight_prefix.py",
        "tests/engine/test_cpu_kernels.py",
        "tests/engine/test_native.py",
        "tests/engine/test_one_query.py",
        "tests/engine/test_model.py",
        "tests/engine/test_threads.py",
        "tests/results/test_report.py",
        "tests/results/test_report_export.py",
        "tests/test_readme_api.py",
    }
)
# Modules that start a server of their own in the body (ServeProcess, LiveServer, FakeServer).
SERVER_MODULES = frozenset(
    {
        "tests/backends/test_routed.py",
        "tests/docs/test_recipe.py",
        "tests/peer/test_kvbench_server.py",
        "tests/server/test_fuzz_endpoints.py",
        "tests/server/test_guards_and_interop.py",
        "tests/test_core_install.py",
    }
)
# Slow for another reason than a kvbench serve fixture: CPU seconds per test measured under
# `pytest -p rectime` (docs/_incoming/tests.md), here when > ~2 s or a module's many runs add up.
SLOW_MODULES = frozenset(
    {
        "tests/test_core_install.py",  # a fresh venv and pip install of the core
        "tests/docs/test_recipe.py",  # two kvbench serve and six commands
        "tests/commands/test_interrupted_end_metadata.py",  # 400-request runs cut by a signal after 10 s
        "tests/engine/paged/test_exit_with_work.py",  # a child process left with work in flight
        "tests/peer/test_kvbench_server.py",  # a kvbench serve child process on an exported checkpoint
        "tests/results/test_atomic_writes.py::test_sigkill_during_a_write_leaves_only_a_hidden_partial",
        "tests/commands/test_run_cli.py::test_sigterm_writes_what_was_measured_and_exits_130",
        # randomized state machines (hypothesis, 150-300 examples x 40 steps); the contract tests stay fast
        "tests/cache/test_cache_random.py",  # 8.5 s CPU
        "tests/cache/test_block_pool.py::TestBlockPoolRandomized",  # 2.0 s
        # many in-process runs of the default model each; test_run_cli's runs stay in the fast loop
        "tests/commands/test_run_paged_cli.py",  # 11.5 s CPU (10 tests)
        "tests/commands/test_run_paged_verify_cli.py",  # 9.5 s
        "tests/commands/test_memory_paged_cli.py",  # 5.4 s
        "tests/commands/test_report_engine_cli.py",  # 5.4 s, and a browser
        "tests/commands/test_sweep_engine_cli.py",  # 5.2 s
        "tests/commands/test_sweep_cli.py",  # 4.2 s
        "tests/commands/test_run_kv_memory.py",  # 2.9 s
        "tests/commands/test_sim_sampled_cli.py",  # 5.7 s (test_sim_cli keeps the sim command in)
        "tests/breaks/test_breaks_paged.py",  # 4.5 s
        "tests/breaks/test_views.py",  # 2.1 s
        "tests/commands/test_live_turns_http.py::test_an_in_process_run_takes_turns_live_too",  # 5.4 s
        "tests/commands/test_result_cli.py::test_json_gate_pass_and_fail",  # 3.1 s
        # the default 8-layer model through both engines, and whole shipped traces
        # 18 s x2
        "tests/engine/paged/test_paged_engine.py::test_default_model_outputs_equal_copy_engine_and_cache_off",
        # 23 s
        "tests/engine/paged/test_radix_engine.py::test_default_model_radix_outputs_equal_copy_radix_and_cache_off",
        "tests/engine/paged/test_paged_engine.py::test_preemption_by_recompute_keeps_outputs",  # 6.5 s
        # 5.5 s
        "tests/engine/paged/test_paged_engine.py::test_concurrent_requests_batched_agree_with_serial",
        # 5.0 s
        "tests/engine/paged/test_paged_engine.py::test_concurrent_requests_batch_invariant_are_exact",
        # 8.2 s
        "tests/commands/test_sim_cli.py::test_every_shipped_scenario_loads_by_name_and_from_the_scenarios_link",
        "tests/sim/test_hash_id_trace.py::test_the_mooncake_conversation_trace_reads_the_same",  # 5.7 + 2.0 s
        # 3.2 s
        "tests/breaks/test_tiny_hash.py::test_few_bits_give_false_hits_and_wrong_outputs_sha256_none",
        # 11 s
        "tests/engine/test_engine.py::test_cache_on_and_off_give_identical_greedy_outputs[default-hash]",
        "tests/engine/test_export.py::test_export_writes_a_complete_checkpoint",  # 6.1 s
        # 4.9 s
        "tests/engine/paged/test_radix_engine.py::test_concurrent_radix_requests_share_the_prefix_and_match_serial",
        # 4.9 s (250 examples)
        "tests/server/test_fuzz_endpoints.py::test_any_json_body_gets_a_200_or_an_openai_4xx",
        # 3.8 s
        "tests/sim/test_shards.py::test_the_shared_first_block_is_why_plain_sampling_misses_mooncake",
        "tests/memory/test_block_manager.py::TestBlockManagerRandomized",  # 3.1 s
    }
)


def _in(item: pytest.Item, entries: frozenset[str]) -> bool:
    """Whether ``item``'s module, its node id (with or without its parameters) or a parent's is in
    ``entries``."""
    parts = item.nodeid.split("[", 1)[0].split("::")
    return item.nodeid in entries or any(
        "::".join(parts[:end]) in entries for end in range(1, len(parts) + 1)
    )


def kinds_of(item: pytest.Item) -> set[str]:
    """The kinds of ``item`` ({"engine", "server", "slow"} or fewer), from its fixtures and the lists."""
    fixtures = set(getattr(item, "fixturenames", ()))
    kinds = set()
    if fixtures & MODEL_FIXTURES or _in(item, ENGINE_MODULES):
        kinds.add("engine")
    if fixtures & (SERVE_FIXTURES | HTTP_FIXTURES) or _in(item, SERVER_MODULES):
        kinds.add("server")
    if fixtures & SERVE_FIXTURES or _in(item, SLOW_MODULES):
        kinds.add("slow")
    if fixtures & SERVE_FIXTURES:
        kinds.add("engine")  # the serve process builds the default model
    return kinds


def mark_by_kind(items: list[pytest.Item]) -> None:
    """Add the ``engine`` / ``server`` / ``slow`` marks :func:`kinds_of` finds (hand marks stay)."""
    for item in items:
        for kind in sorted(kinds_of(item) - {mark.name for mark in item.iter_markers()}):
            item.add_marker(getattr(pytest.mark, kind))
