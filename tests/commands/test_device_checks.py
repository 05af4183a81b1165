"""``--device cuda`` on a machine without CUDA: run, sweep, serve and break each say
so in one line and exit 2, before the threads line, before a port is bound and before the model loads."""

import pytest
import torch
from test_cli_input_checks import SHARED_2K, one_line_error

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")


def no_model(config=None):
    raise AssertionError("the model was loaded for a device this machine does not have")


@pytest.mark.parametrize(
    "args, device",
    [
        (("run", SHARED_2K, "--num-requests", "1"), "cuda"),
        (("run", SHARED_2K, "--engine", "paged", "--host-tier", "64"), "cuda:1"),
        (("sweep", SHARED_2K, "--cache-sizes", "64"), "cuda"),
        (("serve", "--port", "0"), "cuda"),
        (("break", "timestamp"), "cuda"),
    ],
)
def test_a_missing_cuda_device_is_one_line_and_exit_2(kvbench, monkeypatch, tmp_path, args, device):
    monkeypatch.setattr("kvbench.engine.model.load_model", no_model)
    monkeypatch.chdir(tmp_path)  # nothing may be written; results/ would appear here
    code, out, err = kvbench(*args, "--device", device)
    one_line_error(code, err, f"error: --device {device}: no CUDA device is available on this machine")
    assert out == "" and not (tmp_path / "results").exists()
