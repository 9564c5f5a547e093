"""bench.gpu on a machine without CUDA: it says that nothing was measured and exits 0 (the NCCL
path itself needs a GPU machine; see the README for where it ran)."""
from __future__ import annotations

import json

import torch

from tests.support.procs import run_module


def test_without_cuda_it_says_so_and_exits_0():
    assert not torch.cuda.is_available(), "this test is for machines without CUDA"
    r = run_module("bench.gpu", "--json")
    assert r.returncode == 0, r.stderr
    assert "CUDA is not available" in r.stdout and "nothing was measured" in r.stdout
    assert json.loads(r.stdout.strip().splitlines()[-1]) == {"cuda": False}
