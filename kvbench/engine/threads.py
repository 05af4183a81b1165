"""Torch's intra-op thread count for a block of work (``--threads`` of run, sweep, break and serve).

On a busy machine more threads than free cores hurt most where each forward is small (warm
requests: only a few tokens to prefill): the threads wait on each other at every op (on a loaded 2-core
machine, identical warm requests took 54 to 1,460 ms; a default run beside two torch jobs read cache
on vs off as 1.07x where ``--threads 1`` read 20x). So without
``--threads`` the count comes from the cores this process may use and the load when it starts
(:func:`choose_threads`), and OpenMP is told not to spin while it waits (:func:`set_wait_policy`,
called by the CLI before torch loads its OpenMP runtime). ``None`` leaves torch alone and does not
import it.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import asdict, dataclass
from typing import Any

from kvbench.errors import InputError

# What the CLI sets when the user set none: OMP_WAIT_POLICY=PASSIVE makes an idle OpenMP
# thread sleep at once instead of spinning for a core (GNU libgomp, which pip's torch bundles on
# Linux, and Intel's libiomp both read it); KMP_BLOCKTIME=0 is Intel's own spelling of the same.
WAIT_POLICY_DEFAULTS = {"OMP_WAIT_POLICY": "PASSIVE", "KMP_BLOCKTIME": "0"}
WAIT_POLICY_MARK = "KVBENCH_SET_WAIT_POLICY"  # names the variables kvbench set (inherited by child processes)


def check_threads(num_threads: int | None, option: str = "--threads") -> int | None:
    """``num_threads`` if ``None`` or positive. Raises :class:`InputError` naming ``option`` otherwise."""
    if num_threads is not None and (isinstance(num_threads, bool) or num_threads < 1):
        raise InputError(f"{option}: {num_threads} is not a positive number of threads")
    return num_threads


def usable_cores() -> int:
    """CPUs this process may run on (its affinity mask; ``os.cpu_count()`` where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def load_1m() -> float | None:
    """The 1-minute load average (runnable processes), ``None`` where the OS has none."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def set_wait_policy(environ: MutableMapping[str, str] | None = None) -> None:
    """Set :data:`WAIT_POLICY_DEFAULTS` in ``environ`` (default ``os.environ``) unless the user set
    ``OMP_WAIT_POLICY`` (then nothing changes: their policy wins). Effective only before torch loads
    its OpenMP runtime, so the CLI calls it before any command module is imported."""
    environ = os.environ if environ is None else environ
    if "OMP_WAIT_POLICY" in environ:
        return
    names = [name for name in WAIT_POLICY_DEFAULTS if name not in environ]
    environ.update({name: WAIT_POLICY_DEFAULTS[name] for name in names})
    environ[WAIT_POLICY_MARK] = ",".join(names)


def wait_policy(environ: MutableMapping[str, str] | None = None) -> dict[str, Any]:
    """``{"OMP_WAIT_POLICY": "PASSIVE", "KMP_BLOCKTIME": "0", "set_by": "kvbench"}``: the values this
    process has (``None`` if unset) and who set them (``kvbench``, ``user``, or ``None`` if nobody)."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {name: environ.get(name) for name in WAIT_POLICY_DEFAULTS}
    ours = set(filter(None, environ.get(WAIT_POLICY_MARK, "").split(",")))
    given = {name for name, value in values.items() if value is not None}
    values["set_by"] = None if not given else "kvbench" if given <= ours else "user"
    return values


@dataclass(frozen=True)
class ThreadChoice:
    """How many intra-op threads torch runs with, and why.

    Attributes:
        num_threads: the count (>= 1).
        reason: ``"--threads 1"``, or the rule's inputs, e.g. ``"2 usable cores, load 3.40: 0 free"``.
        requested: ``--threads`` (``None`` when the default rule chose).
        usable_cores: CPUs in this process's affinity mask.
        load_1m: the 1-minute load average when the run started (``None`` if unknown).
        wait_policy: :func:`wait_policy` at the choice.
    """

    num_threads: int
    reason: str
    requested: int | None
    usable_cores: int
    load_1m: float | None
    wait_policy: dict[str, Any]

    def line(self) -> str:
        """The run's status line, e.g. ``threads: 1 (2 usable cores, load 3.40: 0 free;
        OMP_WAIT_POLICY=PASSIVE)``."""
        policy = self.wait_policy.get("OMP_WAIT_POLICY")
        by = f", set by {self.wait_policy['set_by']}" if self.wait_policy.get("set_by") else ""
        return f"threads: {self.num_threads} ({self.reason}; OMP_WAIT_POLICY={policy or 'unset'}{by})"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def choose_threads(
    requested: int | None,
    usable_cores: int,
    load_1m: float | None,
    max_threads: int | None = None,
    policy: dict[str, Any] | None = None,
) -> ThreadChoice:
    """The thread count: ``requested`` (``--threads``) when given; else the cores left free by the
    load, ``round(usable_cores - load_1m)``, at least 1 and at most ``usable_cores`` and
    ``max_threads`` (torch's own default: one per physical core). An unknown load counts as 0.

    Raises:
        InputError: ``requested`` is not positive.
    """
    policy = {} if policy is None else policy
    if check_threads(requested) is not None:
        return ThreadChoice(requested, f"--threads {requested}", requested, usable_cores, load_1m, policy)
    free = usable_cores - (load_1m or 0.0)
    ceiling = min(usable_cores, max_threads or usable_cores)
    num_threads = max(1, min(ceiling, math.floor(free + 0.5)))
    load_text = "load unknown" if load_1m is None else f"load {load_1m:.2f}"
    reason = f"{usable_cores} usable cores, {load_text}: {max(free, 0):.1f} free"
    if ceiling < usable_cores:
        reason += f", torch's default {ceiling}"
    return ThreadChoice(num_threads, reason, None, usable_cores, load_1m, policy)


def machine_threads(requested: int | None) -> ThreadChoice:
    """:func:`choose_threads` on this machine now (imports torch for its default count)."""
    check_threads(requested)
    import torch

    return choose_threads(requested, usable_cores(), load_1m(), torch.get_num_threads(), wait_policy())


@contextlib.contextmanager
def chosen_threads(
    requested: int | None, on_status: Callable[[str], None] | None = None
) -> Iterator[ThreadChoice]:
    """The one way run, sweep, break and serve set torch's threads: :func:`machine_threads`, its
    :meth:`ThreadChoice.line` to ``on_status``, then the block under :func:`torch_threads` of that count.
    Yields the choice (for the results' metadata)."""
    choice = machine_threads(requested)
    if on_status is not None:
        on_status(choice.line())
    with torch_threads(choice.num_threads):
        yield choice


@contextlib.contextmanager
def torch_threads(num_threads: int | None) -> Iterator[None]:
    """Run the block with ``torch.set_num_threads(num_threads)``, restoring the previous count after.

    Raises:
        InputError: ``num_threads`` is not positive.
    """
    if check_threads(num_threads) is None:
        yield
        return
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
