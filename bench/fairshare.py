"""What fair shares cost and give: the Summit trace replayed with the ImageNet job set, each job
given one of K synthetic owners (a few submit most: core.workloads.with_owners), under the plain
throughput objective, under `fairshare` (each owner weighted by 2^(-use/share) in the solve:
core.fairshare), and under `fairshare` with the fair-share queue (who starts next: the owner
who used least for their share).

    python -m bench.fairshare [--json] [--owners 6] [--skew 1] [--seed 0] [--hours 48]
                              [--nodes 4734,1000] [--start ISO] [--half-life S]
                              [--poor-fraction F] [--quick]

For each machine size (`--nodes`: the first N nodes of the trace; fewer nodes, scarcer idle
ones) the three runs replay the same window with the same owners, as separate
`python -m core.replay` processes. The table gives the total samples (against throughput), Jain's
fairness index over the owners' node-hours (1: every owner got the same, which is what equal
shares aim at while each has jobs to run), the smallest owner's node-hours, jobs finished and
their mean completion time, and each owner's node-hours and share of all used. Over a window
long enough for every job to finish, each owner gets all they asked for whatever the order:
fair shares then show in how soon the light users' jobs are done, not in node-hours. "smallest
owner" is the owner with the fewest jobs in the window. `--quick` (2 hours, one size, ~10 s)
checks the bench runs, not what it finds. The owners are synthetic: the measured job sets name none.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.replay import run
from core.fairshare import DEFAULT_HALF_LIFE_S
from core.jobsets import load_jobset
from core.workloads import mixed, with_owners, write_jobset

ROOT = Path(__file__).resolve().parent.parent
IMAGENET = ROOT / "data" / "jobs-imagenet-1001.csv"
#: what each run adds to the common replay flags
RUNS = {"throughput": ["--objective", "throughput"],
        "fairshare": ["--objective", "fairshare"],
        "fairshare+queue": ["--objective", "fairshare", "--queue", "fairshare"]}


def jain(xs: list[float]) -> float:
    """Jain's fairness index of xs: 1 when all are equal, 1/len(xs) when one has everything."""
    return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs)) if any(xs) else 1.0


def compare(jobs: Path, nodes: int, hours: float, start: str | None, half_life: float) -> dict:
    """Every run on one machine size (two processes at once)."""
    common = ["--jobs", str(jobs), "--nodes", str(nodes), "--hours", str(hours),
              "--fair-half-life", str(half_life)] + (["--start", start] if start else [])
    with ThreadPoolExecutor(2) as pool:
        runs = dict(zip(RUNS, pool.map(lambda extra: run([*common, *extra]), RUNS.values())))
    owners = sorted(runs["throughput"]["owners"] or {}, key=lambda o: (len(o), o))
    held = {name: [s["owners"][o]["node_hours"] for o in owners] for name, s in runs.items()}
    smallest = min(owners, key=lambda o: (runs["throughput"]["owners"][o]["jobs"], o))
    return {"nodes": nodes, "owners": owners, "smallest": smallest,
            "runs": {name: {"samples": s["samples"], "used_node_hours": s["used_node_hours"],
                            "rescales": s["rescales"], "per_owner": s["owners"],
                            "jain_node_hours": round(jain(held[name]), 4)}
                     for name, s in runs.items()},
            "samples_ratio": {name: (s["samples"] / runs["throughput"]["samples"]
                                     if runs["throughput"]["samples"] else None) for name, s in runs.items()}}


def jct(owner: dict) -> str:
    return "-" if owner["mean_jct_hours"] is None else f"{owner['mean_jct_hours']:.1f}"


def table(results: list[dict]) -> str:
    names = list(RUNS)
    w = max(len(n) for n in names)
    lines = []
    for r in results:
        runs = r["runs"]
        lines.append(f"{r['nodes']} nodes")
        lines.append(f"  {'run':<{w}}  {'samples':>10}  {'x throughput':>12}  {'node-h used':>11}  {'rescales':>8}  "
                     f"{'Jain (owners node-h)':>20}  {'smallest owner node-h':>21}  {'its jobs done':>13}  "
                     f"{'its mean JCT h':>14}")
        for n in names:
            s, ratio = runs[n], r["samples_ratio"][n]
            lines.append(f"  {n:<{w}}  {s['samples']:>10.4g}  {'-' if ratio is None else f'{ratio:.4f}':>12}  "
                         f"{s['used_node_hours']:>11.1f}  {s['rescales']:>8}  {s['jain_node_hours']:>20.3f}  "
                         f"{s['per_owner'][r['smallest']]['node_hours']:>21.1f}  "
                         f"{s['per_owner'][r['smallest']]['done']:>13}  {jct(s['per_owner'][r['smallest']]):>14}")
        lines.append(f"  each owner's node-hours and share of all used ({' / '.join(names)}):")
        for o in r["owners"]:
            jobs = runs["throughput"]["per_owner"][o]["jobs"]
            cells = " / ".join(f"{runs[n]['per_owner'][o]['node_hours']:.0f} "
                               f"({100 * runs[n]['per_owner'][o]['node_hours'] / runs[n]['used_node_hours']:.1f} %)"
                               if runs[n]["used_node_hours"] else "0" for n in names)
            mark = "  <- smallest owner" if o == r["smallest"] else ""
            lines.append(f"    {o:<6} {jobs:>4} jobs  {cells}{mark}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.fairshare", description=__doc__.split("\n\n")[0])
    p.add_argument("--owners", type=int, default=6)
    p.add_argument("--skew", type=float, default=1.0, help="owner k submits in proportion to 1/k^skew")
    p.add_argument("--seed", type=int, default=0, help="which owner each job gets")
    p.add_argument("--hours", type=float, default=48.0)
    p.add_argument("--start", help="window start, ISO 8601 (default: the job set's first arrivals)")
    p.add_argument("--nodes", default="4734,1000", help="machine sizes, comma-separated (default 4734,1000)")
    p.add_argument("--poor-fraction", type=float, default=0.0,
                   help="replace this share of the jobs by poorly scaling ones (core.workloads.mixed; default 0)")
    p.add_argument("--half-life", type=float, default=DEFAULT_HALF_LIFE_S, help="seconds (default a week)")
    p.add_argument("--quick", action="store_true", help="2 hours on 1000 nodes: checks the bench runs")
    p.add_argument("--json", action="store_true", help="last line: the results as JSON")
    a = p.parse_args(argv)
    try:
        sizes = [int(x) for x in a.nodes.split(",") if x.strip()]
    except ValueError:
        p.error("--nodes: give whole numbers, comma-separated")
    if a.quick:
        a.hours, sizes = 2.0, [1000]
    start = a.start or "2021-02-10T20:00:00Z"
    with tempfile.TemporaryDirectory() as tmp:
        jobs = Path(tmp) / "jobs-owned.csv"
        with jobs.open("w") as fh:
            write_jobset(with_owners(mixed(load_jobset(IMAGENET), a.poor_fraction, a.seed), a.owners, a.seed,
                                     a.skew), fh)
        results = []
        for n in sizes:
            print(f"{n} nodes: replaying {a.hours:g} h, {len(RUNS)} runs ...", file=sys.stderr)
            results.append(compare(jobs, n, a.hours, start, a.half_life))
    print(table(results))
    if a.json:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
