"""Replay benchmark: the whole Summit trace (2021-02-10..24, 4,734 nodes) with the ImageNet job
set under each policy, each run in its own process so wall time and peak memory are its own.

    python -m bench.replay [--json] [--hours H] [--quick]

`--quick --hours 24` (four one-day replays, ~10 s) is what tests/test_bench_quick.py runs.

milp runs twice to show the summary is reproducible. Over the whole trace every job finishes
under every policy, so samples tie; the table also shows when the last job finished and the
mean job completion time, and a 72-hour window in which jobs are still running at the end,
where samples processed do differ.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from core.replay import TIMING_KEYS

ROOT = Path(__file__).resolve().parent.parent


def run(args: list[str], cwd: Path = ROOT) -> dict:
    """One `python -m core.replay` of the tree at `cwd` (another checkout for bench.paired)."""
    cmd = [sys.executable, "-m", "core.replay", "--json", "--no-progress", *args]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{p.stderr}")
    out = json.loads(p.stdout.strip().splitlines()[-1])
    out["process_s"] = round(time.perf_counter() - t0, 2)
    return out


def ratio(a: float, b: float, fmt: str = "{}") -> str:
    """a / b, or "-" where b processed nothing (a window that ends before the first job runs)."""
    return fmt.format(a / b) if b else "-"


def table(rows: list[tuple[str, dict]], base: dict) -> str:
    head = ["run", "samples", "vs even", "all done (h)", "mean JCT (h)", "harvest %",
            "rescales", "preempt", "solve p50/p95 ms", "wall s", "RSS MB"]
    lines = [head]
    for name, s in rows:
        lines.append([
            name, f"{s['samples']:.4g}", ratio(s["samples"], base["samples"], "{:.4f}"),
            "-" if s["makespan_hours"] is None else f"{s['makespan_hours']:.1f}",
            "-" if s["mean_jct_hours"] is None else f"{s['mean_jct_hours']:.2f}",
            f"{s['harvest_pct']:.2f}", str(s["rescales"]), str(s["preemptions"]),
            f"{s['solver_ms_p50']:.2f}/{s['solver_ms_p95']:.2f}", f"{s['wall_s']:.1f}",
            f"{s['peak_rss_mb']:.0f}"])
    widths = [max(len(r[i]) for r in lines) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in
                               enumerate(zip(r, widths))) for r in lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.replay", description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--hours", type=float, help="replay only this many hours (default: all)")
    ap.add_argument("--quick", action="store_true", help="skip the T_fwd sweep and the 72 h window")
    args = ap.parse_args(argv)
    window = ["--hours", str(args.hours)] if args.hours else []
    fixed = ["--tfwd", "10"]      # BFTrainer's T_fwd, as the table has always been measured
    plan = [("milp", ["--policy", "milp", *fixed]), ("milp (again)", ["--policy", "milp", *fixed]),
            ("even", ["--policy", "even", *fixed]), ("greedy", ["--policy", "greedy", *fixed])]
    if not args.quick:
        plan += [(f"milp T_fwd={t}", ["--policy", "milp", "--tfwd", str(t)]) for t in (60, 300)]
    results = []
    for name, extra in plan:
        print(f"[bench.replay] {name} ...", file=sys.stderr, flush=True)
        results.append((name, run(window + extra)))
    by = dict(results)
    same = ({k: v for k, v in by["milp"].items() if k not in TIMING_KEYS + ("process_s",)} ==
            {k: v for k, v in by["milp (again)"].items() if k not in TIMING_KEYS + ("process_s",)})
    first = results[0][1]
    print(f"Replay {first['start']} .. {first['end']} ({first['simulated_hours']} h), {first['nodes']} nodes, "
          f"{first['events']} events, jobs-imagenet-1001.csv, max 10 jobs")
    print(table(results, by["even"]))
    print(f"milp summary identical on the second run: {same}")
    out = {"window": {k: first[k] for k in ("start", "end", "simulated_hours", "nodes", "events")},
           "runs": {name: s for name, s in results}, "reproducible": same,
           "milp_vs_even_samples": by["milp"]["samples"] / by["even"]["samples"] if by["even"]["samples"] else None}
    if not args.quick and not args.hours:
        short = []
        for name, extra in [("milp", ["--policy", "milp", *fixed]), ("even", ["--policy", "even", *fixed]),
                            ("greedy", ["--policy", "greedy", *fixed])]:
            print(f"[bench.replay] 72 h {name} ...", file=sys.stderr, flush=True)
            short.append((name, run(["--hours", "72", *extra])))
        sb = dict(short)
        print("\nFirst 72 hours (jobs still running at the end):")
        print(table(short, sb["even"]))
        out["window_72h"] = {name: s for name, s in short}
        out["milp_vs_even_samples_72h"] = sb["milp"]["samples"] / sb["even"]["samples"]
    if args.json:
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
