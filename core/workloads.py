"""Derived job sets for evaluation: the measured Summit sets with some jobs made to scale badly.

The measured ImageNet curves are all close to linear up to 64 nodes, so knowing a curve barely
matters on them. Communication-bound small models do not scale like that; `mixed` replaces a
fraction of the jobs, reproducibly from a seed, by jobs that keep their 1-node throughput but
follow the Universal Scalability Law X(n) = X1 n / (1 + sigma (n - 1) + kappa n (n - 1)) with
sigma in [0.05, 0.15] and kappa in [0.005, 0.02] (a peak around 6-12 nodes). These curves are
synthetic, and everything that reports on them says so.

`python -m core.workloads --fraction 0.3 --seed 0 > jobs-mixed.csv` writes such a set, which
`python -m core.replay --jobs` and the dashboard's replay accept like any other. `--owners K`
also gives every job one of K synthetic owners (skewed: a few submit most), for the fair-share
objective (bench.fairshare).
"""
from __future__ import annotations

import argparse
import csv
import random
import sys
from dataclasses import replace
from pathlib import Path
from typing import Optional, Sequence, TextIO

from .jobsets import load_jobset
from .model import Curve, Job
from .scaling import usl
from .timeutil import iso

SIGMA = (0.05, 0.15)
KAPPA = (0.005, 0.02)


def usl_curve(x1: float, sigma: float, kappa: float, n_max: int) -> Curve:
    """The USL curve at every size 1..n_max (the simulator interpolates between points, so
    every size is given)."""
    ns = tuple(range(1, n_max + 1))
    return Curve(ns, tuple(float(usl(n, x1, sigma, kappa)) for n in ns))


def mixed(jobs: Sequence[Job], fraction: float = 0.3, seed: int = 0) -> list[Job]:
    """A copy of `jobs` in which round(fraction x len) of them, chosen by `seed`, scale poorly.
    A replaced job keeps its id, model name, submit time, bounds, total samples, rescale costs
    and 1-node throughput: nothing but its speed at two or more nodes tells it apart."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction: must be within [0, 1], not {fraction}")
    rng = random.Random(seed)
    k = round(fraction * len(jobs))
    chosen = set(rng.sample(range(len(jobs)), k))
    out = []
    for i, job in enumerate(jobs):
        if i not in chosen:
            out.append(replace(job))
            continue
        sigma, kappa = rng.uniform(*SIGMA), rng.uniform(*KAPPA)
        truth = job.true_curve or job.curve
        x1 = truth(1) if truth.nodes[0] == 1 else truth(job.min_nodes) / job.min_nodes
        curve = usl_curve(x1, sigma, kappa, job.max_nodes)
        out.append(replace(job, curve=curve, true_curve=curve))
    return out


def with_owners(jobs: Sequence[Job], owners: int, seed: int = 0, skew: float = 1.0) -> list[Job]:
    """A copy of `jobs`, each given one of `owners` owners (o1, o2, ...), drawn by `seed` with
    weights 1/k^skew: o1 submits the most jobs and the last owner the fewest, as at a facility
    where a few groups train most. Synthetic: the measured job sets name no owners."""
    if owners < 1:
        raise ValueError(f"owners: must be at least 1, not {owners}")
    if not (skew >= 0.0):
        raise ValueError(f"skew: must be 0 or more, not {skew}")
    rng = random.Random(seed)
    names = [f"o{k}" for k in range(1, owners + 1)]
    weights = [1.0 / k ** skew for k in range(1, owners + 1)]
    return [replace(job, owner=rng.choices(names, weights)[0]) for job in jobs]


def write_jobset(jobs: Sequence[Job], fh: TextIO) -> None:
    """The job-set CSV format that `core.jobsets.load_jobset` reads (an owner column when any job has one)."""
    owned = any(j.owner for j in jobs)
    w = csv.writer(fh, lineterminator="\n")
    w.writerow(["job", "model", "submit_time", "min_nodes", "max_nodes", "total_samples",
                "scale_up_seconds", "scale_down_seconds", "nodes", "samples_per_second", "priority"]
               + (["owner"] if owned else []))
    for j in jobs:
        c = j.true_curve or j.curve
        w.writerow([j.id, j.name, iso(j.submit_time), j.min_nodes, j.max_nodes, f"{j.total_samples:.17g}",
                    f"{j.scale_up_seconds:.17g}", f"{j.scale_down_seconds:.17g}",
                    ";".join(str(n) for n in c.nodes), ";".join(f"{s:.6f}" for s in c.samples_per_second),
                    f"{j.priority:.17g}"] + ([j.owner] if owned else []))


def main(argv: Optional[list[str]] = None) -> int:
    """`python -m core.workloads`: write a mixed job set (synthetic poorly scaling jobs) as CSV."""
    data = Path(__file__).resolve().parent.parent / "data"
    ap = argparse.ArgumentParser(prog="python -m core.workloads", description=main.__doc__.split(": ", 1)[1])
    ap.add_argument("--jobs", type=Path, default=data / "jobs-imagenet-1001.csv")
    ap.add_argument("--fraction", type=float, default=0.3, help="share of jobs replaced (default 0.3)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--owners", type=int, metavar="K", help="also give each job one of K synthetic owners")
    ap.add_argument("--skew", type=float, default=1.0, help="--owners: owner k submits in proportion to 1/k^skew")
    args = ap.parse_args(argv)
    try:
        jobs = mixed(load_jobset(args.jobs), args.fraction, args.seed)
        if args.owners is not None:
            jobs = with_owners(jobs, args.owners, args.seed, args.skew)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    write_jobset(jobs, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
