"""bench.gpu: on a machine with CUDA it grows and shrinks a job through NCCL with exact samples
and equal checksums; without CUDA it says that nothing was measured and exits 0."""
from __future__ import annotations

import json

import torch

from tests.support.procs import run_module


def test_bench_gpu_measures_on_cuda_or_says_it_cannot():
    r = run_module("bench.gpu", "--json", "--repeats", "2", timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    result = json.loads(r.stdout.strip().splitlines()[-1])
    if not torch.cuda.is_available():
        assert "CUDA is not available" in r.stdout and "nothing was measured" in r.stdout
        assert result == {"cuda": False}
        return
    assert result["cuda"] and result["nccl_on_every_rank"] and result["samples_exact"], result
    assert result["checksums_equal"] and result["leftover_processes"] == 0, result
