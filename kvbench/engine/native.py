"""kvbench's native CPU kernels: a linear for a few rows, and paged decode attention.

**A linear for a few rows: the batched decode's GEMMs at the speed of one row.**

A decode step over ``n`` sequences multiplies ``n`` rows by every weight of the model, once per
layer and once by the LM head. With a few rows that is memory bound: one pass over each weight
is the floor, and one row reaches it (MKL's GEMV). Torch's kernels do not at 2-48 rows: MKL's
sgemm packs the weight again at every call and oneDNN's matmul, without prepacked weights,
reads it at about half the one-row speed. Measured on the default model, 1 thread, thread CPU
ms per call, medians of 7 (``benchmarks/cpu_kernels_bench.py`` prints the whole table; 2026-12-02):

=====================  ====  =====  ======  =======
weight (out x in)      rows  MKL    oneDNN  kvbench
=====================  ====  =====  ======  =======
LM head 100,277 x 512  1     22.9   25.2    (MKL)
LM head 100,277 x 512  8     84.3   36.9    28.7
gate/up 2,816 x 512    8     1.73   1.14    0.87
down 512 x 2,816       8     1.37   0.94    0.84
=====================  ====  =====  ======  =======

(a layer weight's time is per call with 64 weights cycled, so none is in a cache). The kernel
(``native.cc`` beside this module) holds a tile of 4 weight rows against 4 rows of x in vector
registers (AVX-512, or AVX2 with FMA), prefetches the next tiles, and sums every output in the
same order whatever the number of rows or threads: a row's result does not depend on the rows
batched with it.

**Paged decode attention** (:meth:`NativeKernels.paged_decode`): every decoding sequence's one
query against its context, read in place from the pool's blocks by block table, in one call per
layer; the ``kvbench-cpu`` attention kernel of :mod:`kvbench.engine.paged.kernels` (numbers there).

Both are compiled once per machine with the system's C++ compiler (``$CXX``, else
``c++``/``g++``; under a second) into ``$KVBENCH_CACHE_DIR/kernels`` (default
``~/.cache/kvbench/kernels``), named by a hash of the source, the compiler and the CPU's flags,
and loaded with ctypes; the call releases the GIL. Each build writes a manifest beside the library
(its size and SHA-256, the source's SHA-256, the build key); a file that does not match it (cut short,
foreign, built from other source) is never handed to the loader but built again.

Nothing depends on them: where there is no compiler, no AVX2, a build error or
``KVBENCH_NATIVE_KERNELS=0``, :func:`native_kernels` returns ``None`` with the reason in
:func:`native_kernels_reason`; the linears stay torch's (the LM head then uses oneDNN, as
``cpu_kernels.SmallBatchLinear`` does) and the decode attends with SDPA over gathered blocks.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("native.cc")
SWITCH_VARIABLE = "KVBENCH_NATIVE_KERNELS"  # "0" turns kvbench's own kernels off
CACHE_VARIABLE = "KVBENCH_CACHE_DIR"
COMPILE_FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++17")
COMPILE_TIMEOUT_S = 120


@dataclass(frozen=True)
class NativeKernels:
    """The loaded kernels: ``isa`` is the instruction set they were built for (``avx512`` or
    ``avx2``), ``library`` the shared object they came from."""

    isa: str
    library: Path
    _linear: ctypes._CFuncPtr
    _paged_decode: ctypes._CFuncPtr

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """``x @ weight.T + bias`` for fp32 CPU tensors: ``x`` (..., in_features), ``weight``
        (out_features, in_features), ``bias`` (out_features) or ``None`` (either copied first if not
        contiguous); returns
        (..., out_features). Uses ``torch.get_num_threads()`` threads. The caller checks dtypes and
        devices (``cpu_kernels.FewRowLinear`` does); a wrong one here is undefined."""
        rows = x.reshape(-1, weight.shape[1]).contiguous()
        weight = weight.contiguous()
        bias = None if bias is None else bias.contiguous()  # held here until the call returns
        out = torch.empty(rows.shape[0], weight.shape[0], dtype=torch.float32)
        self._linear(
            rows.data_ptr(),
            weight.data_ptr(),
            None if bias is None else bias.data_ptr(),
            out.data_ptr(),
            rows.shape[0],
            weight.shape[0],
            weight.shape[1],
            torch.get_num_threads(),
        )
        return out.reshape(*x.shape[:-1], weight.shape[0])

    def paged_decode(
        self,
        query: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        block_tables: torch.Tensor,
        lengths: torch.Tensor,
        scale: float,
    ) -> torch.Tensor:
        """Softmax attention of one query token per sequence over its first ``lengths[i]`` context
        tokens, read in place from one layer of the pool: ``query`` ``(n, heads, head_dim)`` fp32;
        ``keys``/``values`` ``(kv_heads, pages, block_size, head_dim)`` fp32, contiguous (a
        ``KVPool`` layer); ``block_tables`` ``(n, width)`` int32, each row the sequence's block ids
        (padded past its length); ``lengths`` ``(n,)`` int32, each in ``1 .. width * block_size``;
        ``scale`` multiplies the scores (``head_dim ** -0.5``). Query head ``j`` reads kv head
        ``j // (heads // kv_heads)`` (transformers' ``repeat_kv`` order). Returns ``(n, heads,
        head_dim)``. The caller checks shapes, dtypes and bounds (``kernels.KvbenchCpuDecode`` does)."""
        query, block_tables, lengths = query.contiguous(), block_tables.contiguous(), lengths.contiguous()
        out = torch.empty_like(query)
        num_kv_heads, num_pages, block_size, head_dim = keys.shape
        self._paged_decode(
            query.data_ptr(),
            keys.data_ptr(),
            values.data_ptr(),
            block_tables.data_ptr(),
            lengths.data_ptr(),
            out.data_ptr(),
            query.shape[0],
            query.shape[1],
            num_kv_heads,
            num_pages,
            block_size,
            head_dim,
            block_tables.shape[1],
            scale,
            torch.get_num_threads(),
        )
        return out


def cache_dir() -> Path:
    """Where kvbench keeps what it builds: ``$KVBENCH_CACHE_DIR``, else ``$XDG_CACHE_HOME/kvbench``,
    else ``~/.cache/kvbench``."""
    if os.environ.get(CACHE_VARIABLE):
        return Path(os.environ[CACHE_VARIABLE])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvbench"


def compiler() -> list[str] | None:
    """The C++ compiler command to build with: ``$CXX`` split as a shell splits it (``ccache g++``),
    else the first of ``c++``, ``g++``, ``clang++`` on PATH."""
    if os.environ.get("CXX", "").strip():
        return shlex.split(os.environ["CXX"])  # ValueError where it does not split (_built falls back)
    found = next((path for name in ("c++", "g++", "clang++") if (path := shutil.which(name))), None)
    return None if found is None else [found]


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
            return next((line for line in cpuinfo if line.startswith(("flags", "Features"))), "")
    except OSError:
        return ""


def library_key(cxx: list[str]) -> str:
    """The SHA-256 (hex) of what a build depends on: the source, the compiler command and version, the
    flags, the machine and the CPU's flags."""
    version = subprocess.run([*cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
    key = "\0".join(
        [
            SOURCE.read_text(),
            " ".join(cxx),
            version,
            " ".join(COMPILE_FLAGS),
            platform.machine(),
            _cpu_flags(),
        ]
    )
    return hashlib.sha256(key.encode()).hexdigest()


def library_path(cxx: list[str], key: str | None = None) -> Path:
    """The cached shared object for this source, compiler and CPU (``cache_dir()/kernels/native-HASH.so``,
    HASH the first 16 digits of :func:`library_key`)."""
    return cache_dir() / "kernels" / f"native-{(key or library_key(cxx))[:16]}.so"


def manifest_path(library: Path) -> Path:
    """The record :func:`build` writes beside ``library`` (``native-HASH.json``): its size, its SHA-256,
    the SHA-256 of the source it was built from and the build's :func:`library_key`."""
    return library.with_suffix(".json")


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def unverified(library: Path, key: str | None = None) -> str | None:
    """Why ``library`` must not be loaded, or ``None`` where its manifest vouches for it: the manifest
    is missing or unreadable, or the file's size or SHA-256, the source's SHA-256 or (when given) the
    build key differ from it. A truncated shared object passes ``dlopen`` and then dies with SIGBUS on
    the first call into a missing page, so the bytes are checked before the loader sees them."""
    try:
        manifest = json.loads(manifest_path(library).read_text())
        data = library.read_bytes()
    except (OSError, ValueError) as exc:
        return f"no readable manifest ({exc.__class__.__name__})"
    expected = {
        "size_bytes": len(data),
        "sha256": _digest(data),
        "source_sha256": _digest(SOURCE.read_bytes()),
        **({} if key is None else {"key": key}),
    }
    wrong = [
        name
        for name, value in expected.items()
        if not isinstance(manifest, dict) or manifest.get(name) != value
    ]
    return f"{', '.join(wrong)} differ from its manifest" if wrong else None


def build(cxx: list[str], target: Path, extra_flags: tuple[str, ...] = (), key: str | None = None) -> None:
    """Compile :data:`SOURCE` into ``target`` with :data:`COMPILE_FLAGS` and ``extra_flags`` (after
    them, so ``-mno-avx512f`` builds the AVX2 path) into a file written whole or not at all, so
    processes building at once never load half a file, and write its manifest
    (:func:`manifest_path`, with ``key`` when given) the same way. Raises ``RuntimeError`` with the
    compiler's first error line."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        built = Path(scratch) / target.name
        done = subprocess.run(
            [*cxx, *COMPILE_FLAGS, *extra_flags, str(SOURCE), "-o", str(built)],
            capture_output=True,
            text=True,
            timeout=COMPILE_TIMEOUT_S,
        )
        if done.returncode != 0:
            errors = (
                [line for line in done.stderr.splitlines() if "error" in line]
                or done.stderr.splitlines()
                or [f"exit code {done.returncode}, no message"]
            )
            raise RuntimeError(f"{_name(cxx)} failed: {errors[0].strip()}")
        data = built.read_bytes()
        manifest = {
            "size_bytes": len(data),
            "sha256": _digest(data),
            "source_sha256": _digest(SOURCE.read_bytes()),
        }
        written = Path(scratch) / "manifest.json"
        written.write_text(json.dumps({**manifest, **({} if key is None else {"key": key})}))
        os.replace(written, manifest_path(target))  # a reader between the two replaces sees a mismatch
        os.replace(built, target)  # and builds again: never a wrong file loaded


@functools.cache
def _built() -> tuple[NativeKernels | None, str]:
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None, f"needs an x86-64 CPU with AVX2 (this is {platform.machine()})"
    try:
        cxx = compiler()
    except ValueError as exc:  # CXX="'": no closing quotation
        return None, f"CXX={os.environ.get('CXX', '')!r} is not a command: {exc}"
    if cxx is None:
        return None, "no C++ compiler (set CXX, or install g++)"
    try:
        key = library_key(cxx)
        path = library_path(cxx, key)
        if path.is_file() and unverified(path, key) is None:
            try:
                return _loaded(load(path), cxx)
            except OSError:  # verified bytes that still do not load: build them again, once
                pass
        path.unlink(missing_ok=True)  # damaged, truncated, foreign or from other source: replaced
        build(cxx, path, key=key)
        return _loaded(load(path), cxx)
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        return None, f"not built: {exc}"


def _name(cxx: list[str]) -> str:
    return Path(cxx[-1]).name


def _loaded(kernel: NativeKernels, cxx: list[str]) -> tuple[NativeKernels, str]:
    return kernel, f"built for {kernel.isa} with {_name(cxx)}"


def load(path: Path) -> NativeKernels:
    """The kernels in the shared object ``path`` (one :func:`build` made). Raises ``OSError`` where its
    bytes do not match the manifest :func:`build` wrote (:func:`unverified`) or it cannot be loaded."""
    if (reason := unverified(path)) is not None:
        raise OSError(f"{path.name}: {reason}")
    library = ctypes.CDLL(str(path))
    try:
        isa, linear, decode = library.kvb_native_isa, library.kvb_few_rows_linear, library.kvb_paged_decode
    except AttributeError as exc:  # a shared object, but not this source's
        raise OSError(str(exc)) from exc
    isa.restype = ctypes.c_char_p
    linear.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3 + [ctypes.c_int]
    decode.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int64] * 7 + [ctypes.c_float, ctypes.c_int]
    linear.restype = decode.restype = None
    return NativeKernels(isa().decode(), path, linear, decode)


OFF_VALUES = ("0", "off", "false", "no")  # KVBENCH_NATIVE_KERNELS values that turn the kernels off


def _switched_off() -> bool:
    return os.environ.get(SWITCH_VARIABLE, "").strip().lower() in OFF_VALUES


def native_kernels() -> NativeKernels | None:
    """The kernels, built on first use (once per process; on disk once per machine), or ``None``
    where they cannot be (:func:`native_kernels_reason` says why)."""
    return None if _switched_off() else _built()[0]


def native_kernels_reason() -> str:
    """Why :func:`native_kernels` is what it is, in a few words (``built for avx512 with g++``,
    ``KVBENCH_NATIVE_KERNELS=0``, ``not built: g++ failed: ...``)."""
    return f"{SWITCH_VARIABLE}={os.environ[SWITCH_VARIABLE].strip()}" if _switched_off() else _built()[1]
