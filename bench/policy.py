"""How close does each allocation policy come to what rescaling for free would give? Samples of
milp at several fixed T_fwd, of even, greedy and milp with the learned horizon (`--tfwd auto`),
each as a fraction of the rescale-free bound: the same replay (same trace window, job set, queue
and curves) with every scale_up_seconds / scale_down_seconds set to 0. One more row is a reference,
not a policy: `clairvoyant` is `auto` with placement told when the trace really takes each node
back (core.clairvoyant), the most any prediction of idle time could give placement. Another,
`clairvoyant-groups`, also groups the nodes the trace takes back together (not the nodes freed
together): the most any prediction of which nodes share fate could give.

    python -m bench.policy [--json] [--start ISO --hours H] [--jobs CSV] [--max-jobs N]
                           [--parallel P] [--only NAME,NAME] [--repeat K --step MIN]

Every run is a separate `python -m core.replay` process. A table goes to stdout, progress to
stderr; with --json the last line is {"window": ..., "bound_samples": ..., "ratios": {"milp@10":
..., "auto": ..., ...}, "runs": {...}}. Rescales and preemptions are per job-hour (hours jobs
spent admitted), preemptions also per used node-hour (what placement by expected idle time aims
to lower).

One window is one draw: moving its start by ten minutes moves the ratios by tenths of a point
(sd 0.01-0.27 over six starts, 0.04-0.10 for milp@60 and auto), as much as most differences
between policies. `--repeat K` runs
the window from K starts `--step` minutes apart (the bound too, for each) and adds each
variant's mean and sd over them (JSON: "spread"); the first start's table is printed as before.
"""
from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from pathlib import Path

from bench.replay import run

ROOT = Path(__file__).resolve().parent.parent
IMAGENET = ROOT / "data" / "jobs-imagenet-1001.csv"
START = "2021-02-10T20:00:00Z"
TFWDS = (10, 30, 60, 120, 300)
VARIANTS: dict[str, list[str]] = {
    **{f"milp@{t}": ["--policy", "milp", "--tfwd", str(t)] for t in TFWDS},
    "even": ["--policy", "even", "--tfwd", "10"],
    "greedy": ["--policy", "greedy", "--tfwd", "10"],
    "auto": ["--policy", "milp", "--tfwd", "auto"],
    # references, not policies: auto with placement told when each node is really taken back,
    # and also grouping the nodes that are taken back together (core.clairvoyant)
    "clairvoyant": ["--policy", "milp", "--tfwd", "auto", "--clairvoyant"],
    "clairvoyant-groups": ["--policy", "milp", "--tfwd", "auto", "--clairvoyant", "groups"],
}


#: the bound's replay, after `--jobs free_rescaling(...)`: with no rescale cost every T_fwd gives the
#: same sizes, and placement costs nothing
BOUND = ["--policy", "milp", "--tfwd", "10"]


def free_rescaling(jobs: Path, out: Path) -> Path:
    """The job set with every rescale cost 0: the bound's replay (nothing else changes)."""
    with jobs.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    if not rows:
        raise SystemExit(f"{jobs}: no jobs")
    for r in rows:
        r["scale_up_seconds"] = r["scale_down_seconds"] = "0"
    with out.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return out


def per_hour(s: dict, key: str, hours_key: str) -> float:
    hours = s.get(hours_key) or 0.0
    return s[key] / hours if hours else 0.0


def render(lines: list[list[str]], left: tuple[int, ...] = (0,)) -> str:
    """Rows as aligned columns: the `left` ones flush left, numbers flush right."""
    widths = [max(len(r[i]) for r in lines) for i in range(len(lines[0]))]
    return "\n".join("  ".join(c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in
                                enumerate(zip(r, widths))) for r in lines)


def table(runs: dict[str, dict], bound: float) -> str:
    head = ["run", "samples", "of bound", "rescales/job-h", "preempt/job-h", "preempt/node-h",
            "harvest %", "jobs done", "wall s"]
    lines = [head]
    for name, s in runs.items():
        lines.append([name, f"{s['samples']:.4g}", f"{s['samples'] / bound:.4f}",
                      f"{per_hour(s, 'rescales', 'job_hours'):.3f}",
                      f"{per_hour(s, 'preemptions', 'job_hours'):.3f}",
                      f"{per_hour(s, 'preemptions', 'used_node_hours'):.4f}",
                      f"{s['harvest_pct']:.1f}", str(s["jobs_finished"]), f"{s['wall_s']:.1f}"])
    return render(lines)


def shifted(start: str, count: int, step_minutes: float) -> list[str]:
    """`count` window starts, the first `start` (as given) and each `step_minutes` after the last."""
    t0 = datetime.fromisoformat(start.replace("Z", "+00:00"))
    if t0.tzinfo is None:
        t0 = t0.replace(tzinfo=timezone.utc)
    later = [t0 + timedelta(minutes=step_minutes * k) for k in range(1, count)]
    return [start, *(t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ") for t in later)]


def spread_table(ratios: dict[str, list[float]]) -> str:
    lines = [["run", "mean", "sd", "min", "max", "per start"]]
    for name, r in ratios.items():
        lines.append([name, f"{statistics.fmean(r):.4f}", f"{statistics.stdev(r):.4f}", f"{min(r):.4f}",
                      f"{max(r):.4f}", " ".join(f"{x:.4f}" for x in r)])
    return render(lines, left=(0, 5))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.policy", description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--start", default=START, help=f"window start (default {START})")
    ap.add_argument("--hours", type=float, default=72.0, help="window length (default 72)")
    ap.add_argument("--jobs", type=Path, default=IMAGENET, help="job set (default ImageNet)")
    ap.add_argument("--max-jobs", type=int, default=10)
    ap.add_argument("--parallel", type=int, default=2, help="replays at once (default 2)")
    ap.add_argument("--only", help="run only these variants (comma-separated names), and the bound")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run the window from this many starts, --step apart, and report mean and sd (default 1)")
    ap.add_argument("--step", type=float, default=10.0, help="minutes between those starts (default 10)")
    args = ap.parse_args(argv)
    if args.hours <= 0 or args.parallel < 1 or args.max_jobs < 1 or args.repeat < 1 or args.step <= 0:
        ap.error("--hours, --parallel, --max-jobs, --repeat and --step must be positive")
    names = list(VARIANTS) if not args.only else [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        ap.error(f"unknown variant(s) {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")
    try:
        starts = shifted(args.start, args.repeat, args.step)
    except ValueError as e:
        ap.error(f"--start {args.start!r}: {e}")
    with tempfile.TemporaryDirectory() as tmp:
        free = free_rescaling(args.jobs, Path(tmp) / "free.csv")
        plan: list[tuple[str, str, list[str]]] = []
        for start in starts:
            base = ["--start", start, "--hours", str(args.hours), "--max-jobs", str(args.max_jobs)]
            plan.append((start, "bound", [*base, "--jobs", str(free), *BOUND]))
            plan += [(start, n, [*base, "--jobs", str(args.jobs), *VARIANTS[n]]) for n in names]

        def one(item: tuple[str, str, list[str]]) -> tuple[tuple[str, str], dict]:
            start, name, extra = item
            at = f" from {start}" if len(starts) > 1 else ""
            print(f"[bench.policy] {name}{at} ...", file=sys.stderr, flush=True)
            return (start, name), run(extra)

        with ThreadPoolExecutor(args.parallel) as pool:
            done = dict(pool.map(one, plan))
    results = {n: done[(starts[0], n)] for n in names}
    bound = done[(starts[0], "bound")]
    print(f"Window {bound['start']} .. {bound['end']}, {bound['nodes']} nodes, {args.jobs.name}, "
          f"max {args.max_jobs} jobs; rescale-free bound {bound['samples']:.4g} samples")
    print(table({"bound": bound, **results}, bound["samples"]))
    ratios = {n: [done[(s, n)]["samples"] / done[(s, "bound")]["samples"] for s in starts] for n in names}
    if len(starts) > 1:
        print(f"\nOver {len(starts)} starts, {args.step:g} min apart (fraction of each start's bound):")
        print(spread_table(ratios))
    if args.json:
        out = {"window": {"start": bound["start"], "end": bound["end"], "hours": bound["simulated_hours"],
                          "jobs": args.jobs.name, "max_jobs": args.max_jobs},
               "bound_samples": bound["samples"],
               "ratios": {n: round(s["samples"] / bound["samples"], 5) for n, s in results.items()},
               "per_job_hour": {n: {"rescales": round(per_hour(s, "rescales", "job_hours"), 4),
                                    "preemptions": round(per_hour(s, "preemptions", "job_hours"), 4)}
                                for n, s in results.items()},
               "preemptions_per_node_hour": {n: round(per_hour(s, "preemptions", "used_node_hours"), 5)
                                             for n, s in results.items()},
               "runs": results}
        if len(starts) > 1:
            out["spread"] = {"starts": starts, "step_minutes": args.step,
                             "bound_samples": [done[(s, "bound")]["samples"] for s in starts],
                             "ratios": {n: [round(x, 5) for x in r] for n, r in ratios.items()},
                             "mean": {n: round(statistics.fmean(r), 5) for n, r in ratios.items()},
                             "sd": {n: round(statistics.stdev(r), 5) for n, r in ratios.items()}}
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
