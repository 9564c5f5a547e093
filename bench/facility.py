"""A facility day on a real Slurm: the Summit trace as main jobs, played twice, without and with
the harvester, to show what harvesting costs the main workload and what it gains.

    python -m bench.facility [--json] [--nodes 128] [--start ISO] [--hours 1] [--compress 10]
                             [--slurm 22.05|24.11] [--jobs FILE] [--job-count 10] [--keep DIR] [--quick]

1. Brings up the test Slurm (tests/support/slurm.py: munged, slurmctld and N slurmd on loopback,
   the README's site set-up: partition `main` preempts partition `scavenger`, GraceTime=0).
2. Takes a slice of the Summit trace (bench/facility_slice.py): N nodes (the first N, in machine
   order, that are idle at some moment of the window: a node busy throughout gives nothing to
   harvest) over [start, start + hours). Each busy period becomes a main job pinned to its node
   (`sbatch -p main -w nodeI`), submitted at its trace time divided by `--compress` K and running
   for its span divided by K (cut at the window's end); the job writes the time it began and the
   time its span ended. Periods that are under way at the window's start are submitted, and
   running, before the clock starts.
3. Plays the slice without the harvester, then with it (bench/facility_slurm.py), as a site runs
   it (`python -m app --source slurm --dispatch simulated --no-profiler --slurm-max-pilots N`,
   every other setting its default) and `--job-count` jobs of the job set registered through the
   API. The whole world runs K times faster: each job's rescale costs are divided by K and its
   throughputs multiplied by K, so the harvest is the day's, seen in time-lapse.
4. Reports, side by side (bench/facility_report.py): main-job start delay (the trace's time -> the
   job running, from the time the job wrote), and per job the delay added by the harvester; the
   share of the slice's idle node-seconds held by pilots and used by jobs against what
   core.replay predicts for the same nodes, window, compression and jobs; vacate latency (Slurm's
   signal to a pilot -> the pilot gone, from the harvester's /metrics histogram); the harvester's
   CPU share of one core (its process and the Slurm commands it ran) and peak RSS; slurmctld RPCs
   per second caused by the harvester (root's RPCs with it minus without it, from `sdiag`, over
   the same played window), and the main scheduler's cycle times with and without it; pilots
   submitted, cancelled, preempted; hub connections at peak.
5. The lag, which the compression does not shrink (bench/facility_lag.py): from a node going idle
   (the time its main job wrote when its span ended) to a pilot holding it (the node_join event
   in the harvester's store, stamped when the hub took the pilot's hello: exact, where Slurm's
   job start time has whole seconds) and to a job using it (the first allocation in the store that
   adds the node), p50/p99 in real seconds. At ×K each idle period is K times shorter, so the
   same lag costs K times its share of it. From it, the harvest at ×1 and ×2 as a fraction of
   the replay's: per idle period, its length in the trace minus c × the measured lag is usable
   at ×c, and nothing else is lost (the model in full is bench/facility_lag.py's docstring; the
   same model at ×K, `harvest_modelled`, beside the measured share is its error). A ×2 run of
   the same slice checks the ×2 projection.

With --json the last stdout line is the whole result (`nodes`, `main_delay_ms`,
`added_delay_ms_p50`, `harvest_share`, `replay_share`, `harvest_vs_replay`, `idle_to_held_s_p50`,
`idle_to_used_s_p50/p99`, `harvest_projected_x1`, `harvest_projected_x2`, `harvest_modelled`,
`vacate_ms_p50`, `harvester_cpu_pct`, `harvester_rpc_per_s`, ...). `--quick` (16 nodes, a
3-minute slice at K=6, about 90 s in all) checks that every step works (tests/test_bench_facility.py), not the
figures. Progress goes to stderr. What the figures mean for a machine of Summit's size is a
calculation in docs/evaluation/facility.md.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

from bench.facility_lag import write_lags
from bench.facility_report import histogram_quantile, period_lags, print_table, report
from bench.facility_slice import compressed_jobs, replay_prediction, take_slice
from bench.results import hand_over
from bench.facility_slurm import log, parse_sdiag, play
from core.replay import DEFAULT_JOBS, DEFAULT_NODE_LIST, DEFAULT_TRACE
from core.timeutil import parse_iso

__all__ = ["histogram_quantile", "parse_sdiag", "take_slice", "main"]

DEFAULT_START = "2021-02-18T12:00:00Z"
QUICK = {"nodes": 16, "start": "2021-02-17T12:00:00Z", "hours": 0.05, "compress": 6.0, "job_count": 3}
#: goals from the issue: added main-job start delay, harvest against the replay, harvester load
GOALS = {"added_delay_ms_p50": 500.0, "added_delay_ms_p99": 1000.0, "harvest_vs_replay": 0.90,
         "harvester_cpu_pct": 10.0, "harvester_rpc_per_s": 5.0}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bench.facility", description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print the whole result as JSON, as the last stdout line")
    ap.add_argument("--nodes", type=int, default=128, help="Slurm nodes, the slice's first N ever idle (default 128)")
    ap.add_argument("--start", default=DEFAULT_START, help=f"the slice's start in the trace, ISO (default {DEFAULT_START})")
    ap.add_argument("--hours", type=float, default=1.0, help="the slice's length in trace hours (default 1)")
    ap.add_argument("--compress", type=float, default=10.0, help="play the slice K times faster (default 10)")
    ap.add_argument("--slurm", default=None, help="Slurm version (default: the host's)")
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE, help="the node-state trace (default: Summit's)")
    ap.add_argument("--node-list", type=Path, default=DEFAULT_NODE_LIST, help="the trace's nodes in machine order")
    ap.add_argument("--jobs", type=Path, default=DEFAULT_JOBS, help="the job set the harvester runs (default: ImageNet)")
    ap.add_argument("--job-count", type=int, default=10, help="register the job set's first N jobs (default 10)")
    ap.add_argument("--keep", type=Path, help="keep Slurm's, the harvester's and the pilots' files here, and "
                                              "lags.csv: each idle period's lag")
    ap.add_argument("--plot", type=Path, help="write the delay CDF and harvest-over-time plot here (.png/.html)")
    ap.add_argument("--save", type=Path, help="write the result JSON here as well")
    ap.add_argument("--quick", action="store_true", help="16 nodes, a short slice: checks every step, not the figures")
    return ap


def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.quick:
        for k, v in QUICK.items():
            setattr(args, k, v)
    if args.nodes < 1 or args.hours <= 0 or args.compress <= 0 or args.job_count < 1:
        raise SystemExit("--nodes, --hours, --compress and --job-count must be positive")
    from tests.support.slurm import HOST_VERSION
    version = args.slurm or HOST_VERSION
    t0 = time.monotonic()
    sl = take_slice(args.trace, args.node_list, args.nodes, parse_iso(args.start), args.hours, args.compress)
    jobs = compressed_jobs(args.jobs, args.job_count, args.compress)
    log(f"slice: {len(sl.names)} nodes, {len(sl.jobs)} main jobs ({sum(j.initial for j in sl.jobs)} under way at "
        f"the start), {sl.idle_node_s:.0f} idle node-s over {sl.window_s:.0f} s")
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="bench-facility-", dir=args.keep))
    replay = replay_prediction(sl, jobs, folder)
    log(f"replay predicts {replay['harvest_pct']:.1f}% of the idle node-seconds used")
    (folder / "without").mkdir()
    (folder / "with").mkdir()
    without = play(sl, jobs, False, version, folder / "without")
    with_ = play(sl, jobs, True, version, folder / "with")
    r = report(sl, version, without, with_, replay)
    write_lags(folder / "lags.csv", period_lags(sl, with_)[1])
    r["bench_s"] = round(time.monotonic() - t0, 1)
    print_table(r)
    if args.plot:
        from bench.facility_plot import plot
        log(f"plot: {plot(sl, without, with_, r, args.plot)}")
    hand_over(r, args.save, args.json, folder, bool(args.keep))
    return 0


if __name__ == "__main__":
    sys.exit(main())
