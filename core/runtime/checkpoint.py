"""Checkpoint files of an elastic job (worker side): the only state that outlives every node.

Kept apart from `elastic` because it is plain file I/O: `checkpoint.pt` (model, optimizer, step)
written atomically, and a small `checkpoint.json` sidecar whose step ranks compare without loading
the tensors.
"""
from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Optional

import torch

__all__ = ["CHECKPOINT_FILE", "CHECKPOINT_META", "Checkpoints"]

log = logging.getLogger("harvest.elastic")

CHECKPOINT_FILE = "checkpoint.pt"
CHECKPOINT_META = "checkpoint.json"


class Checkpoints:
    """One worker's checkpoint directory (None: no checkpoints) and when it last wrote there."""

    def __init__(self, directory: Optional[Path], every_s: float) -> None:
        self.directory = directory
        self.every_s = float(every_s)
        self.step = -1                     # newest step known to be on disk
        self.last = time.monotonic()       # last save (or attempt)

    def due(self) -> bool:
        """A periodic checkpoint is due (`every_s` since the last save)."""
        return bool(self.directory) and time.monotonic() - self.last >= self.every_s

    def disk_step(self) -> int:
        """Step of the checkpoint on disk, -1 if none (read from the sidecar)."""
        if not self.directory:
            return -1
        try:
            return int(json.loads((self.directory / CHECKPOINT_META).read_text())["step"])
        except (OSError, ValueError, KeyError):
            return -1

    def load(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
             device: torch.device) -> int:
        """Restore model and optimizer in place; the checkpoint's step."""
        assert self.directory is not None
        state = torch.load(self.directory / CHECKPOINT_FILE, map_location=device, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        self.step = int(state["step"])
        log.info("restored checkpoint at step %d", self.step)
        return self.step

    def save(self, step: int, model: Optional[torch.nn.Module],
             optimizer: Optional[torch.optim.Optimizer], info: dict) -> None:
        """Atomic: write a temporary file, fsync, os.replace; then the small step sidecar. Only
        when `step` is newer than what is on disk; `info` is stored beside the state."""
        self.last = time.monotonic()
        if not self.directory or model is None or optimizer is None:
            return
        if step <= max(self.step, self.disk_step()):
            return
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)     # the job's only
        final = self.directory / CHECKPOINT_FILE
        tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
        state = {"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                 **info}
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
        meta = final.with_name(f".{CHECKPOINT_META}.{os.getpid()}.tmp")
        meta.write_text(json.dumps({"step": step, "time": time.time()}))
        os.replace(meta, self.directory / CHECKPOINT_META)
        self.step = step
