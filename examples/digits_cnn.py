"""Example elastic job: a small CNN learning the generated 16x16 digits (examples/data.py).

Under the controller every rank (one per GPU of each node, one per CPU node) runs this same
command with the coordinator's environment, on `job.device` (cuda:LOCAL_RANK, else the CPU);
alone (no HARVEST_* environment) it trains on this machine, world size 1:

    python examples/digits_cnn.py --total-samples 32000 --global-batch 64    # the defaults: ~0.95 test accuracy

Training is SGD (momentum 0.9, weight decay 5e-4) on the global batch's mean loss, with the
gradient norm clipped to 1 and the learning rate warmed up linearly over the first steps, then
decayed to 0 along a cosine over the job's steps (a function of the committed step, so it is the
same at any world size and after a regroup or a restore). Without the clipping, the weight decay
and the decay, a constant --lr 0.1 (an effective step of lr / (1 - momentum) = 1) drives the
weights and logits up once the 4,000 training images are learnt, until the hidden ReLUs die one
after the other and the loss sits at ln 10 = 2.30 (chance) from step ~1,400 on.

Rank 0 prints JSON lines: {"step", "loss", "lr", ...} every --log-every steps and, at the end,
{"final": true, "test_accuracy": ...}.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:          # run as a script from anywhere: core/ and examples/
    sys.path.insert(0, str(_ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from core.runtime import elastic  # noqa: E402
from examples.data import make_digits  # noqa: E402
from examples.pace import Pace  # noqa: E402


def build_model(width: int = 16) -> nn.Module:
    """`width` channels in the first convolution, twice that in the second and four times in the
    hidden layer: one knob for the model's size (a hyperparameter for examples/hpo_optuna.py);
    16 is the model this example always had."""
    return nn.Sequential(
        nn.Conv2d(1, width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),              # w x 8 x 8
        nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),      # 2w x 4 x 4
        nn.Flatten(), nn.Linear(2 * width * 4 * 4, 4 * width), nn.ReLU(), nn.Linear(4 * width, 10))


def learning_rate(step: int, total_steps: int, base: float, warmup_steps: int) -> float:
    """The learning rate of `step`: linear warm-up to `base` over `warmup_steps`, then a cosine
    decay to 0 at `total_steps`."""
    if step < warmup_steps:
        return base * (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return base * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


@torch.no_grad()
def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    correct = sum(int((model(x[i:i + 500]).argmax(1) == y[i:i + 500]).sum())
                  for i in range(0, len(x), 500))
    model.train()
    return correct / len(x)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--total-samples", type=int, default=32_000)
    ap.add_argument("--global-batch", type=int, default=64)
    ap.add_argument("--checkpoint-dir", default=None)
    ap.add_argument("--checkpoint-every", type=float, default=60.0, help="seconds")
    ap.add_argument("--lr", type=float, default=0.05,
                    help="peak learning rate (0.05 to 0.2 converge; the schedule warms up to it, then decays it)")
    ap.add_argument("--warmup-steps", type=int, default=None,
                    help="steps of linear warm-up (default: 5%% of the job's steps, at most 100)")
    ap.add_argument("--weight-decay", type=float, default=5e-4)
    ap.add_argument("--clip-grad", type=float, default=1.0, help="largest gradient norm (0: no clipping)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--width", type=int, default=16, help="channels of the first convolution (model size)")
    ap.add_argument("--log-every", type=int, default=50, help="steps")
    ap.add_argument("--step-seconds", type=float, default=0.0,
                    help="make each step last at least this long (a stand-in for a bigger model in demos and tests)")
    ap.add_argument("--pace-file", default=None,
                    help="a file holding the seconds a step lasts at least; while it holds a number, that "
                         "number replaces --step-seconds (read again whenever the file changes)")
    args = ap.parse_args(argv)
    if args.width < 1:
        ap.error(f"--width: must be at least 1, not {args.width}")
    if args.warmup_steps is not None and args.warmup_steps < 0:
        ap.error(f"--warmup-steps: must be at least 0, not {args.warmup_steps}")

    job = elastic.init(args.global_batch, args.total_samples, checkpoint_dir=args.checkpoint_dir,
                       checkpoint_every_s=args.checkpoint_every, seed=args.seed)
    torch.manual_seed(args.seed)
    dev = job.device
    x_train, y_train, x_test, y_test = (torch.from_numpy(a).to(dev) for a in make_digits(seed=args.seed))
    model = build_model(args.width).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=args.weight_decay)
    job.attach(model, opt, dataset_size=len(x_train))
    # the coordinator's total samples (job.total_steps) set the schedule, the same on every rank
    warmup = (min(100, job.total_steps // 20) if args.warmup_steps is None else args.warmup_steps)

    pace = Pace(args.step_seconds, args.pace_file)
    t0 = time.monotonic()
    for step in job.steps():
        t_step = time.monotonic()
        idx = job.shard(step).to(dev)
        lr = learning_rate(step, job.total_steps, args.lr, warmup)
        for group in opt.param_groups:
            group["lr"] = lr
        opt.zero_grad(set_to_none=True)
        loss_sum = F.cross_entropy(job.model(x_train[idx]), y_train[idx], reduction="sum")
        (loss_sum * job.loss_weight(step)).backward()      # the global batch's mean loss
        if args.clip_grad > 0:         # after DDP's all-reduce: the same gradients, the same clip on every rank
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip_grad)
        opt.step()
        loss = loss_sum.item() / max(1, len(idx))
        pace.hold(t_step)
        job.done_step(loss=loss)
        if job.rank == 0 and step % args.log_every == 0:
            print(json.dumps({"step": step, "gen": job.generation, "world": job.world_size,
                              "loss": round(loss, 4), "lr": round(lr, 6)}), flush=True)
    if job.rank == 0:
        print(json.dumps({"final": True, "step": job.step, "samples": job.samples_done,
                          "test_accuracy": accuracy(model, x_test, y_test),
                          "seconds": round(time.monotonic() - t0, 2)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
