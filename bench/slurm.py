"""Giving nodes back to a real Slurm: how fast the harvester gets off the nodes a main job needs.

    python -m bench.slurm [--json] [--repeats 20] [--nodes 8] [--main-nodes 4] [--slots 1]
                          [--dispatch pilot|simulated] [--grace S] [--keep DIR] [--slurm 22.05|24.11] [--quick]

Starts the test Slurm (tests/support/slurm.py: munged, slurmctld, N slurmd on loopback, a preemptible
`scavenger` partition with GraceTime=0; the host's 22.05 or, `--slurm 24.11`, Debian 13's in a
chroot) in a temporary folder and the harvester in this process
(the Slurm source, the live loop, and a job of examples/digits_cnn.py whose workers run inside
the pilots: `--dispatch pilot`; or the simulated dispatcher). Each node has `--slots` GPUs
(`Gres=gpu:N`), so the job runs N ranks per node, all started by the node's pilot, and a vacate
is over when every one of them is gone. Once the job holds every node, it
submits `--repeats` main jobs one after another (`sbatch -p main -N <main-nodes> --wrap 'sleep 1'`)
and times, from each submission:

- leave: until the controller has taken the job off every node the main job got (its NODE_LEAVE
  handled and the workers told);
- vacated: until, in addition, nothing of the harvester is left on those nodes (the pilot
  process and the workers it hosted are gone: /proc read every 2 ms);
- main start: until squeue shows the main job RUNNING;
- re-harvest: from the main job's end until pilots hold all its nodes again.

Each submission comes after a random pause of 0-1 s (seeded), so that it falls at any phase of
slurmctld's own scheduling loop, which preempts once a second; per preempted node the time is
split into Slurm's part (submission -> the pilot's SIGTERM, as the pilot reports it) and the
harvester's (SIGTERM -> leave handled, -> vacated). Between rounds the job grows back to every
node (with real workers, a cold start each). `--keep DIR` keeps Slurm's logs and the pilots'.
`--quick` (2 main jobs of 1 node on 2 nodes, ~30 s) checks that every step still works
(tests/test_bench_slurm_quick.py), not how fast.
A table goes to stdout, progress to stderr; with --json the last stdout line has vacate_ms_p50,
vacate_ms_p95, main_start_ms_p50 and the other figures.
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

from core.assemble import build
from core.replay import percentile
from core.schemas import JobSpec
from core.service import Harvester
from core.settings import HarvesterSettings
from core.pilots.settings import PilotSettings
from core.snapshot import HELD
from tests.support.slurm import HOST_VERSION, VERSIONS, alive, processes_with_env, start_cluster

ROOT = Path(__file__).resolve().parent.parent
GOAL_MS = 1000.0


def wait_for(cond, timeout: float, what: str, period: float = 0.02):
    t0 = time.monotonic()
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"{what} within {timeout:g} s")
        time.sleep(period)


def held_by(h: Harvester, job_id: str) -> set[str]:
    snap = h.snapshot
    return {n for n, s, j in zip(snap.nodes, snap.state, snap.job_of) if s == HELD and j == job_id}


def measure(workdir: Path, repeats: int, nodes: int, main_nodes: int, dispatch: str,
            grace_s: float = PilotSettings.worker_grace_s, slots: int = 1, log=print,
            version: str = HOST_VERSION) -> dict:
    cluster = start_cluster(workdir / "slurm", nodes, gpus=slots, version=version)     # slots from the GRES
    h = None
    out: dict[str, list[float]] = {"leave": [], "vacated": [], "main": [], "reharvest": [],
                                   "sigterm": [], "term_leave": [], "term_gone": []}
    rng = random.Random(6)
    try:
        (workdir / "pilots").mkdir()
        h = build(HarvesterSettings.parse({"db": workdir / "harvest.db", "live": {
            "source": "slurm", "dispatch": dispatch, "workdir": str(ROOT), "profiler": False, "trust_user_commands": True,
            "config": {"tfwd": 600},
            "slurm": {**cluster.slurm_settings(), "log_dir": str(workdir / "pilots"), "worker_grace_s": grace_s}}}))
        h.open()
        source = h.source          # the pilots' bookkeeping, read to time each step of a vacate
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
            return st.get("nodes") == nodes and st.get("world_size") == nodes * slots and not st.get("regrouping")

        wait_for(full, 240, f"the job on all {nodes} nodes")
        for k in range(repeats):
            with source.book.lock:
                pilot_of = dict(source.book.held)
            links = {n: source.hub.link(n) for n in pilot_of}
            procs = {n: [p for p in processes_with_env(f"SLURM_JOB_ID={j}")] for n, j in pilot_of.items()}
            time.sleep(rng.uniform(0, 1))          # main jobs come at any phase of Slurm's own loop
            t0, wall0 = time.monotonic(), time.time()
            main = cluster.sbatch("-p", "main", "-N", str(main_nodes), "--wrap", "sleep 1", "-o", "/dev/null")
            unheld_at: dict[str, float] = {}
            gone_at: dict[str, float] = {}
            main_at = None
            taken: set[str] = set()
            next_squeue = 0.0
            while main_at is None or not all(n in unheld_at and n in gone_at for n in taken):
                now = time.monotonic()
                if now - t0 > 30:
                    raise TimeoutError(f"round {k + 1}: main job or vacate not seen within 30 s")
                held = held_by(h, job.id)
                for n in pilot_of:
                    if n not in unheld_at and n not in held:
                        unheld_at[n] = now
                    if n not in gone_at and not any(alive(p) for p in procs[n]):
                        gone_at[n] = now
                if main_at is None and now >= next_squeue:
                    j = cluster.jobs().get(main)
                    if j and j["job_state"] in ("RUNNING", "COMPLETING", "COMPLETED"):
                        main_at = time.monotonic()
                        taken = set(cluster.run("scontrol", "show", "hostnames", j["nodes"]).stdout.split())
                    next_squeue = time.monotonic() + 0.02
                time.sleep(0.002)
            leave_at = max(unheld_at[n] for n in taken)
            vacated_at = max(max(unheld_at[n], gone_at[n]) for n in taken)
            for n in taken:         # Slurm's part (submission -> SIGTERM) and ours (SIGTERM -> ...)
                link = links.get(n)
                if link is not None and link.signalled_at is not None:
                    term = link.signalled_at - wall0 + t0
                    out["sigterm"].append((term - t0) * 1000)
                    out["term_leave"].append((unheld_at[n] - term) * 1000)
                    out["term_gone"].append((max(unheld_at[n], gone_at[n]) - term) * 1000)
            out["leave"].append((leave_at - t0) * 1000)
            out["vacated"].append((vacated_at - t0) * 1000)
            out["main"].append((main_at - t0) * 1000)
            wait_for(lambda: cluster.job_state(main) not in ("RUNNING", "COMPLETING", "PENDING"), 30, "the main job's end", 0.01)
            ended = time.monotonic()
            wait_for(lambda: taken <= held_by(h, job.id), 60, "the nodes harvested again", 0.01)
            out["reharvest"].append((time.monotonic() - ended) * 1000)
            log(f"[bench.slurm] {k + 1}/{repeats}: leave {out['leave'][-1]:.0f} ms, vacated "
                f"{out['vacated'][-1]:.0f} ms, main job running {out['main'][-1]:.0f} ms, harvested again "
                f"{out['reharvest'][-1]:.0f} ms after it ended", file=sys.stderr)
            wait_for(full, 240, f"the job back on all {nodes} nodes")
        left = processes_with_env(f"HARVEST_JOB={job.id}")
    finally:
        if h is not None:
            h.close()
        stray = cluster.stop()
    if stray:
        raise RuntimeError(f"left running in the Slurm namespace: {stray}")
    if dispatch == "pilot" and any(alive(p) for p in left):
        raise RuntimeError(f"worker processes outlived the harvester: {sorted(left)}")

    def p(key: str, q: float) -> float:
        return round(percentile(out[key], q), 1)
    return {"vacate_ms_p50": p("vacated", 0.5), "vacate_ms_p95": p("vacated", 0.95),
            "main_start_ms_p50": p("main", 0.5), "main_start_ms_p95": p("main", 0.95),
            "leave_ms_p50": p("leave", 0.5), "leave_ms_p95": p("leave", 0.95),
            "reharvest_ms_p50": p("reharvest", 0.5), "reharvest_ms_p95": p("reharvest", 0.95),
            "sigterm_ms_p50": p("sigterm", 0.5), "sigterm_ms_p95": p("sigterm", 0.95),
            "sigterm_to_leave_ms_p50": p("term_leave", 0.5), "sigterm_to_leave_ms_p95": p("term_leave", 0.95),
            "sigterm_to_vacated_ms_p50": p("term_gone", 0.5), "sigterm_to_vacated_ms_p95": p("term_gone", 0.95),
            "rounds": len(out["vacated"]), "nodes": nodes, "main_nodes": main_nodes, "slots": slots,
            "dispatch": dispatch, "worker_grace_s": grace_s, "slurm": cluster.version}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.slurm", description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--main-nodes", type=int, default=4)
    ap.add_argument("--slots", type=int, default=1,
                    help="GPUs per node (Gres=gpu:N), so ranks per node (default 1)")
    ap.add_argument("--dispatch", choices=("pilot", "simulated"), default="pilot")
    ap.add_argument("--grace", type=float, default=PilotSettings.worker_grace_s,
                    help="seconds a preempted pilot gives its worker between SIGTERM and SIGKILL")
    ap.add_argument("--slurm", choices=VERSIONS, default=HOST_VERSION,
                    help=f"the Slurm version (default {HOST_VERSION}, the host's; others run in a chroot)")
    ap.add_argument("--keep", type=Path, metavar="DIR",
                    help="run in this new folder and keep it (Slurm's logs, the pilots' output, the store)")
    ap.add_argument("--quick", action="store_true",
                    help="2 main jobs of 1 node on 2 harvested nodes: does every step still work")
    args = ap.parse_args(argv)
    if args.quick:
        args.repeats, args.nodes, args.main_nodes = 2, 2, 1
    if not 1 <= args.main_nodes <= args.nodes:
        ap.error("--main-nodes must be between 1 and --nodes")
    if not 1 <= args.slots <= 64:
        ap.error("--slots must be between 1 and 64")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=False)
        r = measure(args.keep, args.repeats, args.nodes, args.main_nodes, args.dispatch, args.grace, args.slots,
                    version=args.slurm)
    else:
        with tempfile.TemporaryDirectory(prefix="bench-slurm-") as tmp:
            r = measure(Path(tmp), args.repeats, args.nodes, args.main_nodes, args.dispatch, args.grace, args.slots,
                        version=args.slurm)
    print(f"Slurm {args.slurm}: {args.repeats} main jobs of {args.main_nodes} nodes on {args.nodes} harvested nodes "
          f"of {args.slots} slot(s) (Gres=gpu:{args.slots}, {args.slots} rank(s) per node; {args.dispatch} workers, "
          f"worker grace {args.grace:g} s)")
    print(f"{'from the main job submission to':<58} {'p50 ms':>8} {'p95 ms':>8} {'goal':>10}")
    print(f"{'the harvester off its nodes (leave handled)':<58} {r['leave_ms_p50']:>8} {r['leave_ms_p95']:>8}")
    print(f"{'nodes vacated (leave handled, pilots and workers gone)':<58} {r['vacate_ms_p50']:>8} "
          f"{r['vacate_ms_p95']:>8} {'<= 1000':>10}")
    print(f"{'the main job RUNNING':<58} {r['main_start_ms_p50']:>8} {r['main_start_ms_p95']:>8} {'<= 2000':>10}")
    print(f"{'  of which Slurm: submission -> SIGTERM to each pilot':<58} {r['sigterm_ms_p50']:>8} {r['sigterm_ms_p95']:>8}")
    print(f"{'  of which harvester: SIGTERM -> leave handled (per node)':<58} {r['sigterm_to_leave_ms_p50']:>8} "
          f"{r['sigterm_to_leave_ms_p95']:>8}")
    print(f"{'  of which harvester: SIGTERM -> node vacated (per node)':<58} {r['sigterm_to_vacated_ms_p50']:>8} "
          f"{r['sigterm_to_vacated_ms_p95']:>8}")
    print(f"{'main job end -> its nodes harvested again':<58} {r['reharvest_ms_p50']:>8} {r['reharvest_ms_p95']:>8}")
    if args.json:
        print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
