"""How fast the commands an operator types first answer: `python -m app --help` and
`--print-config` (issue 50: under 1 s), against a bare interpreter and against importing the
engine and web app they avoid. Wall seconds of the whole process, start-up included.

    python -m bench.startup [--json] [--repeats 5] [--quick]

Each command runs `--repeats` times; the table gives the best and the median, and each one's
ratio to the bare interpreter measured in the same run (a loaded machine moves all rows alike).
`--quick` (one run each, ~5 s) checks that every command still answers, not how fast; timing is
a benchmark's job, not a unit test's, because the test machines are shared and noisy.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOAL_S = 1.0

#: (row label, argv after the interpreter, held to the goal)
COMMANDS: tuple[tuple[str, tuple[str, ...], bool], ...] = (
    ("python -c pass (bare interpreter)", ("-c", "pass"), False),
    ("python -m app --help", ("-m", "app", "--help"), True),
    ("python -m app --print-config", ("-m", "app", "--print-config"), True),
    ("python -m app --print-config --config deploy/harvester.toml --bind 127.0.0.1",     # (its head's name
     ("-m", "app", "--print-config", "--config", "deploy/harvester.toml", "--bind", "127.0.0.1"), True),  # not here)
    ("import core.assemble, app.web (what --help avoids)",
     ("-c", "import core.assemble, app.web"), False),
)


def time_once(argv: tuple[str, ...]) -> float:
    """One run's wall seconds; a command that fails stops the benchmark (a fast error is no answer)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARVEST_")}
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    seconds = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(f"python {' '.join(argv)} exited {r.returncode}: {r.stderr[-2000:]}")
    return seconds


def measure(repeats: int, log=print) -> list[dict]:
    """Runs the commands round-robin, so a burst of load elsewhere hits every row, not one."""
    runs: dict[str, list[float]] = {label: [] for label, _, _ in COMMANDS}
    for i in range(repeats):
        for label, argv, _ in COMMANDS:
            runs[label].append(time_once(argv))
        log(f"round {i + 1}/{repeats} done", file=sys.stderr)
    bare = min(runs[COMMANDS[0][0]])
    return [{"command": label, "best_s": min(runs[label]), "median_s": statistics.median(runs[label]),
             "x_bare": min(runs[label]) / bare, "goal_s": GOAL_S if held else None,
             "meets_goal": (min(runs[label]) < GOAL_S) if held else None}
            for label, _, held in COMMANDS]


def table(rows: list[dict]) -> str:
    width = max(len(r["command"]) for r in rows)
    lines = [f"{'command':<{width}}  {'best s':>7}  {'median s':>8}  {'× bare':>7}  goal",
             "-" * (width + 36)]
    for r in rows:
        goal = "" if r["goal_s"] is None else f"< {r['goal_s']:.0f} s {'yes' if r['meets_goal'] else 'NO'}"
        lines.append(f"{r['command']:<{width}}  {r['best_s']:>7.3f}  {r['median_s']:>8.3f}  "
                     f"{r['x_bare']:>7.1f}  {goal}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.startup", description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5, help="runs of each command (default 5)")
    p.add_argument("--quick", action="store_true", help="one run each: checks the commands answer")
    p.add_argument("--json", action="store_true", help="last line: the rows as JSON")
    a = p.parse_args(argv)
    if a.repeats < 1:
        p.error("--repeats must be at least 1")
    rows = measure(1 if a.quick else a.repeats, log=print)
    print(table(rows))
    if a.json:
        print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
