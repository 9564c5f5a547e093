"""A runtime-launcher job that raises FileNotFoundError at a given step: on every rank (`--on
all`), or only on the ranks of one node (`--on NODE`, its HARVEST_NODE key's node). For the
tests of whose fault a lost node is (tests/test_blame.py)."""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from core.runtime import elastic, ranks  # noqa: E402
from core.runtime.protocol import ENV_NODE  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--at-step", type=int, required=True)
    ap.add_argument("--on", default="all", help="'all', or the node whose ranks raise")
    ap.add_argument("--total-samples", type=int, default=64 * 10 ** 6)
    ap.add_argument("--step-seconds", type=float, default=0.05)
    args = ap.parse_args()
    job = elastic.init(64, args.total_samples)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(1024, 4)
    job.attach(model, opt, dataset_size=len(x))
    me = ranks.node_of(os.environ.get(ENV_NODE, ""))
    for step in job.steps():
        t = time.monotonic()
        if step >= args.at_step and args.on in ("all", me):
            open(f"/nonexistent/shard-{args.at_step}.bin")     # FileNotFoundError, the same on every rank
        idx = job.shard(step)
        opt.zero_grad()
        (job.model(x[idx]).pow(2).sum() * job.loss_weight(step)).backward()
        opt.step()
        job.done_step(loss=0.0)
        time.sleep(max(0.0, args.step_seconds - (time.monotonic() - t)))


if __name__ == "__main__":
    main()
