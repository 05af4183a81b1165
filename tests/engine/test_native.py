"""engine/few_rows.py: kvbench's few-row linear, built by the real compiler, against torch's linear."""

import os
import shutil
import sys

import pytest
import torch

from kvbench.engine import native
from kvbench.engine.cpu_kernels import FEW_ROWS, FewRowLinear, SmallBatchLinear, use_few_row_linears
from kvbench.engine.model import default_llama_config, random_model
from kvbench.engine.native import build, load, native_kernels, native_kernels_reason
from kvbench.memory.layout import DType

needs_kernel = pytest.mark.skipif(
    native_kernels() is None, reason=f"no few-row kernel here: {native_kernels_reason()}"
)


@pytest.fixture
def rebuilt(monkeypatch, tmp_path):
    """A process that has not built the kernel yet, with an empty cache folder; the real one after."""
    monkeypatch.setenv("KVBENCH_CACHE_DIR", str(tmp_path))
    native._built.cache_clear()
    yield tmp_path
    native._built.cache_clear()


def _inputs(num_rows, out_features, in_features, seed):
    generator = torch.Generator().manual_seed(seed)
    return (
        torch.randn(num_rows, in_features, generator=generator),
        torch.randn(out_features, in_features, generator=generator),
        torch.randn(out_features, generator=generator),
    )


@needs_kernel
@pytest.mark.parametrize("num_rows", [1, 2, 3, 4, 5, 7, 8, 13, 48])
@pytest.mark.parametrize(
    "out_features, in_features", [(1, 1), (3, 15), (4, 16), (13, 17), (100, 512), (1031, 96)]
)
def test_values_are_torch_s_linear_for_every_shape_and_tail(num_rows, out_features, in_features):
    x, weight, bias = _inputs(num_rows, out_features, in_features, seed=num_rows * 1000 + out_features)
    kernel = native_kernels()
    torch.testing.assert_close(
        kernel.linear(x, weight), x @ weight.T, rtol=1e-5, atol=1e-5 * in_features**0.5
    )
    torch.testing.assert_close(
        kernel.linear(x, weight, bias), x @ weight.T + bias, rtol=1e-5, atol=1e-5 * in_features**0.5
    )


@needs_kernel
def test_a_row_s_result_does_not_depend_on_the_rows_or_threads_beside_it():
    x, weight, _ = _inputs(37, 1030, 200, seed=5)
    kernel = native_kernels()
    alone = torch.cat([kernel.linear(x[i : i + 1], weight) for i in range(37)])
    before = torch.get_num_threads()
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            for num_rows in (2, 5, 8, 37):
                assert torch.equal(kernel.linear(x[:num_rows], weight), alone[:num_rows]), (threads, num_rows)
    finally:
        torch.set_num_threads(before)


@needs_kernel
def test_leading_dimensions_are_kept_and_a_strided_input_is_read_right():
    x, weight, bias = _inputs(6, 40, 24, seed=2)
    kernel = native_kernels()
    assert kernel.linear(x.reshape(2, 3, 24), weight).shape == (2, 3, 40)
    strided = torch.randn(24, 6).T  # not contiguous
    torch.testing.assert_close(
        kernel.linear(strided, weight, bias), strided @ weight.T + bias, rtol=1e-5, atol=1e-4
    )


@needs_kernel
def test_a_strided_bias_and_weight_are_read_right():  # a copy's pointer must outlive the call
    x, weight, bias = _inputs(3, 100_001, 16, seed=9)
    strided_bias = torch.randn(2 * 100_001)[::2]
    strided_weight = torch.randn(16, 100_001).T  # (100_001, 16), not contiguous
    got = native_kernels().linear(x, strided_weight, strided_bias)
    torch.testing.assert_close(got, x @ strided_weight.T + strided_bias, rtol=1e-5, atol=1e-4)


@needs_kernel
def test_a_damaged_library_in_the_cache_is_built_again(rebuilt):
    path = native.library_path(native.compiler())
    path.parent.mkdir(parents=True)
    path.write_bytes(b"garbage")
    assert native_kernels() is not None and path.stat().st_size > 1000


_PROBE = (
    "import torch; from kvbench.engine.native import native_kernels, native_kernels_reason; "
    "k = native_kernels(); x = torch.ones(3, 64); "
    "ok = k is not None and bool(torch.allclose(k.linear(x, x), x @ x.T)); "
    "print(k is not None, native_kernels_reason(), ok)"
)


def _replace(path, data):
    """``path``'s bytes replaced by a new file (this process has the old one mapped: writing into it
    would crash this process, not test the next one)."""
    scratch = path.with_name("scratch")
    scratch.write_bytes(data)
    os.replace(scratch, path)


def _probe(cache_folder):
    """A fresh process's kernels, reason and one linear's check, with ``cache_folder`` as its cache."""
    return native.subprocess.run(
        [sys.executable, "-c", _PROBE],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "KVBENCH_CACHE_DIR": str(cache_folder)},
    )


@needs_kernel
def test_a_foreign_library_in_the_cache_is_replaced_before_it_is_loaded(rebuilt, tmp_path):
    path = native.library_path(native.compiler())
    path.parent.mkdir(parents=True)
    foreign = tmp_path / "foreign.c"
    foreign.write_text("int unrelated(void) { return 0; }\n")
    native.subprocess.run([*native.compiler(), "-shared", "-fPIC", str(foreign), "-o", str(path)], check=True)
    runs = [_probe(rebuilt) for _ in range(2)]
    assert [(run.returncode, run.stdout.split(" ")[:3]) for run in runs] == [
        (0, ["True", "built", "for"])
    ] * 2
    assert all(run.stdout.strip().endswith("True") for run in runs)


@needs_kernel
@pytest.mark.parametrize("kept_bytes", [1000, 4000, 12000, 20000])
def test_a_truncated_library_in_the_cache_is_built_again_not_loaded(rebuilt, kept_bytes):
    """A shared object cut short loads, then dies with SIGBUS at the first call (exit 135): the size and
    checksum recorded at build time catch it first, and the file is replaced."""
    assert native_kernels() is not None
    path = native_kernels().library
    whole = path.read_bytes()
    _replace(path, whole[:kept_bytes])
    run = _probe(rebuilt)
    assert (run.returncode, run.stdout.split(" ")[0], run.stdout.strip()[-4:]) == (0, "True", "True"), (
        run.stderr
    )
    assert path.read_bytes() == whole


@needs_kernel
def test_a_library_built_from_other_source_under_the_current_name_is_built_again(rebuilt, tmp_path):
    """The name says which source, compiler and CPU; a file built otherwise (another instruction set
    here, with or without a manifest of its own) is not loaded under it."""
    assert native_kernels() is not None
    path = native_kernels().library
    whole = path.read_bytes()
    other = tmp_path / "other.so"
    build(native.compiler(), other, extra_flags=("-mno-avx512f", "-DKVB_OTHER_SOURCE=1"))
    assert other.read_bytes() != whole
    for with_manifest in (False, True):
        _replace(path, other.read_bytes())
        if with_manifest:  # its own manifest, true for its bytes, but for another build key
            native.manifest_path(path).write_bytes(native.manifest_path(other).read_bytes())
        native._built.cache_clear()
        assert native.unverified(path, native.library_key(native.compiler())) is not None
        assert native_kernels() is not None and path.read_bytes() == whole


@needs_kernel
def test_a_compiler_command_with_a_wrapper_is_split(rebuilt, monkeypatch):
    monkeypatch.setenv("CXX", f"env {native.compiler()[-1]}")
    assert native.compiler() == ["env", native.compiler()[-1]]
    assert native_kernels() is not None and native_kernels_reason().startswith("built for ")


@needs_kernel
def test_the_avx2_path_computes_the_same_values(tmp_path):  # the linear and the paged decode
    target = tmp_path / "native-avx2.so"
    build(native.compiler(), target, extra_flags=("-mno-avx512f",))
    kernel = load(target)
    assert kernel.isa == "avx2"
    for num_rows, out_features, in_features in [(2, 9, 7), (8, 131, 64), (5, 64, 1000)]:
        x, weight, bias = _inputs(num_rows, out_features, in_features, seed=in_features)
        torch.testing.assert_close(kernel.linear(x, weight, bias), x @ weight.T + bias, rtol=1e-5, atol=1e-4)
    generator = torch.Generator().manual_seed(1)
    query, keys, values = (
        torch.randn(2, 4, 20, generator=generator),
        *torch.randn(2, 2, 6, 8, 20, generator=generator),
    )
    tables, lengths = (
        torch.tensor([[3, 1, 0], [5, 4, 2]], dtype=torch.int32),
        torch.tensor([19, 9], dtype=torch.int32),
    )
    got = kernel.paged_decode(query, keys, values, tables, lengths, 0.2)  # (2, 4, 20)
    for i, length in enumerate(lengths.tolist()):
        k, v = (t[:, tables[i].long()].flatten(1, 2)[:, :length] for t in (keys, values))  # (kv_heads, kv, d)
        ref = torch.nn.functional.scaled_dot_product_attention(
            query[i][:, None], k.repeat_interleave(2, 0), v.repeat_interleave(2, 0), scale=0.2
        )[:, 0]
        torch.testing.assert_close(got[i], ref, rtol=1e-5, atol=1e-5)


@needs_kernel
def test_a_first_build_lands_in_the_cache_folder_and_the_second_process_reuses_it(rebuilt):
    kernel = native_kernels()
    assert kernel is not None and kernel.library.parent == rebuilt / "kernels"
    assert native_kernels_reason() == f"built for {kernel.isa} with {native.Path(native.compiler()[-1]).name}"
    built_at = kernel.library.stat().st_mtime_ns
    native._built.cache_clear()
    assert native_kernels().library == kernel.library and kernel.library.stat().st_mtime_ns == built_at
    # no scratch left behind: the library and its manifest
    assert sorted(p.name for p in (rebuilt / "kernels").iterdir()) == sorted(
        [kernel.library.name, native.manifest_path(kernel.library).name]
    )


def test_a_failing_compiler_leaves_torch_s_linears_with_the_reason(rebuilt, monkeypatch):
    monkeypatch.setenv("CXX", shutil.which("false") or "/bin/false")
    assert native_kernels() is None
    assert native_kernels_reason() == "not built: false failed: exit code 1, no message"
    model = random_model(
        default_llama_config(
            hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2, head_dim=32
        ),
        seed=1,
    )
    assert type(model.model.get_output_embeddings()) is SmallBatchLinear  # the oneDNN fallback for the head
    assert not any(isinstance(m, FewRowLinear) for m in model.model.modules())


def test_a_missing_compiler_and_the_switch_say_why(rebuilt, monkeypatch):
    monkeypatch.setenv("CXX", str(rebuilt / "no-such-compiler"))
    assert native_kernels() is None and native_kernels_reason().startswith("not built: [Errno 2]")
    monkeypatch.setenv("KVBENCH_NATIVE_KERNELS", "0")
    assert native_kernels() is None and native_kernels_reason() == "KVBENCH_NATIVE_KERNELS=0"
    for value in ("off", "false", "no", "OFF"):
        monkeypatch.setenv("KVBENCH_NATIVE_KERNELS", value)
        assert native_kernels() is None and native_kernels_reason() == f"KVBENCH_NATIVE_KERNELS={value}"


def test_a_compiler_variable_that_does_not_split_falls_back_with_the_reason(rebuilt, monkeypatch):
    monkeypatch.setenv("CXX", "'")
    assert native_kernels() is None and 'CXX="\'" is not a command' in native_kernels_reason()


@needs_kernel
def test_every_linear_of_a_model_uses_it_with_its_weights_ties_and_keys_and_one_row_keeps_its_bits():
    loaded = random_model(
        default_llama_config(
            hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, head_dim=32
        ),
        seed=3,
    )
    model = loaded.model
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert len(linears) == 2 * 7 + 1 and all(type(m) is FewRowLinear for m in linears)
    assert use_few_row_linears(model) == 15  # idempotent
    head = model.get_output_embeddings()
    assert head.weight is model.get_input_embeddings().weight and "lm_head.weight" in model.state_dict()
    for num_rows in (1, 2, 8, 48, 49, 64):
        x = torch.randn(1, num_rows, 64, generator=torch.Generator().manual_seed(num_rows))
        with torch.inference_mode():
            got, plain = head(x), torch.nn.functional.linear(x, head.weight)
        if num_rows in FEW_ROWS:
            torch.testing.assert_close(got, plain, rtol=1e-5, atol=1e-4)
        else:
            assert torch.equal(got, plain)  # MKL, as before: one-row forwards are unchanged


@needs_kernel
def test_autograd_gets_torch_s_linear():
    linear = torch.nn.Linear(16, 8)
    linear.__class__ = FewRowLinear
    x = torch.randn(4, 16, requires_grad=True)
    out = linear(x)
    assert out.grad_fn is not None
    out.sum().backward()
    assert x.grad is not None and linear.weight.grad is not None
    with torch.inference_mode():
        assert linear(torch.randn(4, 16)).grad_fn is None  # the kernel, where nothing records


def test_a_random_model_leaves_the_caller_s_config_alone():
    config = default_llama_config(
        hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2, head_dim=32
    )
    before = config._attn_implementation
    random_model(config, seed=1)
    assert config._attn_implementation == before


def test_a_bf16_model_is_left_to_torch():
    loaded = random_model(
        default_llama_config(
            hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2, head_dim=32
        ),
        seed=1,
        dtype=DType.BF16,
    )
    assert use_few_row_linears(loaded.model) == 0
    assert not any(isinstance(m, FewRowLinear) for m in loaded.model.modules())
