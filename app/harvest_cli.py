"""`harvest`: the harvester's JSON API from a shell, through app/client.py (standard library only).

    harvest login http://head01:8050 alice       # password: a prompt, or $HARVEST_PASSWORD
    JOB=$(harvest submit --name digits --min-nodes 1 --max-nodes 4 --total-samples 640000 \\
              --global-batch 64 -- .venv/bin/python examples/digits_cnn.py --lr 0.1)
    harvest status                               # every job, a table; `harvest status $JOB`: one line
    harvest wait $JOB --timeout 3600             # 0 done; 1 failed (why, and its log's last lines) or cancelled
    harvest watch $JOB                           # its events, state, size and progress until it ends
    harvest logs $JOB --lines 100                # each worker's log, rank 0's first (an ended job's too)
    harvest cancel $JOB
    NEW=$(harvest resubmit $JOB)                 # a failed or cancelled job, continued from its checkpoint

The server's address: --url, else $HARVEST_URL, else the one `login` saved. `login` keeps the
token (never the password) with that address in a file only you may read: $HARVEST_TOKEN_FILE,
else ~/.config/harvest/token ($XDG_CONFIG_HOME/harvest/token); the token goes to that address
only. Exit status: 0 done, 1 the job failed or was cancelled (`wait`, `watch`) or has no
worker logs (`logs`), 2 an error (one line `harvest: error: ...`: the server refused, cannot be
reached, or a wrong argument), 124 `wait` ran past --timeout.
"""
from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional, Sequence

from app.client import FINISHED, ApiError, Client, Event, Job, JobFailed

PROG = "harvest"
EXIT_OK, EXIT_JOB, EXIT_ERROR, EXIT_TIMEOUT = 0, 1, 2, 124
DEFAULT_LINES = 40
#: `wait`: seconds between progress lines when only the progress moved
PROGRESS_EVERY_S = 5.0
#: `watch`: seconds it waits for the end's own event once the job has ended
END_GRACE_S = 4.0

#: `submit`'s flags: (flag, the job's field, type)
FIELDS: tuple[tuple[str, str, type], ...] = (
    ("--name", "name", str), ("--min-nodes", "min_nodes", int), ("--max-nodes", "max_nodes", int),
    ("--total-samples", "total_samples", float), ("--curve", "curve", str),
    ("--scale-up-seconds", "scale_up_seconds", float), ("--scale-down-seconds", "scale_down_seconds", float),
    ("--priority", "priority", float), ("--global-batch", "global_batch", int), ("--launcher", "launcher", str),
    ("--progress-pattern", "progress_pattern", str), ("--stop-grace-seconds", "stop_grace_seconds", float),
    ("--samples-per-step", "samples_per_step", float))
FIELD_HELP = {
    "name": "the job's name (1 to 100 printable characters)",
    "curve": 'throughput per node count, "nodes:samples/s, ...", e.g. "1:1200, 8:9000" (optional on real '
             "workers: the profiler learns it)",
    "global_batch": "samples per step of the command (jobs on the elastic runtime)",
    "launcher": "runtime (the script uses the elastic runtime, the default) or torchrun (an unmodified script)",
    "progress_pattern": "torchrun jobs: the RE2 pattern that finds progress in rank 0's output",
    "stop_grace_seconds": "torchrun jobs: seconds from SIGTERM to SIGKILL at a restart",
    "samples_per_step": "torchrun jobs: the progress pattern counts steps of this many samples (0: samples)",
}


class Refused(Exception):
    """A mistake of the command line the parser cannot see (no server given, a bad --json file)."""


def token_file() -> Path:
    given = os.environ.get("HARVEST_TOKEN_FILE")
    if given:
        return Path(given).expanduser()
    config = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config) / "harvest" / "token"


def load_login(path: Path) -> dict[str, Any]:
    """What `login` saved ({"url", "user", "token"}), or a bare token written by hand; {} if none."""
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return {}
    except OSError as e:
        raise Refused(f"cannot read the token file {path}: {e.strerror or e}") from None
    if not text:
        return {}
    try:
        saved = json.loads(text)
    except ValueError:
        return {"token": text}
    if not isinstance(saved, dict) or not isinstance(saved.get("token"), str):
        raise Refused(f"the token file {path} holds no token: run harvest login again")
    return saved


def save_login(path: Path, saved: dict[str, Any]) -> None:
    """Write the token file readable by its owner only (0600, its folder 0700), in one step."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".token-", dir=path.parent)    # created 0600
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(saved, fh)
            fh.write("\n")
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _same_server(a: str, b: str) -> bool:
    return a.rstrip("/").lower() == b.rstrip("/").lower()


def client(args: argparse.Namespace) -> Client:
    """The server from --url / $HARVEST_URL / the saved login, with the saved token where it is
    that server's (a token is never sent to another address)."""
    saved = load_login(token_file())
    url = args.url or os.environ.get("HARVEST_URL") or saved.get("url")
    if not url:
        raise Refused("no server: give --url URL, set HARVEST_URL, or run harvest login URL USER")
    token = saved.get("token") if not saved.get("url") or _same_server(saved["url"], url) else None
    return Client(url, token)


def _clean(text: Any) -> str:
    """One line with no terminal control characters (job names, log lines and messages are others')."""
    return "".join(c if c.isprintable() or c == "\t" else repr(c)[1:-1] for c in str(text))


def _progress(job: Job) -> str:
    p = job.get("progress")
    return f"{100 * p:.1f}%" if isinstance(p, (int, float)) else "-"


def job_line(job: Job) -> str:
    nodes = job.get("nodes")
    text = f"{job['id']} {job['state']} {_progress(job)}"
    if nodes:
        text += f" on {nodes} node{'' if nodes == 1 else 's'}"
    text += f"  {job.get('name', '')!r}"
    why = job.get("why")
    return _clean(text + (f": {why}" if why else ""))


def failure_lines(job: Job) -> list[str]:
    """A failed job's failure as the server explains it: kind, node, message, hint, log tail."""
    f = job.get("failure") or {}
    out = [f"job {job['id']} failed"]
    if not f:
        return [out[0] + f" (the server gave no reason; `{PROG} logs {job['id']}` shows its workers' logs)"]
    for key in ("kind", "node", "message", "hint"):
        if f.get(key):
            out.append(f"  {key + ':':<8} {_clean(f[key])}")
    tail = f.get("tail") or []
    if tail:
        out.append("  log tail:")
        out += [f"    {_clean(line)}" for line in tail]
    return out


def table(jobs: Sequence[Job]) -> list[str]:
    head = ("ID", "STATE", "NODES", "PROGRESS", "OWNER", "NAME")
    rows = [head] + [(j["id"], j["state"], str(j.get("nodes") if j.get("nodes") is not None else "-"), _progress(j),
                      j.get("owner") or "-", j.get("name", "")) for j in jobs]
    rows = [tuple(_clean(c) for c in r) for r in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head) - 1)]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1] for r in rows]


# ---- the commands: each returns the exit status ------------------------------------------------

def cmd_login(args: argparse.Namespace) -> int:
    if len(args.who) > 2:
        raise Refused("login takes [URL] USER")
    url, user = (args.who if len(args.who) == 2 else (None, args.who[0]))
    url = url or args.url or os.environ.get("HARVEST_URL") or load_login(token_file()).get("url")
    if not url:
        raise Refused("no server: harvest login URL USER (or give --url, or set HARVEST_URL)")
    password = os.environ.get("HARVEST_PASSWORD")
    if password is None:
        try:
            password = getpass.getpass(f"password for {user} at {url}: ")
        except EOFError:
            raise Refused("no password given (type it at the prompt, or set HARVEST_PASSWORD)") from None
    api = Client.login(url, user, password)
    path = token_file()
    try:
        save_login(path, {"url": api.url, "user": user, "token": api.token})
    except OSError as e:
        raise Refused(f"cannot write the token file {path}: {e.strerror or e}") from None
    print(f"logged in to {api.url} as {user} (token in {path})")
    return EXIT_OK


def job_fields(args: argparse.Namespace) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    if args.json:
        try:
            text = sys.stdin.read() if args.json == "-" else Path(args.json).read_text()
            fields = json.loads(text)
        except OSError as e:
            raise Refused(f"--json {args.json}: {e.strerror or e}") from None
        except ValueError as e:
            raise Refused(f"--json {args.json}: not JSON ({e})") from None
        if not isinstance(fields, dict):
            raise Refused(f"--json {args.json}: give a JSON object of the job's fields")
    for _flag, field, _type in FIELDS:
        value = getattr(args, field)
        if value is not None:
            fields[field] = value
    command = list(args.command or []) + list(args.rest or [])
    if args.command and args.rest:
        raise Refused("give the command once: after -- or after --command")
    if args.command is not None or args.rest is not None:
        if not command:
            raise Refused("no command after -- (or --command)")
        fields["command"] = command
    return fields


def cmd_submit(args: argparse.Namespace) -> int:
    job = client(args).submit(**job_fields(args))
    print(job["id"])
    return EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    api = client(args)
    if args.job:
        job = api.job(args.job)
        print(job_line(job))
        if job["state"] == "failed":
            print("\n".join(failure_lines(job)))
        return EXIT_OK
    print("\n".join(table(api.jobs(state=args.state, owner=args.owner))))
    return EXIT_OK


class ProgressLines:
    """`wait`'s lines on stderr while it waits: one when the job's state or size changes, else
    one when its progress has moved and `every` seconds have passed since the last."""

    def __init__(self, every: float = PROGRESS_EVERY_S) -> None:
        self.every, self.shown, self.at = every, None, float("-inf")

    def __call__(self, job: Job) -> None:
        now = time.monotonic()
        state = (job["state"], job.get("nodes"))
        moved = _progress(job) != (self.shown[1] if self.shown else None)
        if self.shown is None or state != self.shown[0] or (moved and now - self.at >= self.every):
            print(f"{PROG}: {progress_line(job)}", file=sys.stderr, flush=True)
            self.shown, self.at = (state, _progress(job)), now


def progress_line(job: Job) -> str:
    """`u-1a2b running 13.5% on 2 nodes, 190 samples/s, ETA 12:40:03`: how far a job is, short."""
    text = f"{job['id']} {job['state']} {_progress(job)}"
    nodes = job.get("nodes")
    if nodes:
        text += f" on {nodes} node{'' if nodes == 1 else 's'}"
    rate = job.get("samples_per_second")
    if job["state"] == "running" and isinstance(rate, (int, float)) and rate > 0:
        text += f", {rate:,.0f} samples/s"
    eta = job.get("eta")
    if job["state"] == "running" and isinstance(eta, (int, float)) and eta > 0:
        text += f", ETA {time.strftime('%H:%M:%S', time.localtime(eta))}"
    return _clean(text)


def cmd_wait(args: argparse.Namespace) -> int:
    try:
        job = client(args).wait(args.job, timeout=args.timeout, poll_s=args.poll, check=True,
                                progress=None if args.quiet else ProgressLines())
    except JobFailed as e:
        print(job_line(e.job))
        print("\n".join(failure_lines(e.job)))
        return EXIT_JOB
    except TimeoutError as e:
        print(f"{PROG}: {_clean(e)}", file=sys.stderr)
        return EXIT_TIMEOUT
    print(job_line(job))
    return EXIT_OK if job["state"] == "done" else EXIT_JOB


def cmd_cancel(args: argparse.Namespace) -> int:
    job = client(args).cancel(args.job)
    print(f"{job['id']} {job['state']}")
    return EXIT_OK


def cmd_resubmit(args: argparse.Namespace) -> int:
    """The new job's id on stdout (as `submit`), where it continues from on stderr."""
    job = client(args).resubmit(args.job)
    print(job["id"])
    print(f"{PROG}: job {_clean(job['id'])} continues job {_clean(args.job)} from its checkpoint, "
          f"{_progress(job)} done", file=sys.stderr)
    return EXIT_OK


def cmd_logs(args: argparse.Namespace) -> int:
    logs = client(args).logs(args.job, lines=args.lines)
    workers = logs.get("workers") or {}
    if not workers:
        state = logs.get("state", "?")
        why = ("none has started yet" if state in ("queued", "running") else
               "its workers left no log files (simulated workers write none)")
        print(f"{PROG}: job {_clean(args.job)} ({_clean(state)}) has no worker logs: {why}", file=sys.stderr)
        return EXIT_JOB
    for i, (worker, lines) in enumerate(workers.items()):
        print(("\n" if i else "") + f"==> {_clean(worker)} <==")
        for line in lines:
            print(_clean(line))
    return EXIT_OK


def _clock(t: Any) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t)) if isinstance(t, (int, float)) else "--:--:--"


def event_line(ev: Event) -> str:
    """`12:03:05 probe local-1: probe at 3 nodes: ...`: one of the job's events."""
    where = f" {ev['node']}" if ev.get("node") else ""
    detail = f": {ev['detail']}" if ev.get("detail") else ""
    return _clean(f"{_clock(ev.get('time'))} {ev.get('kind', '?')}{where}{detail}")


#: the kinds of event a job's end writes (`watch` waits a little for it once the job has ended)
END_EVENTS = ("job_done", "job_failed", "job_cancel")


def cmd_watch(args: argparse.Namespace) -> int:
    """The job's state, size, progress and events as they change, until it ends."""
    api = client(args)
    last, shown, said, ended_at = 0, None, None, None
    while True:
        job = api.job(args.job)
        events = api.events(args.job, after=last)
        for ev in events:
            print(event_line(ev), flush=True)
            last = max(last, int(ev.get("seq") or 0))
        state = (job["state"], job.get("nodes"))
        if state != shown:
            why = job.get("why")
            print(f"{_clock(time.time())} {progress_line(job)}" + (_clean(f": {why}") if why else ""), flush=True)
            shown, said = state, _progress(job)
        elif _progress(job) != said:
            print(f"{_clock(time.time())} {progress_line(job)}", flush=True)
            said = _progress(job)
        if job["state"] in FINISHED:
            ended_at = ended_at or time.monotonic()
            # the store keeps events within a second or so: show the end's own before going
            if any(ev.get("kind") in END_EVENTS for ev in events) or time.monotonic() - ended_at > END_GRACE_S:
                break
            time.sleep(min(args.poll, 0.5))
            continue
        time.sleep(args.poll)
    if job["state"] == "failed":
        print("\n".join(failure_lines(job)))
    return EXIT_OK if job["state"] == "done" else EXIT_JOB


# ---- the command line --------------------------------------------------------------------------

URL_HELP = "the harvester, e.g. http://head01:8050 (default: $HARVEST_URL, else the saved login's)"


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)       # --url also after the command
    common.add_argument("--url", default=argparse.SUPPRESS, help=URL_HELP)
    ap = argparse.ArgumentParser(prog=PROG, description="The idle-node harvester's JSON API from a shell: log in, "
                                                        "submit jobs, follow them, read their workers' logs.",
                                 epilog="Exit status: 0 ok, 1 the job failed or was cancelled (wait, watch) or has "
                                        "no worker logs (logs), 2 an error, 124 wait timed out.")
    ap.add_argument("--url", default=None, help=URL_HELP)
    sub = ap.add_subparsers(dest="cmd", metavar="COMMAND")

    p = sub.add_parser("login", parents=[common], help="get a token (password from a prompt or $HARVEST_PASSWORD)",
                       description="Log in and keep the token (not the password) in $HARVEST_TOKEN_FILE or "
                                   "~/.config/harvest/token, readable by you only.")
    p.add_argument("who", nargs="+", metavar="[URL] USER")
    p.set_defaults(run=cmd_login)

    p = sub.add_parser("submit", parents=[common], help="register a job; prints its id",
                       usage=f"{PROG} submit --name NAME --min-nodes N --max-nodes N --total-samples S [options] "
                             "[--json FILE] [-- COMMAND ...]",
                       description="Register a job: its fields as flags, or from --json FILE (a JSON object; "
                                   "flags win), and the command each node runs after -- (never through a shell). "
                                   "Prints the job's id.")
    for flag, field, kind in FIELDS:
        p.add_argument(flag, dest=field, type=kind, metavar=field.split("_")[-1].upper(),
                       help=FIELD_HELP.get(field))
    p.add_argument("--json", metavar="FILE", help="the job's fields as a JSON object (- for stdin)")
    p.add_argument("--command", nargs=argparse.REMAINDER, metavar="ARG",
                   help="the rest of the line is the command (as after --)")
    p.set_defaults(run=cmd_submit)

    p = sub.add_parser("status", parents=[common], help="one job's state, progress and why; or every job",
                       description="With JOB: its state, progress, nodes and why it holds what it holds "
                                   "(and why it failed). Without: a table of jobs.")
    p.add_argument("job", nargs="?", metavar="JOB")
    p.add_argument("--state", choices=("queued", "running", *FINISHED), help="the table: only jobs in this state")
    p.add_argument("--owner", help="the table: only this user's jobs")
    p.set_defaults(run=cmd_status)

    p = sub.add_parser("wait", parents=[common], help="until the job ends: exit 0 done, 1 failed or cancelled",
                       description="Wait for a job to end: exit 0 when it is done; 1 when it failed (printing "
                                   "why: kind, node, message, hint and its log's last lines) or was cancelled; "
                                   "124 after --timeout.")
    p.add_argument("job", metavar="JOB")
    p.add_argument("--timeout", type=float, metavar="S", help="give up after S seconds (default: never)")
    p.add_argument("--poll", type=float, default=2.0, metavar="S", help="seconds between looks (default 2)")
    p.add_argument("--quiet", "-q", action="store_true",
                   help=f"no progress lines on stderr (default: one when the state or size changes, and "
                        f"one at most every {PROGRESS_EVERY_S:g} s while the progress moves)")
    p.set_defaults(run=cmd_wait)

    p = sub.add_parser("watch", parents=[common], help="follow a job: state, size, progress and events until it ends",
                       description="Follow a job: a line for each of its events and each change of its state, "
                                   "size or progress, until it ends; then as wait: exit 0 when it is done, 1 when "
                                   "it failed (printing why) or was cancelled. Ctrl-C stops watching (exit 130); "
                                   "the job goes on.")
    p.add_argument("job", metavar="JOB")
    p.add_argument("--poll", type=float, default=2.0, metavar="S", help="seconds between looks (default 2)")
    p.set_defaults(run=cmd_watch)

    p = sub.add_parser("cancel", parents=[common], help="cancel a job (yours, or any as staff)")
    p.add_argument("job", metavar="JOB")
    p.set_defaults(run=cmd_cancel)

    p = sub.add_parser("resubmit", parents=[common],
                       help="continue a failed or cancelled job from its checkpoint; prints the new job's id",
                       description="Register a failed or cancelled job again as a new job that starts from its "
                                   "last checkpoint and sample count (its owner, or staff). Prints the new id.")
    p.add_argument("job", metavar="JOB")
    p.set_defaults(run=cmd_resubmit)

    p = sub.add_parser("logs", parents=[common], help="the last lines of each worker's log",
                       description="The last lines of each of the job's worker logs, rank 0's worker first "
                                   "(the job's owner or staff); of a job that has ended, its log files' last "
                                   "lines. Exit 1 when the job has none (not started yet, or simulated "
                                   "workers).")
    p.add_argument("job", metavar="JOB")
    p.add_argument("--lines", "-n", type=int, default=DEFAULT_LINES, metavar="N",
                   help=f"lines per worker, 1 to 500 (default {DEFAULT_LINES})")
    p.set_defaults(run=cmd_logs)
    return ap


def split_command(argv: list[str]) -> tuple[list[str], Optional[list[str]]]:
    """`harvest submit ... -- ARGV`: the job's command is everything after the first `--`, taken
    as it is (an option of the command is not harvest's)."""
    if "--" in argv:
        i = argv.index("--")
        if "submit" in argv[:i]:
            return argv[:i], argv[i + 1:]
    return argv, None


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    argv, rest = split_command(argv)
    ap = build_parser()
    args = ap.parse_args(argv)
    args.rest = rest
    if not getattr(args, "run", None):
        ap.print_help(sys.stderr)
        return EXIT_ERROR
    try:
        return args.run(args)
    except ApiError as e:
        message = " ".join(str(e).split())
        if e.status == 401 and args.cmd != "login":
            message += f" (run: {PROG} login [URL] USER)"
        return _error(message)
    except Refused as e:
        return _error(str(e))
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    except BrokenPipeError:            # `harvest logs JOB | head`: no complaint at exit either
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except Exception as e:             # a bug here: one line still, the traceback on request
        if os.environ.get("HARVEST_DEBUG"):
            raise
        return _error(f"{type(e).__name__}: {e} (HARVEST_DEBUG=1 shows where)")


def _error(message: str) -> int:
    print(f"{PROG}: error: {_clean(message)}", file=sys.stderr)
    return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
