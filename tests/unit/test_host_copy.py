"""worker.runner.host_copy.to_device: the per-step host->device copy that never waits for the GPU.
On CPU it only converts; the scan below keeps pageable copies (a stream sync on CUDA) out of the
modules that run every step."""

import re
from pathlib import Path

import numpy as np
import torch

from nanoserve.worker.runner.host_copy import to_device

CPU = torch.device("cpu")


def test_lists_arrays_and_tensors_keep_their_values_and_dtypes():
    rows = to_device([[0.6, 1.0], [20.0, 151936.0]], CPU, torch.float32)
    assert rows.dtype == torch.float32 and rows.tolist() == [
        [0.6000000238418579, 1.0],
        [20, 151936],
    ]
    assert to_device([3, 1, 2], CPU).dtype == torch.int64
    arr = to_device(np.arange(4, dtype=np.int32), CPU)
    assert arr.dtype == torch.int32 and arr.tolist() == [0, 1, 2, 3]
    assert to_device(np.arange(3), CPU, torch.int32).dtype == torch.int32
    t = torch.tensor([1.5])
    assert to_device(t, CPU) is t  # already on the host: nothing copied


# a tensor made on the host and moved with .to(), or made with device=: pageable, so on CUDA the
# copy synchronizes the stream (the calls' arguments may nest brackets three deep and span lines)
_ARGS = r"\((?:[^()]|\((?:[^()]|\((?:[^()]|\([^()]*\))*\))*\))*\)"
PAGEABLE = re.compile(
    rf"(?:torch\.tensor|torch\.from_numpy){_ARGS}\s*\.to\(|torch\.tensor\([^\n]*device="
)
STEP_MODULES = [
    "worker/runner/sampling_inputs.py",
    "worker/runner/logprobs.py",
    "worker/runner/lookahead.py",
    "worker/runner/model_runner.py",
    "worker/runner/token_rules.py",
    "worker/runner/sampler.py",
]


def test_step_modules_copy_through_to_device():
    root = Path(__file__).resolve().parents[2]
    found = {
        path: PAGEABLE.findall((root / path).read_text())
        for path in STEP_MODULES
        if PAGEABLE.search((root / path).read_text())
    }
    assert not found, f"pageable host->device copies (use host_copy.to_device): {found}"
