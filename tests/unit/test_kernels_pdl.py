"""worker.kernels.pdl: programmatic dependent launch only where it exists (CUDA, sm_90+), never
in the Triton interpreter, and NANOSERVE_PDL=0 turns it off."""

import torch

from nanoserve.worker.kernels import pdl


def test_cpu_tensors_launch_plainly():
    assert pdl.pdl_launch(torch.zeros(1)) == dict(PDL=False)


def test_env_and_interpreter_turn_it_off(monkeypatch):
    for env, value in (("NANOSERVE_PDL", "0"), ("TRITON_INTERPRET", "1")):
        monkeypatch.setenv(env, value)
        pdl._enabled.cache_clear()
        assert pdl._enabled(0) is False
        monkeypatch.delenv(env)
    pdl._enabled.cache_clear()
