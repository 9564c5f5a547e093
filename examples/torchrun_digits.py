"""Plain PyTorch DDP on the generated 16x16 digits: the kind of script people already run with
`torchrun`, made to survive being stopped and restarted at another size.

It imports nothing of the harvester (only the data generator and the step pace next to it,
examples/data.py and examples/pace.py), so the same file runs three ways:

    torchrun --nnodes=1 --nproc-per-node=2 examples/torchrun_digits.py --total-samples 64000
    python examples/torchrun_digits.py                 # one process, no launcher
    # as a harvester job with `launcher: torchrun`: the harvester sets torchrun's environment
    # (RANK, WORLD_SIZE, MASTER_ADDR, ...) and HARVEST_CHECKPOINT_DIR for each generation

What makes it restartable:
- the global batch is fixed and split exactly over WORLD_SIZE ranks, and the sample order is a
  function of the step only, so a resumed run at another world size sees the same data, and the
  job's samples are exactly step x global batch;
- rank 0 checkpoints (model, optimizer, step; write, fsync, rename) every --checkpoint-every
  steps, on SIGTERM/SIGINT, and at the end; a start resumes from the checkpoint if there is one;
- on a signal the ranks agree on the stop step (a one-element all_reduce of the flag each step),
  so ranks signalled at slightly different moments still stop together, checkpoint and exit 0;
- the process group has a timeout (--pg-timeout), so a rank whose peer died or hangs leaves
  instead of waiting forever (rank 0 still saves the last completed step, which is consistent).

Rank 0 prints `step=S samples=N loss=L` lines (flushed; `samples=` is the job's cumulative
count, what the harvester's default progress_pattern `samples=(\\d+)` reads) and a final
`done step=S samples=<total> ... test_accuracy=A` line.
"""
from __future__ import annotations

import argparse
import importlib.util
import math
import os
import signal
import socket
import sys
import time
from datetime import timedelta
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

CHECKPOINT_NAME = "torchrun_digits.pt"
LOCAL_CHECKPOINT_DIR = "runs/torchrun_digits"


def _load_sibling(name: str) -> ModuleType:
    """examples/<name>.py (data, pace) by its path next to this file: no package, no sys.path
    change, so the script can be copied anywhere together with data.py and pace.py."""
    path = Path(__file__).resolve().parent / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"torchrun_digits_{name}", path)
    assert spec is not None and spec.loader is not None, f"cannot load {path}"
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def say(line: str, stream: Any = None) -> None:
    """Write `line` and its newline in one call: the ranks share torchrun's log, and print's two
    writes let another rank's line land in between."""
    stream = stream or sys.stdout
    stream.write(line + "\n")
    stream.flush()


def build_model() -> nn.Module:
    """The same small CNN as examples/digits_cnn.py."""
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),     # 16 x 8 x 8
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),    # 32 x 4 x 4
        nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, 10))


@torch.no_grad()
def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    correct = sum(int((model(x[i:i + 500]).argmax(1) == y[i:i + 500]).sum())
                  for i in range(0, len(x), 500))
    model.train()
    return correct / len(x)


class StopRequest:
    """Signal handler that only records the signal: stopping mid-step (or inside a collective)
    would leave the ranks disagreeing on the step; the loop acts on it at the next boundary."""

    def __init__(self) -> None:
        self.signum: Optional[int] = None

    def __call__(self, signum: int, frame: Optional[FrameType]) -> None:
        self.signum = signum


class SampleOrder:
    """Which samples make up each global batch: position p of the whole run is sample
    perm(epoch)[p % N] with epoch = p // N, one seeded permutation per epoch. Depends on the step
    only, never on the world size, so a run resumed at another size continues the same walk."""

    def __init__(self, dataset_size: int, global_batch: int, total_samples: int, seed: int) -> None:
        self.n, self.global_batch, self.total, self.seed = dataset_size, global_batch, total_samples, seed
        self._perms: dict[int, torch.Tensor] = {}

    def batch_size(self, step: int) -> int:
        """Samples in the global batch of `step` (the last one may be short)."""
        return max(0, min(self.global_batch, self.total - step * self.global_batch))

    def _perm(self, epoch: int) -> torch.Tensor:
        if epoch not in self._perms:
            if len(self._perms) > 2:
                self._perms.pop(min(self._perms))
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._perms[epoch] = torch.randperm(self.n, generator=gen)
        return self._perms[epoch]

    def shard(self, step: int, rank: int, world_size: int) -> torch.Tensor:
        """This rank's indices: an exact, contiguous 1/world_size of the step's global batch."""
        n = self.batch_size(step)
        lo, hi = rank * n // world_size, (rank + 1) * n // world_size
        positions = torch.arange(step * self.global_batch + lo, step * self.global_batch + hi)
        epochs = positions // self.n
        out = torch.empty_like(positions)
        for epoch in epochs.unique().tolist():
            mask = epochs == epoch
            out[mask] = self._perm(epoch)[positions[mask] % self.n]
        return out


def samples_at(step: int, global_batch: int, total_samples: int) -> int:
    """The job's cumulative samples after `step` completed steps: exact, from the step alone."""
    return min(step * global_batch, total_samples)


def save_checkpoint(directory: Path, state: dict[str, Any]) -> Path:
    """Write, fsync, rename, fsync the folder: a reader (the next generation) sees the old file
    or the new one, never a torn one, even if this process is SIGKILLed mid-write."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / CHECKPOINT_NAME
    tmp = directory / f".{CHECKPOINT_NAME}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return path


def read_checkpoint(directory: Path) -> Optional[dict[str, Any]]:
    """The checkpoint in `directory`, tensors on the CPU, or None. weights_only: a checkpoint is
    tensors, numbers and strings, and loading one should not run code."""
    path = directory / CHECKPOINT_NAME
    if not path.exists():
        return None
    return torch.load(path, map_location="cpu", weights_only=True)


def agree_on_checkpoint(local: Optional[dict[str, Any]], rank: int, world_size: int,
                        device: torch.device) -> Optional[dict[str, Any]]:
    """The most advanced checkpoint any rank could read, on every rank. With a shared folder all
    ranks read the same file; with node-local folders the newest one may sit on any node, since
    rank 0 of the last generation need not be rank 0 of this one."""
    steps = torch.full((world_size,), -1, dtype=torch.int64, device=device)
    steps[rank] = local["step"] if local is not None else -1
    dist.all_reduce(steps, op=dist.ReduceOp.MAX)  # each rank filled only its own slot
    best = int(steps.max())
    if best < 0:
        return None
    src = int((steps == best).nonzero()[0])
    box = [local if rank == src else None]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def standalone_environment() -> None:
    """Run without a launcher: become rank 0 of 1 on a free local port, the env:// contract that
    torchrun (or the harvester) would otherwise provide."""
    if "RANK" in os.environ:
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--total-samples", type=int, default=64_000, help="samples of the whole job")
    ap.add_argument("--global-batch", type=int, default=64, help="per step, split over all ranks")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--step-seconds", type=float, default=0.0,
                    help="make each step last at least this long (a stand-in for a bigger model)")
    ap.add_argument("--pace-file", default=None,
                    help="a file holding the seconds a step lasts at least; while it holds a number, that "
                         "number replaces --step-seconds (read again whenever the file changes)")
    ap.add_argument("--checkpoint-every", type=int, default=100, help="steps")
    ap.add_argument("--checkpoint-dir", default=os.environ.get("HARVEST_CHECKPOINT_DIR") or LOCAL_CHECKPOINT_DIR,
                    help="default: $HARVEST_CHECKPOINT_DIR, else %(default)s")
    ap.add_argument("--log-every", type=int, default=10, help="steps between progress lines")
    ap.add_argument("--pg-timeout", type=float, default=20.0,
                    help="seconds a collective may wait for a peer before this rank gives up; below the "
                         "harvester's stop_grace_seconds (30) so rank 0 still saves when a peer hangs, and "
                         "above the time rank 0 takes to write a checkpoint (the others wait meanwhile)")
    args = ap.parse_args(argv)
    if args.global_batch < 1 or args.total_samples < 1 or args.checkpoint_every < 1 or args.log_every < 1:
        ap.error("--global-batch, --total-samples, --checkpoint-every and --log-every must be >= 1")
    return args


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    stop = StopRequest()
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    standalone_environment()
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device, backend = torch.device("cuda", local_rank), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    dist.init_process_group(backend, init_method="env://", timeout=timedelta(seconds=args.pg_timeout))

    torch.manual_seed(args.seed)
    x_train, y_train, x_test, y_test = (torch.from_numpy(a).to(device)
                                        for a in _load_sibling("data").make_digits(seed=args.seed))
    order = SampleOrder(len(x_train), args.global_batch, args.total_samples, args.seed)
    total_steps = math.ceil(args.total_samples / args.global_batch)
    net = build_model().to(device)
    opt = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=0.9)
    ckpt_dir = Path(args.checkpoint_dir)

    ckpt = agree_on_checkpoint(read_checkpoint(ckpt_dir), rank, world_size, device)
    step = 0
    if ckpt is not None:
        if ckpt["global_batch"] != args.global_batch:
            say(f"{ckpt_dir / CHECKPOINT_NAME} was written with --global-batch {ckpt['global_batch']}; "
                f"resuming with {args.global_batch} would change what a step means", sys.stderr)
            dist.destroy_process_group()
            return 2
        net.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        step = int(ckpt["step"])
    model = DDP(net, device_ids=[local_rank] if device.type == "cuda" else None)

    def checkpoint(kind: str) -> None:
        state = {"step": step, "samples": samples_at(step, args.global_batch, args.total_samples),
                 "global_batch": args.global_batch, "total_samples": args.total_samples,
                 "world_size": world_size, "model": net.state_dict(), "optimizer": opt.state_dict()}
        path = save_checkpoint(ckpt_dir, state)
        say(f"checkpoint step={step} samples={state['samples']} kind={kind} path={path}")

    if rank == 0:
        say(f"start step={step} samples={samples_at(step, args.global_batch, args.total_samples)} "
            f"world={world_size} backend={backend} resumed={ckpt is not None}")
    pace = _load_sibling("pace").Pace(args.step_seconds, args.pace_file)
    loss, t0 = float("nan"), time.monotonic()
    flag = torch.zeros(1, dtype=torch.int32, device=device)
    updating = False
    try:
        while step < total_steps:
            flag.fill_(1 if stop.signum is not None else 0)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            if int(flag.item()):
                break
            t_step = time.monotonic()
            idx = order.shard(step, rank, world_size).to(device)
            opt.zero_grad(set_to_none=True)
            loss_sum = F.cross_entropy(model(x_train[idx]), y_train[idx], reduction="sum")
            # DDP averages gradients over ranks: scaling each rank's sum by world/batch makes the
            # result the mean over the whole global batch, whatever the split
            (loss_sum * (world_size / order.batch_size(step))).backward()
            updating = True
            opt.step()
            step += 1
            updating = False
            loss = loss_sum.item() / max(1, len(idx))
            pace.hold(t_step)
            if rank == 0 and (step % args.log_every == 0 or step == total_steps):
                say(f"step={step} samples={samples_at(step, args.global_batch, args.total_samples)} "
                    f"loss={loss:.4f}")
            if rank == 0 and step % args.checkpoint_every == 0 and step < total_steps:
                checkpoint("periodic")
    except RuntimeError as e:   # what gloo raises when a peer is gone (reset) or hangs (timeout)
        # the collectives (the stop flag, DDP's gradient all_reduce inside backward) fail before
        # opt.step, so parameters and optimizer are still those of `step` completed steps and rank
        # 0 can save them; an error inside opt.step itself may have left them half-updated
        say(f"rank {rank}: stopped by {type(e).__name__} after step={step} (a peer gone or hung?): {e}",
            sys.stderr)
        if rank == 0 and not updating:
            checkpoint("peer-lost")
        return 0 if stop.signum is not None else 1
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()

    # written even when the last periodic checkpoint holds the same step: every generation's
    # output then ends with the checkpoint the next one starts from
    if step < total_steps:
        say(f"rank {rank}: stopping at step={step} on signal {stop.signum}", sys.stderr)
        if rank == 0:
            checkpoint("signal")
        return 0
    if rank == 0:
        checkpoint("final")
        say(f"done step={step} samples={samples_at(step, args.global_batch, args.total_samples)} "
            f"loss={loss:.4f} test_accuracy={accuracy(net, x_test, y_test):.4f} "
            f"seconds={time.monotonic() - t0:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
