"""Which samples each rank takes at each step: the same global batch at any world size.

Kept apart from `elastic` because it is pure arithmetic over step, rank and world size (torch only
for the seeded shuffle): a deterministic walk over the data set, reshuffled every epoch.
"""
from __future__ import annotations

from typing import Optional

import torch

from . import protocol as P

__all__ = ["EpochOrder"]


class EpochOrder:
    """The seeded per-epoch shuffle of a data set, and each rank's share of a step's batch."""

    def __init__(self, seed: int) -> None:
        self.seed = int(seed)
        self._cache: tuple[int, int, Optional[torch.Tensor]] = (-1, -1, None)   # epoch, size, perm

    def permutation(self, epoch: int, size: int) -> torch.Tensor:
        if self._cache[:2] != (epoch, size):
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._cache = (epoch, size, torch.randperm(size, generator=g))
        perm = self._cache[2]
        assert perm is not None
        return perm

    def shard(self, step: int, rank: int, world: int, global_batch: int, total_samples: int,
              dataset_size: Optional[int]) -> torch.Tensor:
        """Indices (int64, CPU) of `rank`'s samples in the global batch of `step`: positions
        step*global_batch... of the walk, or the raw positions without a dataset_size."""
        n = P.batch_of_step(step, total_samples, global_batch)
        lo = step * global_batch + rank * n // world
        hi = step * global_batch + (rank + 1) * n // world
        pos = torch.arange(lo, hi, dtype=torch.int64)
        if not dataset_size:
            return pos
        out = torch.empty_like(pos)
        for epoch in range(lo // dataset_size, (hi - 1) // dataset_size + 1):   # empty when hi == lo
            mask = (pos // dataset_size) == epoch
            out[mask] = self.permutation(epoch, dataset_size)[pos[mask] % dataset_size]
        return out
