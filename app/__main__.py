"""Serve the dashboard: `python -m app [--config FILE] [--host H] [--port P] [--db PATH] ...`.

Every option is also a key of the configuration file (TOML, `--config FILE` or HARVEST_CONFIG:
`port = 8123`, `max_jobs = 4`) and a variable (HARVEST_PORT, HARVEST_MAX_JOBS); a flag beats a
variable, a variable beats the file, the file beats the default (core.settings.Options merges
them with pydantic-settings). `--print-config` shows the result and where each value came from.

One process: the Dash app and its API under waitress, and the APScheduler thread that drives
the controller (so the scheduler is never duplicated by server workers). With a store that
already holds a run, that run continues (after a crash too); --fresh starts over.

The engine (core.assemble: torch, PuLP), the web app (Dash, Plotly) and the accounts are imported
in main() once the command line is parsed, so `--help` and a bad flag answer at once
(tests/test_app_startup.py checks what `--help` imports).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import sqlite3
import sys
from pathlib import Path
from typing import Optional

from core.admission import DEFAULT_USER_MAX_JOBS
from core.crashes import DEFAULT_CRASH_WINDOW_S
from core.errors import InputError, SettingsError
from core.registrations import DEFAULT_PER_DAY, DEFAULT_PER_MINUTE
from core.settings import (CURVES, DEFAULT_JOBS, DEFAULT_TRACE, LOG_LEVELS, OBJECTIVES, POLICIES, QUEUE_ORDERS, HarvesterSettings,
                           OptionError, Options, WebSettings, check_listeners, parse_tfwd, web_listen)

from . import slurm_options
from .webconfig import WebConfig

DEFAULT_START = "2021-02-10T20:00:00Z"   # the ImageNet job set starts arriving at 20:21
SCENARIO_KEYS = ("trace", "jobs", "node_list", "nodes", "racks", "start", "hours", "policy", "objective",
                 "fair_half_life", "tfwd",
                 "max_jobs", "queue", "visitor_slots", "speed", "curves", "seed", "gpus_per_node")
CONFIG_KEYS = ("policy", "objective", "fair_half_life", "tfwd", "max_jobs", "queue", "visitor_slots")
#: the demo lane in a replay: running slots only registered jobs take, so that a visitor's job runs
DEMO_VISITOR_SLOTS = 2
#: settings whose option is not --NAME
FLAGS = {"tick_s": "--tick", "live.workers.crash_window_s": "--crash-window",
         "live.workers.heartbeat_timeout_s": "--heartbeat-timeout",
         "live.workers.start_timeout_s": "--start-timeout", "live.workers.rendezvous_timeout_s": "--rendezvous-timeout",
         "live.workers.max_pids": "--job-max-pids", "live.workers.max_checkpoint_gib": "--job-max-checkpoint-gib",
         "live.inventory": "--nodes", "live.profiler": "--no-profiler",
         "replay.node_list": "--node-list"}


def tfwd_arg(text: str) -> float | str:
    """--tfwd: seconds or auto."""
    try:
        return parse_tfwd(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"give seconds or auto, not {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    """The command line; every option's default is the one `core.settings.Options` declares."""
    ap = argparse.ArgumentParser(prog="python -m app", description=__doc__.splitlines()[0],
                                 epilog="Each option is also a key of the --config file (--max-jobs: max_jobs) and a "
                                        "variable (HARVEST_MAX_JOBS); flags beat variables, variables beat the file, "
                                        "the file beats the defaults shown here. --print-config shows the result.")
    ap.add_argument("--config", type=Path, metavar="FILE",
                    help="TOML file of options named after the flags (port = 8123); default: HARVEST_CONFIG, else none")
    ap.add_argument("--print-config", action="store_true",
                    help="print the effective settings and where each comes from (flag, env, file, default), "
                         "secrets masked, after checking them; start nothing")
    ap.add_argument("--log-format", choices=("text", "json"),
                    help="log records on stderr, one line each: text (time level logger: message) or json (default text)")
    ap.add_argument("--log-level", choices=LOG_LEVELS, help="the lowest level logged (default info)")
    ap.add_argument("--host", default="127.0.0.1", help="where the dashboard listens (default 127.0.0.1)")
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
    g.add_argument("--start", help=f"window start, ISO 8601 (default {DEFAULT_START} on the Summit trace, "
                                   "the beginning of any other)")
    g.add_argument("--hours", type=float, help="window length (default: to the end of the trace)")
    g.add_argument("--policy", choices=POLICIES)
    g.add_argument("--objective", choices=OBJECTIVES,
                   help="what the allocator maximises: throughput (default; samples/s), priority (weighted by "
                        "each job's priority), efficiency (per 1-node rate), fairshare (weighted by each owner's "
                        "fair-share factor: use against share, see --fair-half-life)")
    g.add_argument("--fair-half-life", type=float, metavar="S",
                   help="--objective fairshare: seconds after which an owner's use counts half (default 604800, "
                        "a week)")
    g.add_argument("--tfwd", type=tfwd_arg, help="seconds the allocator looks ahead, or auto: learned from the "
                                                  "idle fragments")
    g.add_argument("--max-jobs", type=int)
    g.add_argument("--queue", choices=QUEUE_ORDERS)
    g.add_argument("--visitor-slots", type=int, metavar="N",
                   help=f"replay: running slots beyond --max-jobs for registered jobs, which also go first in "
                        f"the queue and get nodes first (default {DEMO_VISITOR_SLOTS}; 0: none)")
    g.add_argument("--speed", type=float, help="simulated seconds per wall second (default 60)")
    g.add_argument("--curves", choices=CURVES,
                   help="what the allocator is told of each job's curve: given (default), linear (the usual "
                        "user guess), learned (hidden: the profiler learns it)")
    g.add_argument("--seed", type=int, help="--curves learned: measurement noise seed (default 0)")
    g.add_argument("--gpus-per-node", type=int,
                   help="GPUs each node brings, shown beside the nodes (default: 6 for the Summit trace, else 1)")
    live = ap.add_argument_group("live mode (instead of a replay)")
    live.add_argument("--dispatch", choices=("simulated", "local", "ssh", "pilot"),
                      help="run jobs live: simulated progress, local processes, over ssh, or inside "
                           "Slurm or PBS pilot jobs (--source slurm / pbs)")
    live.add_argument("--source", choices=("static", "slurm", "pbs"), default="static",
                      help="live: where idle nodes come from: a static list (--local-nodes / --nodes), "
                           "or a Slurm or PBS cluster's idle nodes, held with preemptible pilot jobs")
    live.add_argument("--local-nodes", type=int, help="live: this many local 'nodes' (with --dispatch local/simulated)")
    live.add_argument("--local-slots", type=int, default=1, metavar="N",
                      help="live: ranks per local node, one worker process each (GPUs per node; default 1)")
    live.add_argument("--ssh-config", type=Path, help="live: ssh client config for --dispatch ssh (Host aliases, keys)")
    live.add_argument("--workdir", default="", help="live: working directory of workers on the nodes")
    live.add_argument("--advertise", default="", metavar="HOST",
                      help="live: this host's address as the nodes reach it: the pilot hub, every job's "
                           "store and the progress reports use it (default 127.0.0.1: nodes on this host)")
    live.add_argument("--bind", default="", metavar="HOST",
                      help="live: where the servers for the nodes listen (default: --advertise)")
    live.add_argument("--worker-env", default="", metavar="NAME,...",
                      help="live: variables of this process that workers also get (a site's, e.g. "
                           "LD_LIBRARY_PATH); workers otherwise inherit only PATH, HOME, USER, LANG, LC_*, TZ, TMPDIR")
    live.add_argument("--run-as", default="", metavar="LAUNCHER",
                      help="live: run each job as its owner's Unix account (the users file's unix field) "
                           "with this prefix, {user} the account and {env} the names of the variables "
                           "workers get, e.g. 'sudo -n -u {user} --preserve-env={env} --'")
    live.add_argument("--trust-user-commands", action="store_true",
                      help="live: let every login run commands as the harvester's own Unix account where "
                           "no account is mapped (default: only staff)")
    live.add_argument("--profile-sizes", type=int, default=3,
                      help="live: sizes the profiler measures each new job at, whatever it costs (default 3; "
                           "0: only where learning pays)")
    live.add_argument("--crash-window", type=float, default=DEFAULT_CRASH_WINDOW_S, metavar="SECONDS",
                      help=f"live: a job fails when 3 of its workers are lost within this window "
                           f"(default {DEFAULT_CRASH_WINDOW_S:g})")
    live.add_argument("--heartbeat-timeout", type=float, default=15.0, metavar="SECONDS",
                      help="live: a worker silent this long (hung, stopped) loses its node at once (default 15)")
    live.add_argument("--start-timeout", type=float, default=300.0, metavar="SECONDS",
                      help="live: a job that holds nodes and makes no step (torchrun: prints no progress line) "
                           "this long fails, with its log's last line (default 300)")
    live.add_argument("--rendezvous-timeout", type=float, default=Options.model_fields["rendezvous_timeout"].default,
                      metavar="SECONDS",
                      help="live: a torchrun generation whose ranks have not all joined rank 0's store and formed "
                           "their process group this long after its start fails, naming the ranks that never "
                           "arrived (default 60)")
    live.add_argument("--job-max-pids", type=int, metavar="N",
                      help="live: a job whose processes on one node number more than this fails (kind limit), "
                           "its processes there killed (default 512; 0: no cap)")
    live.add_argument("--job-max-checkpoint-gib", type=float, metavar="GIB",
                      help="live: a job whose checkpoint folder takes more disk than this fails (kind limit); "
                           "nothing is deleted (default 50; 0: no cap)")
    live.add_argument("--no-profiler", action="store_true",
                      help="live: take every job's curve as given (then a curve is required)")
    ap.add_argument("--user-max-jobs", type=int, default=DEFAULT_USER_MAX_JOBS, metavar="N",
                    help=f"queued plus running jobs one user may have; staff are exempt (default "
                         f"{DEFAULT_USER_MAX_JOBS}; 0: no limit)")
    ap.add_argument("--user-jobs-per-minute", type=int, default=DEFAULT_PER_MINUTE, metavar="N",
                    help=f"jobs one user may register in any 60 s; one more is a 429 with Retry-After; staff are "
                         f"exempt (default {DEFAULT_PER_MINUTE}; 0: no limit)")
    ap.add_argument("--user-jobs-per-day", type=int, default=DEFAULT_PER_DAY, metavar="N",
                    help=f"jobs one user may register in any 24 h, cancelled ones counted too (a 429); staff are "
                         f"exempt (default {DEFAULT_PER_DAY}; 0: no limit)")
    ap.add_argument("--tick", type=float, help="seconds between scheduler ticks (replay 0.5, live 0.2)")
    web = ap.add_argument_group("web server")
    web.add_argument("--threads", type=int, default=WebConfig.threads,
                     help=f"web server threads (default {WebConfig.threads})")
    web.add_argument("--connection-limit", type=int, default=WebConfig.connection_limit,
                     help=f"open connections at once (default {WebConfig.connection_limit})")
    web.add_argument("--channel-timeout", type=int, default=WebConfig.channel_timeout_s, metavar="S",
                     help=f"seconds an idle connection stays open (default {WebConfig.channel_timeout_s})")
    web.add_argument("--per-address-limit", type=int, default=WebConfig.per_address_limit, metavar="N",
                     help=f"open connections one client address may hold; more are closed at once "
                          f"(default {WebConfig.per_address_limit}; 0: no limit)")
    web.add_argument("--header-timeout", type=float, default=WebConfig.header_timeout_s, metavar="S",
                     help=f"seconds a request's headers may take from its first byte; a connection still "
                          f"sending them is closed (default {WebConfig.header_timeout_s:g})")
    web.add_argument("--session-idle", type=float, default=WebConfig.session_idle_s, metavar="S",
                     help=f"seconds a browser login lasts unused (default {WebConfig.session_idle_s:g})")
    web.add_argument("--session-max", type=float, default=WebConfig.session_max_s, metavar="S",
                     help=f"seconds a browser login lasts at most, however much it is used "
                          f"(default {WebConfig.session_max_s:g})")
    web.add_argument("--metrics-interval", type=float, default=WebConfig.metrics_interval_s, metavar="S",
                     help=f"/metrics is rebuilt at most every S seconds; scrapes in between get the last text "
                          f"(default {WebConfig.metrics_interval_s:g}; 0: rebuilt on every scrape)")
    web.add_argument("--metrics-token-file", type=Path, metavar="FILE",
                     help="/metrics answers only requests with Authorization: Bearer <the token on FILE's first "
                          "line>, others a 401 (default: open to anyone who can reach the port)")
    web.add_argument("--secure-cookies", action="store_true",
                     help="send the login cookie over HTTPS only (a site behind TLS)")
    slurm_options.add_options(ap)
    slurm_options.add_pbs_options(ap)
    fields = Options.model_fields
    for action in ap._actions:
        if action.dest in fields:
            action.default = fields[action.dest].default
    return ap


def given_flags(argv: list[str]) -> tuple[dict, bool]:
    """The options on the command line, and only those (a default is not a flag: it must not
    hide the file's or the environment's value); and whether --print-config was given."""
    ap = build_parser()
    for action in ap._actions:
        if action.dest != "help":
            action.default = argparse.SUPPRESS
    given = vars(ap.parse_args(argv))
    return given, bool(given.pop("print_config", False))


def replay_settings(args) -> tuple[dict, float]:
    """The replay part of the settings: the defaults, then --scenario's file, then the flags."""
    s: dict = {"trace": str(DEFAULT_TRACE), "jobs": str(DEFAULT_JOBS), "speed": 60.0,
               "visitor_slots": DEMO_VISITOR_SLOTS}
    if args.scenario:
        try:
            loaded = json.loads(args.scenario.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"{args.scenario}: {e}")
        if not isinstance(loaded, dict):
            raise ValueError(f"{args.scenario}: give a JSON object of settings")
        unknown = set(loaded) - set(SCENARIO_KEYS)
        if unknown:
            raise ValueError(f"{args.scenario}: unknown key(s) {', '.join(sorted(unknown))}")
        s.update(loaded)
    s.update({k: str(v) if isinstance(v, Path) else v for k in SCENARIO_KEYS
              if (v := getattr(args, k, None)) is not None})
    if "start" not in s and s["trace"] == str(DEFAULT_TRACE):
        s["start"] = DEFAULT_START       # the demo's window; another trace starts at its beginning
    if s.get("nodes") is not None:
        try:
            s["nodes"] = int(s["nodes"])
        except ValueError:
            raise SettingsError("replay.nodes", "a replay takes a number of nodes (a node file needs "
                                                "{live.dispatch})") from None
    config = {k: s.pop(k) for k in CONFIG_KEYS if k in s}
    speed = s.pop("speed")
    return {**s, "config": config}, speed


def live_settings(args) -> dict:
    config = {k: getattr(args, k) for k in CONFIG_KEYS if getattr(args, k) is not None}
    live = {"source": args.source, "dispatch": args.dispatch, "local_nodes": args.local_nodes,
            "local_slots": args.local_slots,
            "inventory": args.nodes, "ssh_config": args.ssh_config, "workdir": args.workdir,
            "advertise": args.advertise, "bind": args.bind,
            "worker_env": tuple(n.strip() for n in args.worker_env.split(",") if n.strip()),
            "run_as": args.run_as, "trust_user_commands": args.trust_user_commands,
            "report_url": f"http://{url_host(args.advertise or args.host)}:{args.port}/api/workers",
            "profiler": not args.no_profiler, "profile_sizes": args.profile_sizes, "config": config,
            "workers": {"crash_window_s": args.crash_window, "heartbeat_timeout_s": args.heartbeat_timeout,
                        "start_timeout_s": args.start_timeout,
                        "rendezvous_timeout_s": args.rendezvous_timeout, "max_pids": args.job_max_pids,
                        "max_checkpoint_gib": args.job_max_checkpoint_gib}}
    if args.source in ("slurm", "pbs"):
        live["slurm"] = slurm_options.settings_from(args)
    return live


def url_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def listen_on(args, settings: HarvesterSettings) -> str:
    """waitress's `listen`: the dashboard's --host and, live, where the nodes' workers report
    (--bind, else --advertise), one socket where a wildcard --host already covers that address;
    each socket tried first (core.listeners), so settings that cannot listen are a SettingsError
    naming the options, for --print-config as for a start, before anything is written."""
    return web_listen(check_listeners(args.host, args.port, settings))


def settings_from(args) -> HarvesterSettings:
    """The command line as settings (checked there, once); raises SettingsError or ValueError."""
    data: dict = {"db": args.db, "fresh": args.fresh, "tick_s": args.tick, "user_max_jobs": args.user_max_jobs,
                  "user_jobs_per_minute": args.user_jobs_per_minute, "user_jobs_per_day": args.user_jobs_per_day}
    if bool(args.dispatch) or args.source in ("slurm", "pbs"):
        data["live"] = live_settings(args)
    else:
        data["replay"], data["speed"] = replay_settings(args)
    return HarvesterSettings.parse(data)


def flag(path: str) -> str:
    """The option that sets a setting, for error messages (`replay.hours` -> `--hours`)."""
    if path in FLAGS:
        return FLAGS[path]
    top, _, rest = path.partition(".")
    name = rest or top                      # below replay. / live., or a top-level setting
    if name.startswith("slurm."):
        return slurm_options.OPTIONS.get(name[6:], path)
    name = name.removeprefix("config.")
    return "--" + name.replace("_", "-") if name else path


def web_config(args) -> WebConfig:
    """The web server options, checked (core.settings.WebSettings); raises ValueError naming the option."""
    try:
        w = WebSettings.parse({k: getattr(args, k) for k in WebSettings.model_fields})
    except SettingsError as e:
        raise ValueError(e.render(flag)) from None
    return WebConfig.of(w)


def option_of(path: str) -> str:
    """The option (a key of the file) that sets a setting: `replay.hours` -> `hours`."""
    f = flag(path)
    return f[2:].replace("-", "_") if f.startswith("--") else f


def naming(opts: Options):
    """How an error names a setting: by where its value came from (`--max-jobs`, HARVEST_MAX_JOBS,
    `harvest.toml: max_jobs`); a default by its flag, or by its key when there is a file."""
    def short(path: str) -> str:
        o = opts.origin(option_of(path))
        if o.kind in ("file", "env"):
            return o.name
        return option_of(path) if (o.kind == "default" and opts.config) else flag(path)

    def lead(path: str) -> str:
        o = opts.origin(option_of(path))
        if o.kind == "default" and opts.config:
            return f"{opts.config}: {option_of(path)}"
        return o.where() if o.kind != "default" else flag(path)
    return short, lead


def render(e: SettingsError, opts: Options) -> str:
    """One line: the setting named by where it came from, the others in the message likewise."""
    short, lead = naming(opts)
    body = SettingsError("", e.message).render(short)
    return f"{lead(e.field)}: {body}" if e.field else body


def print_config(opts: Options, out=None) -> None:
    """The effective settings as a TOML file would hold them, each with where it came from."""
    out = out or sys.stdout
    rows = []
    for name, value, origin in opts.effective():
        if name == "config":
            continue
        text = "" if value is None else toml_value(value)
        rows.append((f"{name} = {text}" if value is not None else f"# {name} =  (not set)", origin.describe()))
    width = max(len(r[0]) for r in rows) + 2
    print("# python -m app: the effective settings; precedence: flag > env (HARVEST_...) > file > default", file=out)
    print(f"# file: {opts.config or '(none)'}", file=out)
    for text, origin in rows:
        print(f"{text.ljust(width)}# {origin}", file=out)


def toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    return json.dumps(str(v))      # a TOML basic string is JSON's (escapes included)


def raise_descriptor_limit() -> int:
    """The soft limit on open descriptors up to the hard one: the jobs' stores and the web
    clients share this process's descriptors. Returns the limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["check"]:
        from .check import main as check
        return check(argv[1:])
    flags, show = given_flags(argv)
    try:
        args = Options.load(flags)       # the flags over HARVEST_... over the --config file over the defaults
        web = WebConfig.of(args.web())
        settings = settings_from(args)
        listen = listen_on(args, settings)
    except SettingsError as e:
        print(f"error: {render(e, args)}", file=sys.stderr)
        return 2
    except (OptionError, InputError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if show:
        print_config(args)
        return 0
    from . import logs
    logs.setup(args.log_format, args.log_level)
    if args.secret_key is not None:      # from the file or HARVEST_SECRET_KEY: where app.auth reads it
        os.environ["HARVEST_SECRET_KEY"] = args.secret_key.get_secret_value()

    def stop(signum, _frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, stop)  # a stop while starting up also closes what was opened
    harvester = None
    try:
        from core.assemble import build

        from .auth import Users, stored_key
        raise_descriptor_limit()
        try:
            users = Users.load(args.users)
            stored_key(settings.db)          # refuse an empty or short key before anything starts
            built = build(settings)          # every setting checked before a file is written
            built.open()                     # the inputs read and checked (a bad job set writes nothing)
            harvester = built
            password = None
            if users is None:
                users, password = Users.demo(settings.db, fresh=args.fresh)
        except SettingsError as e:
            print(f"error: {render(e, args)}", file=sys.stderr)
            return 2
        except (InputError, ValueError, OSError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        except sqlite3.Error as e:       # damage PRAGMA quick_check did not see, met while loading
            print(f"error: {args.db}: the store cannot be read ({e}): move it aside (with its -wal and -shm "
                  "files) and start a new run, or restore a backup", file=sys.stderr)
            return 2
        from .slowclients import create_server
        from .web import create_app
        app = create_app(harvester, users, web)
        url = f"http://{args.host}:{args.port}"
        snap = harvester.snapshot
        print(f"dashboard on {url}  ({len(snap.nodes):,} nodes, {harvester.speed:g}x, store {args.db})", flush=True)
        if password:
            print(f"demo account: user 'demo' (staff), password '{password}'  "
                  f"(pass --users FILE for real accounts)", flush=True)
        try:
            server = create_server(app.server, web, listen=listen, ident="harvester")
        except OSError as e:         # taken since the check: one line, the run saved as on a stop
            print(f"error: cannot listen on {listen} (--host, --port, --advertise, --bind): {e.strerror or e}",
                  file=sys.stderr)
            return 2
        server.print_listen("Serving on http://{}:{}")
        server.run()
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)   # a second SIGTERM must not cut the close short
        if harvester is not None:
            harvester.close()
            print("stopped; state saved in", args.db, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
