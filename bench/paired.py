"""Did a policy change help? The same replays under two versions of the code (or two variants),
start by start, as fractions of each start's rescale-free bound, and their paired differences.

    python -m bench.paired (--base REV | --base-variant NAME) [--new REV] [--variant NAME]
                           [--windows ISO,ISO,...] [--repeat K --step MIN] [--hours H]
                           [--jobs CSV] [--max-jobs N] [--parallel P] [--json]

One window is one draw (bench.policy): moving a start by ten minutes moves a ratio by tenths of a
point, far more than most changes worth keeping. Paired over the same starts the noise mostly
cancels: on the four default windows one start's difference has an sd of about 0.08 points, so
24 starts (the default, six per window) tell apart changes of about 0.04 points. Every change in
docs/policy-experiments.md was measured this way.

`--base REV` runs the variant (default `auto`) under a git revision, checked out in a temporary
worktree, against the working tree (or `--new REV`); `--base-variant NAME` compares two variants
of bench.policy in one tree instead. Both sides read the same job set, and both ratios use the
bound replayed by the new side, so the differences are the samples' differences. A table goes to
stdout, progress to stderr; with --json the last line is {"base": ..., "new": ..., "starts": [...],
"diff": {"mean": ..., "sd": ..., "better": ..., "n": ...}, "windows": {...}}, in percentage points.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

from bench.policy import BOUND, IMAGENET, VARIANTS, free_rescaling, render, shifted
from bench.replay import run

ROOT = Path(__file__).resolve().parent.parent
WINDOWS = ("2021-02-10T20:00:00Z", "2021-02-17T00:00:00Z", "2021-02-13T12:00:00Z", "2021-02-20T12:00:00Z")


class Usage(Exception):
    """A revision that cannot be used: reported as a usage error, nothing run."""


def commit_of(rev: str) -> str:
    """The commit `rev` names in this checkout."""
    try:
        p = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
                           capture_output=True, text=True)
    except FileNotFoundError as e:
        raise Usage("git is not installed; --base/--new REV need it") from e
    if p.returncode != 0:
        raise Usage(f"{rev!r} is not a commit of {ROOT.name} (is it a git checkout?)")
    return p.stdout.strip()


def worktree(stack: ExitStack, commit: str) -> Path:
    """A detached checkout of `commit` in a temporary folder, removed when `stack` closes."""
    where = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="paired-"))) / commit[:12]
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "--quiet", str(where), commit],
                   check=True, capture_output=True)
    stack.callback(subprocess.run, ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(where)],
                   capture_output=True)
    return where


def summary(diffs: list[float]) -> dict:
    """Mean, sd and standard error of paired differences (points), and how many were positive."""
    sd = statistics.stdev(diffs) if len(diffs) > 1 else 0.0
    return {"mean": statistics.fmean(diffs), "sd": sd, "se": sd / math.sqrt(len(diffs)),
            "better": sum(d > 0 for d in diffs), "n": len(diffs)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.paired", description=__doc__.splitlines()[0])
    side = ap.add_mutually_exclusive_group(required=True)
    side.add_argument("--base", metavar="REV", help="git revision to compare against (its --variant)")
    side.add_argument("--base-variant", metavar="NAME", help="a bench.policy variant to compare against")
    ap.add_argument("--new", metavar="REV", help="git revision to measure (default: the working tree)")
    ap.add_argument("--variant", default="auto", help="bench.policy variant to measure (default auto)")
    ap.add_argument("--windows", default=",".join(WINDOWS), help="window starts, comma-separated "
                    "(default the two of issue 16 and two more: %(default)s)")
    ap.add_argument("--repeat", type=int, default=6, help="starts per window (default 6)")
    ap.add_argument("--step", type=float, default=10.0, help="minutes between those starts (default 10)")
    ap.add_argument("--hours", type=float, default=72.0, help="window length (default 72)")
    ap.add_argument("--jobs", type=Path, default=IMAGENET, help="job set (default ImageNet)")
    ap.add_argument("--max-jobs", type=int, default=10)
    ap.add_argument("--parallel", type=int, default=2, help="replays at once (default 2)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.hours <= 0 or args.parallel < 1 or args.max_jobs < 1 or args.repeat < 1 or args.step <= 0:
        ap.error("--hours, --parallel, --max-jobs, --repeat and --step must be positive")
    for name in (args.variant, args.base_variant):
        if name is not None and name not in VARIANTS:
            ap.error(f"unknown variant {name!r}; choose from {', '.join(VARIANTS)}")
    if not args.jobs.is_file():
        ap.error(f"--jobs {args.jobs}: no such file")
    windows = [w.strip() for w in args.windows.split(",") if w.strip()]
    if not windows:
        ap.error("--windows names no window")
    try:
        starts = {w: shifted(w, args.repeat, args.step) for w in windows}
        base_commit = commit_of(args.base) if args.base else None
        new_commit = commit_of(args.new) if args.new else None
    except ValueError as e:
        ap.error(f"--windows: {e}")
    except Usage as e:
        ap.error(str(e))
    every = [s for w in windows for s in starts[w]]
    if len(set(every)) < len(every):
        ap.error("--windows overlap: two starts coincide")

    with ExitStack() as stack:
        new_tree = worktree(stack, new_commit) if new_commit else ROOT
        base_tree = worktree(stack, base_commit) if base_commit else new_tree
        new_label = f"{args.variant} @ {new_commit[:12] if new_commit else 'working tree'}"
        base_label = (f"{args.variant} @ {base_commit[:12]}" if base_commit else
                      f"{args.base_variant} @ {new_commit[:12] if new_commit else 'working tree'}")
        jobs = ["--jobs", str(args.jobs.resolve())]
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        bound = ["--jobs", str(free_rescaling(args.jobs, tmp / "free.csv")), *BOUND]
        plan: list[tuple[str, str, Path, list[str]]] = []
        for start in every:
            window = ["--start", start, "--hours", str(args.hours), "--max-jobs", str(args.max_jobs)]
            plan += [(start, "bound", new_tree, [*window, *bound]),
                     (start, "base", base_tree, [*window, *jobs, *VARIANTS[args.base_variant or args.variant]]),
                     (start, "new", new_tree, [*window, *jobs, *VARIANTS[args.variant]])]

        def one(item: tuple[str, str, Path, list[str]]) -> tuple[tuple[str, str], float]:
            start, role, tree, extra = item
            print(f"[bench.paired] {role} from {start} ...", file=sys.stderr, flush=True)
            return (start, role), run(extra, cwd=tree)["samples"]

        with ThreadPoolExecutor(args.parallel) as pool:
            done = dict(pool.map(one, plan))

    ratio = {(s, r): 100.0 * done[(s, r)] / done[(s, "bound")] for s in every for r in ("base", "new")}
    diff = {s: ratio[(s, "new")] - ratio[(s, "base")] for s in every}
    lines = [["window", "starts", "base %", "new %", "diff (points)", "sd", "better"]]
    per_window = {}
    for w in windows:
        ss = starts[w]
        base, new = (statistics.fmean(ratio[(s, r)] for s in ss) for r in ("base", "new"))
        d = summary([diff[s] for s in ss])
        per_window[w] = {"base": round(base, 4), "new": round(new, 4), **d}
        lines.append([w, str(len(ss)), f"{base:.3f}", f"{new:.3f}", f"{d['mean']:+.3f}", f"{d['sd']:.3f}",
                      f"{d['better']} of {d['n']}"])
    overall = summary(list(diff.values()))
    lines.append(["all", str(len(every)), f"{statistics.fmean(ratio[(s, 'base')] for s in every):.3f}",
                  f"{statistics.fmean(ratio[(s, 'new')] for s in every):.3f}", f"{overall['mean']:+.3f}",
                  f"{overall['sd']:.3f}", f"{overall['better']} of {overall['n']}"])
    print(f"new: {new_label}\nbase: {base_label}\n{args.hours:g} h windows, {args.jobs.name}, max "
          f"{args.max_jobs} jobs; % of each start's rescale-free bound, differences paired by start")
    print(render(lines))
    print(f"standard error of the mean difference: {overall['se']:.3f} points")
    if args.json:
        ratios = {s: {r: round(ratio[(s, r)], 5) for r in ("base", "new")} for s in every}
        print(json.dumps({"base": base_label, "new": new_label, "starts": every, "ratios": ratios,
                          "diff": overall, "windows": per_window}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
