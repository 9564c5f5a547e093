"""Serve the dashboard: `python -m app [--host H] [--port P] [--db PATH] [--users FILE] ...`.

One process: the Dash app and its API under waitress, and the APScheduler thread that drives
the controller (so the scheduler is never duplicated by server workers). With a store that
already holds a run, that run continues (after a crash too); --fresh starts over.
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import signal
import sys
from pathlib import Path
from typing import Optional

from core.controller import QUEUE_ORDERS, ControllerConfig
from core.errors import InputError
from core.policies import POLICIES
from core.jpa import JPAConfig
from core.replay import CURVES, DEFAULT_JOBS, DEFAULT_TRACE, ReplaySettings
from core.dispatchers.simulated import SimulatedDispatcher
from core.service import Harvester, LiveHarvester
from core.sources.static import StaticSource

from . import slurm_options
from .auth import Users

DEFAULT_START = "2021-02-10T20:00:00Z"   # the ImageNet job set starts arriving at 20:21
SCENARIO_KEYS = ("trace", "jobs", "node_list", "nodes", "racks", "start", "hours", "policy", "tfwd",
                 "max_jobs", "queue", "speed", "curves", "seed")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m app", description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8050)
    ap.add_argument("--db", type=Path, default=Path("harvest.db"), help="SQLite store (default: harvest.db)")
    ap.add_argument("--fresh", action="store_true", help="start a new run even if --db holds one")
    ap.add_argument("--users", type=Path, help="users file (python -m app.users add ...); "
                                               "default: HARVEST_USERS_FILE / HARVEST_USERS, else a demo account")
    ap.add_argument("--scenario", type=Path, help=f"JSON file with replay settings ({', '.join(SCENARIO_KEYS)})")
    g = ap.add_argument_group("replay (override --scenario)")
    g.add_argument("--trace", type=Path)
    g.add_argument("--jobs", type=Path)
    g.add_argument("--node-list", type=Path)
    g.add_argument("--nodes", help="replay: use the first N nodes; live: the node inventory file")
    g.add_argument("--racks")
    g.add_argument("--start", help=f"window start, ISO 8601 (default {DEFAULT_START})")
    g.add_argument("--hours", type=float, help="window length (default: to the end of the trace)")
    g.add_argument("--policy", choices=POLICIES)
    g.add_argument("--tfwd", type=float)
    g.add_argument("--max-jobs", type=int)
    g.add_argument("--queue", choices=QUEUE_ORDERS)
    g.add_argument("--speed", type=float, help="simulated seconds per wall second (default 60)")
    g.add_argument("--curves", choices=CURVES,
                   help="what the allocator is told of each job's curve: given (default), linear (the usual "
                        "user guess), learned (hidden: the profiler learns it)")
    g.add_argument("--seed", type=int, help="--curves learned: measurement noise seed (default 0)")
    live = ap.add_argument_group("live mode (instead of a replay)")
    live.add_argument("--dispatch", choices=("simulated", "local", "ssh", "pilot"),
                      help="run jobs live: simulated progress, local processes, over ssh, or inside "
                           "Slurm pilot jobs (--source slurm)")
    live.add_argument("--source", choices=("static", "slurm"), default="static",
                      help="live: where idle nodes come from: a static list (--local-nodes / --nodes), "
                           "or a Slurm cluster's idle nodes, held with preemptible pilot jobs")
    live.add_argument("--local-nodes", type=int, help="live: this many local 'nodes' (with --dispatch local/simulated)")
    live.add_argument("--ssh-config", type=Path, help="live: ssh client config for --dispatch ssh (Host aliases, keys)")
    live.add_argument("--workdir", default="", help="live: working directory of workers on the nodes")
    live.add_argument("--profile-sizes", type=int, default=3,
                      help="live: sizes the profiler measures each new job at, whatever it costs (default 3; "
                           "0: only where learning pays)")
    live.add_argument("--no-profiler", action="store_true",
                      help="live: take every job's curve as given (then a curve is required)")
    ap.add_argument("--tick", type=float, help="seconds between scheduler ticks (replay 0.5, live 0.2)")
    ap.add_argument("--threads", type=int, default=8, help="web server threads")
    slurm_options.add_options(ap)
    return ap


def scenario(args) -> tuple[ReplaySettings, float]:
    s: dict = {"trace": str(DEFAULT_TRACE), "jobs": str(DEFAULT_JOBS), "start": DEFAULT_START, "speed": 60.0}
    if args.scenario:
        try:
            loaded = json.loads(args.scenario.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"{args.scenario}: {e}")
        unknown = set(loaded) - set(SCENARIO_KEYS)
        if unknown:
            raise ValueError(f"{args.scenario}: unknown key(s) {', '.join(sorted(unknown))}")
        s.update(loaded)
    for k in SCENARIO_KEYS:
        v = getattr(args, k, None)
        if v is not None:
            s[k] = str(v) if isinstance(v, Path) else v
    if s.get("nodes") is not None:
        try:
            s["nodes"] = int(s["nodes"])
        except ValueError:
            raise ValueError("--nodes: a replay takes a number of nodes (a node file needs --dispatch)")
    for k in ("hours", "tfwd", "speed"):
        if s.get(k) is not None and not math.isfinite(float(s[k])):
            raise ValueError(f"--{k} must be a finite number")
    base = ControllerConfig()
    config = ControllerConfig(s.get("policy", base.policy), base.solver, base.objective,
                              float(s.get("tfwd", base.tfwd)), int(s.get("max_jobs", base.max_jobs)),
                              s.get("queue", base.queue))
    hours = s.get("hours")
    if hours is not None and not (math.isfinite(float(hours)) and float(hours) > 0):
        raise ValueError("--hours must be positive")
    settings = ReplaySettings(Path(s["trace"]), Path(s["jobs"]),
                              Path(s["node_list"]) if s.get("node_list") else None, s.get("nodes"),
                              s.get("racks"), s.get("start"), float(hours) if hours else None, 0.0, config,
                              s.get("curves", "given"), seed=int(s.get("seed", 0)))
    return settings, float(s["speed"])


def live_config(args) -> ControllerConfig:
    return ControllerConfig(args.policy or "milp", "dp", "throughput", float(args.tfwd or 10.0),
                            int(args.max_jobs or 10), args.queue or "fcfs")


def live_harvester(args) -> LiveHarvester:
    """Live mode: nodes from an inventory file or N local 'nodes', jobs on the chosen dispatcher."""
    from core.inventory import load_inventory, local_nodes
    if args.source == "slurm":
        return slurm_options.slurm_harvester(args, live_config(args))
    if args.dispatch == "pilot":
        raise ValueError("--dispatch pilot runs workers inside Slurm pilot jobs: add --source slurm")
    if args.local_nodes is not None and args.nodes:
        raise ValueError("give either --local-nodes or --nodes FILE")
    if args.local_nodes is not None:
        if args.local_nodes < 1:
            raise ValueError("--local-nodes must be at least 1")
        if args.dispatch == "ssh":
            raise ValueError("--dispatch ssh needs --nodes FILE (hostname, ssh target, slots)")
        specs = local_nodes(args.local_nodes)
    elif args.nodes:
        specs = load_inventory(Path(args.nodes))
    else:
        raise ValueError("live mode needs --local-nodes N or --nodes FILE")
    config = live_config(args)
    source = StaticSource([n.name for n in specs])
    if args.dispatch == "simulated":
        dispatcher = SimulatedDispatcher()
    else:
        from core.dispatchers.workers import make_worker_dispatcher
        dispatcher = make_worker_dispatcher(args.dispatch, specs, args.db,
                                            report_url=f"http://{args.host}:{args.port}/api/workers",
                                            ssh_config=str(args.ssh_config) if args.ssh_config else None,
                                            workdir=args.workdir)
    real = args.dispatch != "simulated"
    return LiveHarvester(args.db, source, dispatcher, config, tick_s=args.tick or 0.2, fresh=args.fresh,
                         require_command=real, jpa=live_profiler(args, real))


def live_profiler(args, real: bool) -> Optional[JPAConfig]:
    """The profiler's settings on real workers (None with simulated ones, or --no-profiler)."""
    if args.profile_sizes < 0:
        raise ValueError("--profile-sizes must be 0 or more")
    return None if (args.no_profiler or not real) else JPAConfig.live(args.profile_sizes)


def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("apscheduler").setLevel(logging.WARNING)
    try:
        live = bool(args.dispatch) or args.source == "slurm"
        settings, speed = scenario(args) if not live else (None, 1.0)
        users = Users.load(args.users)
        password = None
        if users is None:
            users, password = Users.demo()
        if live:
            harvester = live_harvester(args)
        else:
            harvester = Harvester(args.db, settings, speed=speed, tick_s=args.tick or 0.5, fresh=args.fresh)
        harvester.open()
    except (InputError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from waitress import serve

    from .web import create_app
    app = create_app(harvester, users)
    url = f"http://{args.host}:{args.port}"
    snap = harvester.snapshot
    print(f"dashboard on {url}  ({len(snap.nodes):,} nodes, {harvester.speed:g}x, store {args.db})", flush=True)
    if password:
        print(f"demo account: user 'demo' (staff), password '{password}'  "
              f"(pass --users FILE for real accounts)", flush=True)

    def stop(signum, _frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, stop)
    try:
        serve(app.server, host=args.host, port=args.port, threads=args.threads, ident="harvester")
    except KeyboardInterrupt:
        pass
    finally:
        harvester.close()
        print("stopped; state saved in", args.db, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
