"""The default thread count: from the usable cores and the load; the OpenMP wait policy."""

import subprocess
import sys

import pytest

from kvbench.engine.threads import WAIT_POLICY_MARK, choose_threads, set_wait_policy, wait_policy
from kvbench.errors import InputError


@pytest.mark.parametrize(
    ("cores", "load", "torch_default", "expected"),
    [
        (2, 0.1, 2, 2),  # a quiet 2-core machine: both cores
        (2, 0.4, 2, 2),  # 1.6 free rounds to 2
        (2, 0.6, 2, 1),  # 1.4 free rounds to 1
        (2, 3.4, 2, 1),  # busier than its cores: never below 1
        (2, 2.0, 2, 1),
        (8, 2.6, 8, 5),  # 5.4 free
        (8, 0.0, 4, 4),  # torch's default (physical cores) caps the count
        (4, None, 4, 4),  # no load average on this OS: all usable cores
    ],
)
def test_the_default_counts_the_cores_the_load_leaves_free(cores, load, torch_default, expected):
    choice = choose_threads(None, cores, load, torch_default)
    assert choice.num_threads == expected
    assert choice.requested is None and choice.usable_cores == cores and choice.load_1m == load
    assert choice.reason.startswith(f"{cores} usable cores, ")


def test_the_reason_names_the_load_and_the_free_cores():
    choice = choose_threads(
        None, 2, 3.4, 2, {"OMP_WAIT_POLICY": "PASSIVE", "KMP_BLOCKTIME": "0", "set_by": "kvbench"}
    )
    assert choice.reason == "2 usable cores, load 3.40: 0.0 free"
    assert (
        choice.line()
        == "threads: 1 (2 usable cores, load 3.40: 0.0 free; OMP_WAIT_POLICY=PASSIVE, set by kvbench)"
    )
    assert choose_threads(None, 8, 0.0, 4).reason == "8 usable cores, load 0.00: 8.0 free, torch's default 4"


def test_threads_given_win_over_the_load():
    choice = choose_threads(3, 2, 5.0, 2)
    assert (choice.num_threads, choice.reason, choice.requested) == (3, "--threads 3", 3)
    assert choice.as_dict() == {
        "num_threads": 3,
        "reason": "--threads 3",
        "requested": 3,
        "usable_cores": 2,
        "load_1m": 5.0,
        "wait_policy": {},
    }


@pytest.mark.parametrize("bad", [0, -1])
def test_a_bad_thread_count_is_one_input_error(bad):
    with pytest.raises(InputError, match=f"--threads: {bad} is not a positive number of threads"):
        choose_threads(bad, 2, 0.0, 2)


def test_kvbench_sets_a_passive_wait_policy_when_the_user_set_none():
    environ = {}
    set_wait_policy(environ)
    assert environ["OMP_WAIT_POLICY"] == "PASSIVE" and environ["KMP_BLOCKTIME"] == "0"
    assert wait_policy(environ) == {"OMP_WAIT_POLICY": "PASSIVE", "KMP_BLOCKTIME": "0", "set_by": "kvbench"}
    set_wait_policy(environ)  # a child kvbench process inherits it: still kvbench's
    assert wait_policy(environ)["set_by"] == "kvbench"


def test_the_users_wait_policy_is_left_alone():
    environ = {"OMP_WAIT_POLICY": "ACTIVE"}
    set_wait_policy(environ)
    assert environ == {"OMP_WAIT_POLICY": "ACTIVE"}
    assert wait_policy(environ) == {"OMP_WAIT_POLICY": "ACTIVE", "KMP_BLOCKTIME": None, "set_by": "user"}
    environ = {"KMP_BLOCKTIME": "200"}  # the user's Intel setting is kept beside kvbench's policy
    set_wait_policy(environ)
    assert environ["KMP_BLOCKTIME"] == "200" and environ[WAIT_POLICY_MARK] == "OMP_WAIT_POLICY"
    assert wait_policy(environ)["set_by"] == "user"
    assert wait_policy({})["set_by"] is None


def test_the_cli_sets_the_policy_before_torch_is_imported():
    probe = (
        "import os, sys\nfrom kvbench.cli import main\ntry:\n    main(['run', '--help'])\nexcept "
        "SystemExit:\n    pass\n"
        "print(os.environ.get('OMP_WAIT_POLICY'), 'torch' in sys.modules)"
    )
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("OMP_WAIT_POLICY", "KMP_BLOCKTIME")}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True)
    assert done.stdout.split()[-2:] == ["PASSIVE", "False"]
