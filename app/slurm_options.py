"""`python -m app --source slurm|pbs ...`: the command-line options of the pilot node sources,
read into `PilotSettings` fields (`core.assemble` builds the source and the pilots' workers).
The `--slurm-*` pilot options apply to PBS as well; where PBS has its own word (queue, its
commands' folder, its pbs.conf, account) a `--pbs-*` option sets it."""
from __future__ import annotations

import argparse

from core.settings import SettingsError, PilotSettings, split_list

#: PilotSettings field -> the option that sets it (errors name the option)
OPTIONS = {"partition": "--slurm-partition / --pbs-queue", "qos": "--slurm-qos", "account": "--slurm-account / --pbs-account",
           "max_pilots": "--slurm-max-pilots", "time_limit_min": "--slurm-time-limit",
           "watch": "--slurm-watch", "poll_s": "--slurm-poll", "submit_batch": "--slurm-batch", "submit_parallel": "--slurm-submit-parallel",
           "dry_run": "--slurm-dry-run", "hub_host": "--slurm-hub", "hub_port": "--slurm-hub",
           "advertise": "--slurm-advertise", "pilot_name": "--slurm-pilot-name",
           "python": "--slurm-python", "log_dir": "--slurm-pilot-logs", "conf": "--slurm-conf / --pbs-conf", "bin_dir": "--slurm-bin / --pbs-bin",
           "worker_grace_s": "--slurm-worker-grace", "pending_timeout_s": "--slurm-pending-timeout",
           "hub_max_connections": "--slurm-hub-max-connections", "slots": "--slurm-slots",
           "release_grace_s": "--slurm-release-grace", "orphan_timeout_s": "--slurm-orphan-timeout",
           "backoff_s": "--slurm-backoff", "backoff_cap_s": "--slurm-backoff-cap",
           "submit_per_minute": "--slurm-submit-rate"}


def add_options(ap: argparse.ArgumentParser) -> None:
    d = PilotSettings()
    g = ap.add_argument_group("Slurm (with --source slurm: idle nodes held by preemptible pilot jobs)",
                              "The pilot options apply to --source pbs too.")
    g.add_argument("--slurm-partition", metavar="NAME", default=d.partition,
                   help=f"partition of the pilots, one Slurm preempts (default {d.partition})")
    g.add_argument("--slurm-qos", metavar="NAME", default="", help="QOS of the pilots (sites that preempt by QOS)")
    g.add_argument("--slurm-account", metavar="NAME", default="", help="account of the pilots")
    g.add_argument("--slurm-max-pilots", metavar="N", type=int, default=d.max_pilots,
                   help=f"nodes held or asked for at once (default {d.max_pilots})")
    g.add_argument("--slurm-time-limit", metavar="MIN", type=int, default=d.time_limit_min,
                   help=f"each pilot's time limit in minutes; another replaces it (default {d.time_limit_min})")
    g.add_argument("--slurm-watch", metavar="LIST", default="",
                   help="partitions, nodes or hostlists to harvest, comma-separated (default: "
                        "every node of --slurm-partition)")
    g.add_argument("--slurm-poll", metavar="S", type=float, default=d.poll_s,
                   help=f"seconds between sinfo/squeue reads (default {d.poll_s:g}; leaves arrive at once)")
    g.add_argument("--slurm-batch", metavar="N", type=int, default=d.submit_batch,
                   help=f"pilots submitted per poll at most (default {d.submit_batch})")
    g.add_argument("--slurm-submit-parallel", metavar="N", type=int, default=d.submit_parallel,
                   help=f"pilot submissions (sbatch, qsub) run at once (default {d.submit_parallel})")
    g.add_argument("--slurm-dry-run", action="store_true",
                   help="submit nothing; the dashboard and log show what would be harvested")
    g.add_argument("--slurm-hub", default=d.hub_host, metavar="HOST[:PORT]",
                   help="where the harvester listens for its pilots (default 127.0.0.1, any port)")
    g.add_argument("--slurm-hub-max-connections", metavar="N", type=int, default=d.hub_max_connections,
                   help="connections the hub keeps at once, pilots and those not yet identified; "
                        "more are refused (default 0: 4 x --slurm-max-pilots + 64, at most --slurm-max-pilots + 4096)")
    g.add_argument("--slurm-advertise", default="", metavar="HOST",
                   help="the address pilots dial back (default: the --slurm-hub host)")
    g.add_argument("--slurm-conf", metavar="PATH", default="", help="slurm.conf for the Slurm commands (default: SLURM_CONF / the site's)")
    g.add_argument("--slurm-bin", metavar="DIR", default="",
                   help="folder holding sinfo, squeue, sbatch, scancel and scontrol (default: PATH)")
    g.add_argument("--slurm-python", metavar="PATH", default=d.python, help="the pilot's Python on the nodes (default: this one)")
    g.add_argument("--slurm-pilot-name", metavar="NAME", default=d.pilot_name, help=f"job name of the pilots (default {d.pilot_name})")
    g.add_argument("--slurm-pilot-logs", default="", metavar="DIR", help="pilot output files (default: none)")
    g.add_argument("--slurm-worker-grace", metavar="S", type=float, default=d.worker_grace_s,
                   help="seconds a preempted worker gets between SIGTERM and SIGKILL (default 0: at once)")
    g.add_argument("--slurm-slots", metavar="N", type=int, default=d.slots,
                   help="ranks (worker processes) per node (default 0: the node's GPUs in Slurm's GRES, 1 without)")
    g.add_argument("--slurm-pending-timeout", metavar="S", type=float, default=d.pending_timeout_s,
                   help=f"cancel a pilot not connected after this many seconds (default {d.pending_timeout_s:g})")
    g.add_argument("--slurm-release-grace", metavar="S", type=float, default=d.release_grace_s,
                   help="pilots are held only for the nodes the jobs can use (the sum of their max nodes); "
                        f"a surplus pilot is cancelled after this many seconds (default {d.release_grace_s:g})")
    g.add_argument("--slurm-orphan-timeout", metavar="S", type=float, default=d.orphan_timeout_s,
                   help="a pilot (and its workers) that lost the harvester keeps its node, trains on and "
                        "redials this long, so a restarted harvester adopts it; 0: give the node back at once "
                        f"(default {d.orphan_timeout_s:g})")
    g.add_argument("--slurm-backoff", metavar="S", type=float, default=d.backoff_s,
                   help="a node whose pilot failed (ended before or soon after it connected) gets no pilot for "
                        f"this many seconds, doubled per failure in a row (default {d.backoff_s:g})")
    g.add_argument("--slurm-backoff-cap", metavar="S", type=float, default=d.backoff_cap_s,
                   help=f"the longest a failing node waits (default {d.backoff_cap_s:g})")
    g.add_argument("--slurm-submit-rate", metavar="N", type=int, default=d.submit_per_minute,
                   help=f"pilots submitted per minute at most, all nodes together (default {d.submit_per_minute})")


def add_pbs_options(ap: argparse.ArgumentParser) -> None:
    d = PilotSettings()
    g = ap.add_argument_group("PBS (with --source pbs: idle vnodes held by preemptible pilot jobs; the "
                              "--slurm-* pilot options above apply too)")
    g.add_argument("--pbs-queue", metavar="NAME", default=d.partition,
                   help=f"queue of the pilots, one the scheduler preempts (default {d.partition})")
    g.add_argument("--pbs-account", metavar="NAME", default="", help="account of the pilots (qsub -A)")
    g.add_argument("--pbs-conf", metavar="PATH", default="",
                   help="pbs.conf for the PBS commands (default: PBS_CONF_FILE / /etc/pbs.conf)")
    g.add_argument("--pbs-bin", metavar="DIR", default="",
                   help="folder holding qsub, qdel, qstat and pbsnodes (default: PATH)")


def settings_from(args) -> dict:
    """The Slurm options as `PilotSettings` fields (checked when the settings are built)."""
    host, port = args.slurm_hub, 0
    if ":" in host and not host.endswith("]"):
        host, _, p = host.rpartition(":")
        if not p.isdigit():
            raise SettingsError("live.slurm.hub_port", f"the port must be a number, not {p!r}")
        port = int(p)
    out = dict(partition=args.slurm_partition, qos=args.slurm_qos, account=args.slurm_account,
                max_pilots=args.slurm_max_pilots, time_limit_min=args.slurm_time_limit,
                watch=split_list(args.slurm_watch), poll_s=args.slurm_poll, submit_batch=args.slurm_batch, submit_parallel=args.slurm_submit_parallel,
                dry_run=args.slurm_dry_run, hub_host=host.strip("[]"), hub_port=port,
                advertise=args.slurm_advertise, pilot_name=args.slurm_pilot_name, python=args.slurm_python,
                log_dir=args.slurm_pilot_logs, conf=args.slurm_conf, bin_dir=args.slurm_bin, worker_grace_s=args.slurm_worker_grace,
                pending_timeout_s=args.slurm_pending_timeout, release_grace_s=args.slurm_release_grace,
                hub_max_connections=args.slurm_hub_max_connections, slots=args.slurm_slots,
                orphan_timeout_s=args.slurm_orphan_timeout, backoff_s=args.slurm_backoff,
                backoff_cap_s=args.slurm_backoff_cap, submit_per_minute=args.slurm_submit_rate)
    if getattr(args, "source", "") == "pbs":
        out.update(partition=args.pbs_queue, account=args.pbs_account, conf=args.pbs_conf, bin_dir=args.pbs_bin)
    return out
