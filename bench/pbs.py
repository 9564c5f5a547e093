"""Giving vnodes back to a real OpenPBS: how fast the harvester gets off the vnode a main job needs.

    python -m bench.pbs [--json] [--repeats 20] [--nodes 4] [--dispatch pilot|simulated]
                        [--grace S] [--default-poll] [--keep DIR] [--quick]

Starts the test OpenPBS (tests/support/openpbs.py: pbs_comm, pbs_server, pbs_sched and one MoM
with `--nodes` vnodes in a network namespace of its own; queue `main` (priority 200) preempts
queue `scavenger` by requeue, `preempt_order R`, `kill_delay 2`, the MoM polling every 1-2 s) and
the harvester in this process (`--source pbs`, the live loop, and a job of examples/digits_cnn.py
whose workers run inside the pilots). Once the job holds every vnode, it submits `--repeats` main
jobs one after another, each pinned to one held vnode (`qsub -q main -l select=1:vnode=V --
sleep 1`), and times, from each qsub:

- signal: until PBS's SIGTERM reaches the pilot (as the pilot reports it);
- vacate: until the controller has taken the job off the vnode and nothing of the harvester is
  left there (the pilot process and the workers it hosted: /proc read every 2 ms);
- harvester's share: SIGTERM -> pilot and workers gone (the part that is the harvester's);
- main start: until `qselect -s R` lists the main job;
- re-harvest: from the main job's end until a new pilot holds the vnode again;
- PBS's floor: the same qsub on a vnode no pilot holds (one more vnode, not harvested), until
  it runs: what a main job's start costs without the harvester.

`--default-poll` leaves the MoM at PBS's default poll instead of the `$min_check_poll 1`,
`$max_check_poll 2` that docs/operators/pbs.md advises.

Before each round every pilot is at least 11 s old: PBS's MoM does not reap a job younger than
10 s sooner, so a round on a fresh pilot would measure that rule, not the harvester or the site's
settings. Each qsub comes after a random pause of 0-1 s (seeded). `--keep DIR` keeps PBS's logs
and the pilots' output. `--quick` (2 rounds on 2 vnodes) checks that every step still works, not
how fast. A table goes to stdout, progress to stderr; with --json the last stdout line has
`rounds`, `signal_ms_p50`, `vacate_ms_p50`, `harvester_share_ms_p50`, `main_start_ms_p50/p95` and
the other figures.
"""
from __future__ import annotations

import argparse
import json
import logging
import random
import sys
import tempfile
import time
from pathlib import Path

from bench.slurm import held_by, wait_for
from core.assemble import build
from core.pbs.parse import parse_version
from core.pilots.settings import PilotSettings
from core.replay import percentile
from core.schemas import JobSpec
from core.settings import HarvesterSettings
from tests.support.openpbs import PbsCluster
from tests.support.slurm import alive, processes_with_env

ROOT = Path(__file__).resolve().parent.parent
#: a pilot younger than this is not preempted in a round (the MoM's 10 s rule, and a margin)
PILOT_AGE_S = 11.0


def _running(pbs: PbsCluster, job: str) -> bool:
    return job in pbs.run(["qselect", "-s", "R", "-q", "main"]).stdout.split()


def _ended(pbs: PbsCluster, job: str) -> bool:
    return job not in pbs.run(["qselect", "-q", "main"]).stdout.split()


def _pilots_old_enough(source) -> bool:
    with source.book.lock:
        hellos = [p.hello_at for p in source.book.pilots.values() if p.running]
    return bool(hellos) and time.monotonic() - max(hellos) >= PILOT_AGE_S


def _floor(pbs: PbsCluster, vnode: str) -> float:
    """ms from a main job's qsub on a vnode no pilot holds until it runs (it is gone at return)."""
    t0 = time.monotonic()
    job = pbs.submit("main", vnode, ["/bin/sleep", "0.1"], name="floor")
    wait_for(lambda: _running(pbs, job) or _ended(pbs, job), 30, "the floor job running", 0.002)
    ms = (time.monotonic() - t0) * 1000
    wait_for(lambda: _ended(pbs, job), 30, "the floor job's end", 0.05)
    return ms


def measure(workdir: Path, repeats: int, nodes: int, dispatch: str,
            grace_s: float = PilotSettings.worker_grace_s, log=print, fast_poll: bool = True) -> dict:
    out: dict[str, list[float]] = {"signal": [], "vacate": [], "share": [], "main": [], "reharvest": [], "floor": []}
    rng = random.Random(6)
    h = None
    with PbsCluster(workdir / "pbs", vnodes=nodes + 1, fast_poll=fast_poll) as pbs:
        spare = pbs.vnodes[-1]
        try:
            (workdir / "pilots").mkdir()
            h = build(HarvesterSettings.parse({"db": workdir / "harvest.db", "live": {
                "source": "pbs", "dispatch": dispatch, "workdir": str(ROOT), "profiler": False,
                "trust_user_commands": True, "advertise": pbs.head_address, "config": {"tfwd": 600},
                "slurm": {"conf": str(pbs.conf), "bin_dir": str(pbs.bin_dir), "log_dir": str(workdir / "pilots"),
                          "worker_grace_s": grace_s, "watch": tuple(pbs.vnodes[:-1])}}}))
            h.open()
            source = h.source
            spec = JobSpec(name="bench", min_nodes=1, max_nodes=nodes, total_samples=64 * 10**8,
                           curve=f"1:100, {nodes}:{100 * nodes}", scale_up_seconds=0, scale_down_seconds=0,
                           global_batch=64 if dispatch == "pilot" else None,
                           command=[sys.executable, "examples/digits_cnn.py", "--step-seconds", "0.05",
                                    "--log-every", "1000000"] if dispatch == "pilot" else None)
            job = h.submit(spec, "bench")

            def full() -> bool:
                if len(held_by(h, job.id)) < nodes:
                    return False
                if dispatch != "pilot":
                    return True
                st = h.worker_status(job.id) or {}
                return st.get("nodes") == nodes and st.get("world_size") == nodes and not st.get("regrouping")

            for k in range(repeats):
                wait_for(full, 240, f"the job on all {nodes} vnodes")
                wait_for(lambda: _pilots_old_enough(source), 60, "pilots at least 11 s old", 0.1)
                out["floor"].append(_floor(pbs, spare))
                with source.book.lock:
                    pilot_of = dict(source.book.held)
                vnode = rng.choice(sorted(pilot_of))
                link = source.hub.link(vnode)
                procs = processes_with_env(f"PBS_JOBID={pilot_of[vnode]}")
                time.sleep(rng.uniform(0, 1))
                t0, wall0 = time.monotonic(), time.time()
                main = pbs.submit("main", vnode, ["/bin/sleep", "1"], name="main")
                unheld = gone = started = None
                while unheld is None or gone is None or started is None:
                    now = time.monotonic()
                    if now - t0 > 60:
                        raise TimeoutError(f"round {k + 1}: the vacate or the main job not seen within 60 s")
                    if unheld is None and vnode not in held_by(h, job.id):
                        unheld = now
                    if gone is None and not any(alive(p) for p in procs):
                        gone = now
                    if started is None and _running(pbs, main):
                        started = time.monotonic()
                    time.sleep(0.002)
                vacated = max(unheld, gone)
                out["vacate"].append((vacated - t0) * 1000)
                out["main"].append((started - t0) * 1000)
                if link is not None and link.signalled_at is not None:
                    term = link.signalled_at - wall0 + t0
                    out["signal"].append((term - t0) * 1000)
                    out["share"].append((vacated - term) * 1000)
                wait_for(lambda: _ended(pbs, main), 60, "the main job's end", 0.05)
                ended = time.monotonic()
                wait_for(lambda: vnode in held_by(h, job.id), 120, "the vnode harvested again", 0.01)
                out["reharvest"].append((time.monotonic() - ended) * 1000)
                log(f"[bench.pbs] {k + 1}/{repeats}: signal {out['signal'][-1] if out['signal'] else float('nan'):.0f} ms, "
                    f"vacated {out['vacate'][-1]:.0f} ms, main job running {out['main'][-1]:.0f} ms, "
                    f"harvested again {out['reharvest'][-1]:.0f} ms after it ended", file=sys.stderr)
            left = processes_with_env(f"HARVEST_JOB={job.id}")
        finally:
            if h is not None:
                h.close()
        version = "OpenPBS " + parse_version(pbs.run(["qstat", "--version"]).stdout)
    if dispatch == "pilot" and any(alive(p) for p in left):
        raise RuntimeError(f"worker processes outlived the harvester: {sorted(left)}")

    def p(key: str, q: float) -> float:
        return round(percentile(out[key], q), 1) if out[key] else float("nan")
    return {"rounds": len(out["vacate"]), "signal_ms_p50": p("signal", 0.5), "signal_ms_p95": p("signal", 0.95),
            "vacate_ms_p50": p("vacate", 0.5), "vacate_ms_p95": p("vacate", 0.95),
            "harvester_share_ms_p50": p("share", 0.5), "harvester_share_ms_p95": p("share", 0.95),
            "main_start_ms_p50": p("main", 0.5), "main_start_ms_p95": p("main", 0.95),
            "reharvest_ms_p50": p("reharvest", 0.5), "reharvest_ms_p95": p("reharvest", 0.95),
            "floor_ms_p50": p("floor", 0.5), "floor_ms_p95": p("floor", 0.95), "mom_poll": "1-2 s" if fast_poll else "default",
            "nodes": nodes, "dispatch": dispatch, "worker_grace_s": grace_s, "pbs": version}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.pbs", description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the figures as one JSON line at the end")
    ap.add_argument("--repeats", type=int, default=20, help="main jobs, one after another (default 20)")
    ap.add_argument("--nodes", type=int, default=4, help="vnodes of the test PBS, all harvested (default 4)")
    ap.add_argument("--dispatch", choices=("pilot", "simulated"), default="pilot",
                    help="real workers inside the pilots, or simulated progress (default pilot)")
    ap.add_argument("--grace", type=float, default=PilotSettings.worker_grace_s,
                    help="seconds a preempted pilot gives its worker between SIGTERM and SIGKILL")
    ap.add_argument("--default-poll", action="store_true",
                    help="leave the MoM at PBS's default poll (not $min_check_poll 1 / $max_check_poll 2)")
    ap.add_argument("--keep", type=Path, metavar="DIR",
                    help="run in this new folder and keep it (PBS's logs, the pilots' output, the store)")
    ap.add_argument("--quick", action="store_true", help="2 main jobs on 2 vnodes: does every step still work")
    args = ap.parse_args(argv)
    if args.quick:
        args.repeats, args.nodes = 2, 2
    if not 1 <= args.nodes <= 128 or args.repeats < 1:
        ap.error("--nodes must be from 1 to 128 and --repeats at least 1")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=False)
        r = measure(args.keep, args.repeats, args.nodes, args.dispatch, args.grace, fast_poll=not args.default_poll)
    else:
        with tempfile.TemporaryDirectory(prefix="bench-pbs-") as tmp:
            r = measure(Path(tmp), args.repeats, args.nodes, args.dispatch, args.grace, fast_poll=not args.default_poll)
    print(f"{r['pbs']}: {r['rounds']} main jobs of 1 vnode on {args.nodes} harvested vnodes ({args.dispatch} "
          f"workers, worker grace {args.grace:g} s; kill_delay 2, MoM poll {r['mom_poll']}, preempt_order R)")
    print(f"{'from the main job qsub to':<58} {'p50 ms':>8} {'p95 ms':>8} {'goal':>10}")
    print(f"{'the pilot signalled (SIGTERM)':<58} {r['signal_ms_p50']:>8} {r['signal_ms_p95']:>8}")
    print(f"{'the vnode vacated (leave handled, pilot and workers gone)':<58} {r['vacate_ms_p50']:>8} {r['vacate_ms_p95']:>8}")
    print(f"{'  of which harvester: SIGTERM -> vacated':<58} {r['harvester_share_ms_p50']:>8} "
          f"{r['harvester_share_ms_p95']:>8} {'<= 150':>10}")
    print(f"{'the main job running':<58} {r['main_start_ms_p50']:>8} {r['main_start_ms_p95']:>8}")
    print(f"{'  PBS alone: the same qsub on a vnode no pilot holds':<58} {r['floor_ms_p50']:>8} {r['floor_ms_p95']:>8}")
    print(f"{'main job end -> its vnode harvested again':<58} {r['reharvest_ms_p50']:>8} {r['reharvest_ms_p95']:>8}")
    if args.json:
        print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
