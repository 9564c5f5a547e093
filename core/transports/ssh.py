"""Workers on real nodes through the OpenSSH client (`ssh`), so that the site's ssh config
(Host aliases, ProxyJump, keys, ControlMaster) applies as it does for a person.

One ssh call per operation and node. The remote login shell only ever sees the fixed command
`sh -s`; the script itself goes through stdin and is parsed by /bin/sh on the node, and every
user-supplied piece in it (argv items, environment values, paths) is one `shlex.quote`d word.
So nothing the user passes is interpreted by any shell, whatever the login shell is (csh, fish),
and newlines or non-ASCII survive.

Connections are multiplexed (ControlMaster=auto, ControlPersist, a private ControlPath per
transport instance): ~0.15 s per call instead of ~0.35 s. The first call to a target is made
alone, so that concurrent first calls share one master instead of racing to create it, and at
most `max_sessions` calls per target run at once (sshd's MaxSessions, default 10, caps the
sessions of one multiplexed connection; beyond it a call fails like a lost node).

Requirements on a node: POSIX sh, setsid (util-linux), kill, mkdir, tail; Linux /proc for the
PID-reuse check and for ignoring zombies (without /proc it falls back to `kill -0`).

Every process a worker starts ends with it (core/transports/cleanup.py, done here in sh on the
node): the worker joins its cgroup `<mount>/harvest/<mark>` before it execs where the login
account may make one (cgroup v2, else the v1 freezer), and a stop kills and removes that; else
its processes are found by HARVEST_WORKER=<mark> in /proc/*/environ (GNU grep's -z). The first
start on a node also ends what a crashed earlier harvester run of this host left there.
"""
from __future__ import annotations

import logging
import os
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

from ..logtail import MAX_READ_BYTES, last_lines
from .base import (STOP_GONE, STOP_KILL, STOP_TERM, Handle, NodeSpec, StartError, Transport,
                   TransportError, check_start_args)
from .cleanup import CGROUP1, CGROUP2, ENV_MARK, check_mark, host_prefix, instance, instance_dead, new_mark

log = logging.getLogger(__name__)

#: ssh's own exit status for "could not connect / connection lost"
SSH_FAILED = 255
#: a liveness check's answer normally takes milliseconds over the master connection; one that
#: has none within this counts as unanswered (the dispatcher wants two in a row before a node is lost)
ALIVE_TIMEOUT_S = 3.0
#: start() exit statuses chosen by the remote script
_NO_WORKDIR, _NO_COMMAND, _NO_LOG, _NO_PID = 126, 127, 125, 124
_MARK = "HVS"

# Shell functions shared by every remote script (POSIX sh; dash is the strictest tested).
#   _st PID        start time of a live, non-zombie PID (field 22 of /proc/PID/stat), else ''
#   _alive PID TOK whether PID is still the process started with token TOK ('-': none known)
#   _ours PID TOK  whether the group of PID may be signalled (PID not reused by someone else)
#   _groups        ' g1 g2 ... ' the process groups that have a non-zombie member
#   _galive G GS   whether group G is in GS (or, without /proc, whether kill -0 -G works)
#   _now           centiseconds since boot (0 without /proc: loops then count their sleeps)
_LIB = r"""
_P=; [ -r /proc/self/stat ] && _P=1
_st() { _l=; { read -r _l < "/proc/$1/stat"; } 2>/dev/null || return 0; _r=${_l##*') '}; set -- $_r; [ "$1" = Z ] || echo "${20}"; }
_alive() { if [ -n "$_P" ]; then [ "$2" != - ] && [ "$(_st "$1")" = "$2" ]; else kill -s 0 "$1" 2>/dev/null; fi; }
_ours() { [ -z "$_P" ] && return 0; _t=$(_st "$1"); [ -z "$_t" ] || [ "$_t" = "$2" ]; }
_groups() { [ -z "$_P" ] && return 0; for _f in /proc/[0-9]*/stat; do { read -r _l < "$_f"; } 2>/dev/null || continue; _r=${_l##*') '}; set -- $_r; [ "$1" = Z ] || printf ' %s' "$3"; done; echo ' '; }
_galive() { if [ -n "$_P" ]; then case "$2" in *" $1 "*) return 0;; esac; return 1; else kill -s 0 -- "-$1" 2>/dev/null; fi; }
_now() { if [ -r /proc/uptime ]; then read -r _u _x < /proc/uptime; echo "${_u%.*}${_u#*.}"; else echo 0; fi; }
_wait_gone() { # CS "PIDS" ["MARKS"]: wait up to CS centiseconds until these groups are empty and
  # (once they are) these workers have no process left; prints the groups left
  _cs=$1; _pend=$2; _mpend=${3:-}; _t0=$(_now); _el=0
  while [ -n "$_pend$_mpend" ]; do
    _gr=$(_groups); _left=
    for _p in $_pend; do _galive "$_p" "$_gr" && _left="$_left $_p"; done
    _pend=$_left
    if [ -z "$_pend" ]; then
      _left=; for _m in $_mpend; do [ -n "$(_members "$_m")" ] && _left="$_left $_m"; done; _mpend=$_left
    fi
    [ -z "$_pend$_mpend" ] && break
    [ "$_t0" = 0 ] || _el=$(( $(_now) - _t0 ))
    [ "$_el" -ge "$_cs" ] && break
    sleep 0.05; [ "$_t0" = 0 ] && _el=$((_el + 5))
  done
  echo $_pend
}
# A worker's processes (MARK: its mark, '-' for none; core/transports/cleanup.py):
#   _cgof MARK       'DIR' of its cgroup (v2 hierarchy first, then the v1 freezer), '' if none
#   _members MARK    its live processes: its cgroup's members, without one those it marked
#   _strays MARK PG  those of them outside process group PG (setsid children)
#   _mkill MARK      SIGKILL all of them; _mrm MARK: remove its cgroup
_cg2=; _cg1=
if [ -r /proc/mounts ]; then
  while read -r _d _m _t _o _r; do
    case "$_t" in
      cgroup2) [ -n "$_cg2" ] || _cg2=$_m;;
      cgroup) case ",$_o," in *,freezer,*) [ -n "$_cg1" ] || _cg1=$_m;; esac;;
    esac
  done < /proc/mounts
fi
_cgof() {
  [ "$1" = - ] && return 0
  for _r in "$_cg2" "$_cg1"; do [ -n "$_r" ] && [ -d "$_r/harvest/$1" ] && { echo "$_r/harvest/$1"; return 0; }; done
  return 0
}
_members() {
  [ "$1" = - ] && return 0; _c=$(_cgof "$1")
  if [ -n "$_c" ]; then _ps=$(cat "$_c/cgroup.procs" 2>/dev/null)
  else _ps=$(grep -lzxF "HARVEST_WORKER=$1" /proc/[0-9]*/environ 2>/dev/null | sed 's,^/proc/,,; s,/environ$,,'); fi
  for _x in $_ps; do [ "$_x" = "$$" ] || [ -z "$(_st "$_x")" ] || echo "$_x"; done
}
_pg() { _l=; { read -r _l < "/proc/$1/stat"; } 2>/dev/null || return 0; _r=${_l##*') '}; set -- $_r; echo "$3"; }
_strays() { for _x in $(_members "$1"); do [ "$(_pg "$_x")" = "$2" ] || echo "$_x"; done; }
_mkill() {
  [ "$1" = - ] && return 0; _c=$(_cgof "$1")
  case "$_c" in
    "") _i=0
        while [ $_i -lt 20 ]; do
          _ps=$(_members "$1"); [ -z "$_ps" ] && break; kill -s KILL $_ps 2>/dev/null; _i=$((_i + 1))
        done;;
    "$_cg2"/*) if [ -e "$_c/cgroup.kill" ]; then echo 1 2>/dev/null > "$_c/cgroup.kill"; else
        echo 1 2>/dev/null > "$_c/cgroup.freeze"
        for _x in $(cat "$_c/cgroup.procs"); do kill -s KILL "$_x" 2>/dev/null; done
        echo 0 2>/dev/null > "$_c/cgroup.freeze"; fi;;
    *) echo FROZEN 2>/dev/null > "$_c/freezer.state"; _i=0
       while [ "$(cat "$_c/freezer.state")" != FROZEN ] && [ $_i -lt 20 ]; do sleep 0.05; _i=$((_i + 1)); done
       for _x in $(cat "$_c/cgroup.procs"); do kill -s KILL "$_x" 2>/dev/null; done
       echo THAWED 2>/dev/null > "$_c/freezer.state";;
  esac
}
_mrm() { _c=$(_cgof "$1"); [ -z "$_c" ] || rmdir "$_c" 2>/dev/null; return 0; }
"""

_STOP = r"""
_cs=$1; shift; _sent=; _marks=; _gr=$(_groups)
while [ $# -ge 3 ]; do
  if _ours "$1" "$2" && _galive "$1" "$_gr"; then
    kill -s TERM -- "-$1" 2>/dev/null; kill -s CONT -- "-$1" 2>/dev/null; _sent="$_sent $1"
  else echo "HVS $1 gone"; fi
  if [ "$3" != - ]; then
    _marks="$_marks $3"; _s=$(_strays "$3" "$1")
    [ -z "$_s" ] || { kill -s TERM $_s 2>/dev/null; kill -s CONT $_s 2>/dev/null; }
  fi
  shift 3
done
_rest=$(_wait_gone "$_cs" "$_sent" "$_marks")
for _p in $_sent; do case " $_rest " in *" $_p "*) ;; *) echo "HVS $_p term";; esac; done
for _p in $_rest; do kill -s KILL -- "-$_p" 2>/dev/null; done
_left=; for _m in $_marks; do [ -z "$(_members "$_m")" ] || { _mkill "$_m"; _left="$_left $_m"; }; done
[ -z "$_rest$_left" ] || _wait_gone 500 "$_rest" "$_left" >/dev/null
for _p in $_rest; do echo "HVS $_p kill"; done
for _m in $_marks; do _mrm "$_m"; done
exit 0
"""

_KILL = r"""
if _ours "$1" "$2"; then kill -s KILL -- "-$1" 2>/dev/null; _g=$1; else _g=; fi
_mkill "$3"; _wait_gone 500 "$_g" "$3" >/dev/null; _mrm "$3"
"""

# How many processes each worker ($1 $2 ...: its PID, its mark or '-') has: "HVP <pid> <process>"
# for each process of its session or process group, or of its cgroup or mark (census.py's sum).
_CENSUS = r"""
_lead=" "; _marks=
while [ $# -ge 2 ]; do _lead="$_lead$1 "; [ "$2" = - ] || _marks="$_marks $1=$2"; shift 2; done
for _f in /proc/[0-9]*/stat; do
  { read -r _l < "$_f"; } 2>/dev/null || continue; _r=${_l##*') '}; set -- $_r
  [ "$1" = Z ] && continue
  _p=${_f#/proc/}; _p=${_p%/stat}
  case "$_lead" in *" $3 "*) echo "HVP $3 $_p";; esac
  [ "$4" = "$3" ] || case "$_lead" in *" $4 "*) echo "HVP $4 $_p";; esac
done
for _e in $_marks; do for _x in $(_members "${_e#*=}"); do echo "HVP ${_e%%=*} $_x"; done; done
echo "HVP done"
exit 0
"""

# Lists what harvester runs of this host ($_hp: `<host>.<pid namespace>`) left on the node: their
# cgroup folders and the marks in processes' environments ("HVS-INST <instance>").
_LIST = r"""
for _r in "$_cg2" "$_cg1"; do [ -n "$_r" ] && [ -d "$_r/harvest" ] || continue
  for _d in "$_r/harvest/$_hp".*; do [ -d "$_d" ] && echo "HVS-INST ${_d##*/}"; done
done
grep -ahozE "HARVEST_WORKER=$(echo "$_hp" | sed 's/[.]/[.]/g')[.][0-9]+[.][0-9]+/" /proc/[0-9]*/environ 2>/dev/null \
  | tr '\0' '\n' | sed 's,^HARVEST_WORKER=,,; s,/$,,; s,^,HVS-INST ,' | sort -u
"""

# Kills and removes what the given (ended) harvester instances left on the node.
_SWEEP = r"""
_marks=
for _inst in "$@"; do
  for _r in "$_cg2" "$_cg1"; do [ -n "$_r" ] && [ -d "$_r/harvest/$_inst" ] || continue
    for _d in "$_r/harvest/$_inst"/*/; do
      [ -d "$_d" ] || continue; _m="$_inst/$(basename "$_d")"; _marks="$_marks $_m"; _mkill "$_m"
    done
  done
  _ps=$(grep -lzF "HARVEST_WORKER=$_inst/" /proc/[0-9]*/environ 2>/dev/null | sed 's,^/proc/,,; s,/environ$,,')
  for _x in $_ps; do [ "$_x" = "$$" ] || kill -s KILL "$_x" 2>/dev/null; done
done
_wait_gone 500 "" "$_marks" >/dev/null
for _m in $_marks; do _mrm "$_m"; done
for _inst in "$@"; do for _r in "$_cg2" "$_cg1"; do [ -z "$_r" ] || rmdir "$_r/harvest/$_inst" 2>/dev/null; done; done
for _r in "$_cg2" "$_cg1"; do [ -z "$_r" ] || rmdir "$_r/harvest" 2>/dev/null; done
exit 0
"""

# Removes this harvester's empty folders on the node ($1: its instance).
_CLOSE = r"""
for _r in "$_cg2" "$_cg1"; do [ -n "$_r" ] && [ -d "$_r/harvest/$1" ] || continue
  for _d in "$_r/harvest/$1"/*/; do [ -d "$_d" ] && rmdir "$_d" 2>/dev/null; done
  rmdir "$_r/harvest/$1" "$_r/harvest" 2>/dev/null
done
exit 0
"""


@dataclass
class _Target:
    sem: threading.BoundedSemaphore
    first: threading.Lock = field(default_factory=threading.Lock)
    warm: bool = False
    swept: bool = False     # what crashed earlier runs left there was looked for
    cleanup: str = ""       # how its last worker's processes are found (cleanup.CGROUP2, ...)


def _check_target(node: NodeSpec) -> None:
    t = node.target
    if not t or t.startswith("-") or any(c.isspace() or ord(c) < 32 for c in t):
        raise ValueError(f"{node.name}: bad ssh target {t!r}")


class SshTransport(Transport):
    name = "ssh"
    census_every_s = 5.0

    def __init__(self, config: Optional[str] = None, options: Sequence[str] = (),
                 connect_timeout: float = 5.0, ssh: str = "ssh", control_persist: int = 60,
                 max_sessions: int = 8, alive_timeout_s: float = ALIVE_TIMEOUT_S) -> None:
        """`config`: an ssh config file (`-F`; default: the user's and the system's).
        `alive_timeout_s`: the most a liveness check may take, connection included (a node
        whose link died answers never, and its check must not hold up the others').
        `options`: extra ssh arguments (e.g. ["-o", "User=alice"]), added before ours, which
        ssh then lets them override (the first value of an option wins)."""
        self.ssh, self.config, self.extra = ssh, config, list(options)
        self.connect_timeout = connect_timeout
        self.alive_timeout_s = alive_timeout_s
        # a short private directory: a unix socket path must stay under ~104 bytes
        self._dir = tempfile.mkdtemp(prefix="hvssh-", dir="/tmp" if os.path.isdir("/tmp") else None)
        os.chmod(self._dir, 0o700)
        self._base = [self.ssh, *(["-F", config] if config else []), *self.extra,
                      "-T", "-o", "BatchMode=yes", "-o", "ControlMaster=auto",
                      "-o", f"ControlPath={self._dir}/%C", "-o", f"ControlPersist={control_persist}",
                      "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3",
                      "-o", f"ConnectTimeout={max(1, round(connect_timeout))}"]
        self._max_sessions = max_sessions
        self._targets: dict[str, _Target] = {}
        self._lock = threading.Lock()
        self._closed = False

    def host_of(self, node: NodeSpec) -> Optional[str]:
        """The host ssh connects to for `node`, after aliases and the config (`ssh -G`: nothing
        is sent)."""
        _check_target(node)
        try:
            r = subprocess.run([*self._base, "-G", "--", node.target], capture_output=True, text=True,
                               timeout=10)
        except subprocess.TimeoutExpired:
            return None
        for line in r.stdout.splitlines():
            key, _, value = line.partition(" ")
            if key == "hostname":
                return value.strip()
        return None

    # ---- one ssh call ----------------------------------------------------------------------
    def _target(self, target: str) -> _Target:
        with self._lock:
            if self._closed:
                raise RuntimeError("transport is closed")
            t = self._targets.get(target)
            if t is None:
                t = self._targets[target] = _Target(threading.BoundedSemaphore(self._max_sessions))
            return t

    def run_script(self, node: NodeSpec, script: str, args: Sequence[str] = (),
                   timeout: float = 30.0, limit: Optional[float] = None) -> subprocess.CompletedProcess:
        """Run a POSIX sh `script` (with `_LIB` loaded and $1.. = `args`) on the node.
        Raises TransportError on ssh's exit status 255 or when no answer comes in time."""
        _check_target(node)
        body = _LIB + "set -- " + " ".join(shlex.quote(a) for a in args) + "\n" + script
        cmd = [*self._base, "--", node.target, "sh -s"]
        t = self._target(node.target)
        limit = timeout + self.connect_timeout if limit is None else limit
        with t.sem:
            if not t.warm:
                with t.first:  # the first call alone creates the master
                    r = self._call(node, cmd, body, limit)
                    t.warm = t.warm or r.returncode != SSH_FAILED
                    return r
            return self._call(node, cmd, body, limit)

    def _call(self, node: NodeSpec, cmd: list[str], body: str, limit: float) -> subprocess.CompletedProcess:
        try:
            r = subprocess.run(cmd, input=body.encode(), capture_output=True, timeout=limit)
        except subprocess.TimeoutExpired:
            raise TransportError(node.name, f"ssh {node.target}: no answer within {limit:.0f} s") from None
        except OSError as e:  # no ssh binary
            raise TransportError(node.name, f"cannot run {self.ssh}: {e}") from e
        if r.returncode == SSH_FAILED:
            msg = r.stderr.decode("utf-8", "replace").strip().splitlines()
            raise TransportError(node.name, f"ssh {node.target}: " + (msg[-1] if msg else "exit 255"))
        return r

    @staticmethod
    def _marked(r: subprocess.CompletedProcess, tag: str = _MARK) -> list[list[str]]:
        """The lines the script printed for us (anything the login rc files print is skipped)."""
        out = []
        for line in r.stdout.decode("utf-8", "replace").splitlines():
            parts = line.split()
            if parts and parts[0] == tag:
                out.append(parts[1:])
        return out

    # ---- the Transport interface -----------------------------------------------------------
    def start(self, node: NodeSpec, argv: Sequence[str], env: Mapping[str, str], workdir: str,
              log_path: str) -> Handle:
        argv, env = list(argv), dict(env)
        check_start_args(node, argv, env, workdir, log_path)
        mark = env[ENV_MARK] = check_mark(env[ENV_MARK]) if env.get(ENV_MARK) else new_mark()
        q = shlex.quote
        exports = ("export " + " ".join(f"{k}={q(v)}" for k, v in env.items()) + "; ") if env else ""
        # the worker: its own session, in its cgroup ($1, where there is one) before anything
        # else; says its PID on fd 3 (the pipe below), then becomes argv
        inner = ('[ -z "$1" ] || { echo $$ > "$1/cgroup.procs"; } 2>/dev/null; shift; echo $$ >&3; exec 3>&-; '
                 + exports + 'exec "$@"')
        log = q(log_path)
        logdir = q(os.path.dirname(log_path) or ".")
        target = self._target(node.target)
        listing = not target.swept
        script = "\n".join([
            (f"cd -- {q(workdir)} || exit {_NO_WORKDIR}" if workdir else ":"),
            f"( umask 077; mkdir -p -- {logdir} ) 2>/dev/null; ( umask 077; : > {log} ) || exit {_NO_LOG}",
            f'( {exports}command -v "$1" >/dev/null 2>&1 ) || '
            f'{{ echo "command not found: $1" >&2; exit {_NO_COMMAND}; }}',
            (f"_hp={q(host_prefix())}\n{_LIST}" if listing else ":"),
            f"_mk={q(mark)}; _cg=",
            'for _r in "$_cg2" "$_cg1"; do [ -n "$_r" ] || continue; _d="$_r/harvest/$_mk"',
            '  if { mkdir -p "$_d" || mkdir -p "$_d"; } 2>/dev/null && [ -w "$_d/cgroup.procs" ] && '
            '{ [ "$_r" = "$_cg2" ] || [ -e "$_d/freezer.state" ]; }; then _cg=$_d; break; fi',
            '  rmdir "$_d" 2>/dev/null',
            'done',
            f"_pid=$( {{ setsid sh -c {q(inner)} harvest-worker \"$_cg\" \"$@\" 3>&1 >>{log} 2>&1 </dev/null & }} )",
            f'[ -n "$_pid" ] || {{ [ -z "$_cg" ] || rmdir "$_cg" 2>/dev/null; exit {_NO_PID}; }}',
            "_how=environ",
            'if [ -n "$_cg" ]; then',     # joined, or gone too soon to tell: its cgroup is kept
            '  if grep -qx "$_pid" "$_cg/cgroup.procs" 2>/dev/null || [ -z "$(_st "$_pid")" ]; then',
            '    case "$_cg" in "$_cg2"/*) _how=cgroup2;; *) _how=cgroup1;; esac',
            '  else rmdir "$_cg" 2>/dev/null; fi',
            "fi",
            'echo "HVS-CG $_how"',
            'echo "HVS $_pid $(_st "$_pid")"',
        ])
        r = self.run_script(node, script, argv, timeout=30.0)
        self._learn(node, target, r, listing)
        lines = self._marked(r)
        if r.returncode != 0 or not lines:
            err = r.stderr.decode("utf-8", "replace").strip()
            what = {_NO_WORKDIR: f"no working directory {workdir!r}",
                    _NO_COMMAND: f"command not found: {argv[0]!r}",
                    _NO_LOG: f"cannot write the log {log_path!r}",
                    _NO_PID: "the worker did not start"}.get(r.returncode, f"exit {r.returncode}")
            raise StartError(node.name, what + (f" ({err.splitlines()[-1]})" if err else ""))
        fields = lines[-1]
        return Handle(node, int(fields[0]), fields[1] if len(fields) > 1 else "", log_path, time.time(), mark)

    def _learn(self, node: NodeSpec, target: _Target, r: subprocess.CompletedProcess, listing: bool) -> None:
        """What a start said of the node: how its workers' processes are ended (logged when that
        is new), and, the first time, what ended harvester runs of this host left there, which
        is then killed and removed."""
        how = self._marked(r, "HVS-CG")
        if how and how[-1] and how[-1][0] != target.cleanup:
            target.cleanup = how[-1][0]
            log.info("%s: every process a job starts is ended by %s", node.name, target.cleanup)
        if not listing:
            return
        target.swept = True
        mine = instance()
        dead = sorted({p[0] for p in self._marked(r, "HVS-INST") if p and p[0] != mine and instance_dead(p[0])})
        if dead:
            log.warning("%s: ending what %d ended harvester run(s) of this host left there: %s", node.name,
                        len(dead), ", ".join(dead))
            try:
                self.run_script(node, _SWEEP, dead, timeout=30.0)
            except TransportError as e:
                log.warning("%s: could not end them: %s", node.name, e.message)

    def cleanup_of(self, node: NodeSpec) -> str:
        with self._lock:
            t = self._targets.get(node.target)
        return t.cleanup if t is not None else ""

    def run(self, node: NodeSpec, argv: Sequence[str], timeout: float = 30.0) -> tuple[int, str, str]:
        r = self.run_script(node, 'exec "$@"', list(argv), timeout=timeout)
        return r.returncode, r.stdout.decode("utf-8", "replace"), r.stderr.decode("utf-8", "replace")

    def give_dir(self, node: NodeSpec, path: str, user: str) -> None:
        up = os.path.dirname(path)
        r = self.run_script(node, 'umask 066; mkdir -p -- "$3" && chmod go+x -- "$3" "$4" && umask 077 && '
                                  'mkdir -p -- "$1" && chown -- "$2:" "$1" && chmod 700 -- "$1"',
                            [path, user, up, os.path.dirname(up) or "/"], timeout=30.0)
        if r.returncode != 0:
            err = r.stderr.decode("utf-8", "replace").strip().splitlines()
            raise StartError(node.name, f"cannot give {path} to {user}" + (f" ({err[-1]})" if err else ""))

    @staticmethod
    def _pairs(handles: list[Handle], marks: bool = False) -> list[str]:
        """PID and token of each handle (and its mark, '-' for none, with `marks`)."""
        out = []
        for h in handles:
            out += [str(h.pid), h.token or "-"] + ([check_mark(h.mark) if h.mark else "-"] if marks else [])
        return out

    def _alive_node(self, handles: list[Handle]) -> dict[Handle, bool]:
        script = ('while [ $# -ge 2 ]; do '
                  'if _alive "$1" "$2"; then echo "HVS $1 1"; else echo "HVS $1 0"; fi; shift 2; done')
        r = self.run_script(handles[0].node, script, self._pairs(handles), limit=self.alive_timeout_s)
        seen = {int(p[0]): p[1] == "1" for p in self._marked(r) if len(p) == 2}
        if r.returncode != 0 or len(seen) < len({h.pid for h in handles}):
            raise TransportError(handles[0].node.name, f"bad answer to a liveness check (exit {r.returncode})")
        return {h: seen[h.pid] for h in handles}

    def _stop_node(self, handles: list[Handle], grace_s: float) -> dict[Handle, str]:
        cs = max(0, int(round(grace_s * 100)))
        r = self.run_script(handles[0].node, _STOP, [str(cs), *self._pairs(handles, marks=True)],
                            timeout=grace_s + 15.0)
        seen = {int(p[0]): p[1] for p in self._marked(r) if len(p) == 2}
        if r.returncode != 0 or len(seen) < len({h.pid for h in handles}):
            err = r.stderr.decode("utf-8", "replace").strip()
            raise TransportError(handles[0].node.name, f"bad answer to stop (exit {r.returncode}) {err}")
        ok = {STOP_GONE, STOP_TERM, STOP_KILL}
        return {h: seen[h.pid] if seen[h.pid] in ok else STOP_GONE for h in handles}

    def _census_node(self, handles: list[Handle]) -> dict[Handle, Optional[int]]:
        args = [x for h in handles for x in (str(h.pid), check_mark(h.mark) if h.mark else "-")]
        r = self.run_script(handles[0].node, _CENSUS, args, limit=self.alive_timeout_s * 3)
        seen: dict[int, set[str]] = {}
        lines = self._marked(r, "HVP")
        if r.returncode != 0 or ["done"] not in lines:
            return {}
        for p in lines:
            if len(p) == 2:
                seen.setdefault(int(p[0]), set()).add(p[1])
        return {h: len(seen.get(h.pid, ())) for h in handles}

    def folder_size(self, node: NodeSpec, path: str) -> tuple[Optional[int], bool]:
        r = self.run_script(node, '[ -d "$1" ] || { echo "HVS none"; exit 0; }; '
                                  'echo "HVS $(du -sk -- "$1" 2>/dev/null | cut -f1)"', [path], timeout=30.0)
        said = self._marked(r)
        if not said or not said[-1] or not said[-1][0].isdigit():
            return None, True
        return int(said[-1][0]) * 1024, True

    def kill(self, handle: Handle) -> None:
        self.run_script(handle.node, _KILL, self._pairs([handle], marks=True), timeout=15.0)

    def tail(self, handle: Handle, lines: int = 20) -> list[str]:
        """`tail -c` first: `tail -n` alone sends a 30 MB line whole. One byte more than the cap
        says whether what came begins a line (logtail.last_lines)."""
        if lines <= 0:
            return []
        r = self.run_script(handle.node, 'echo HVS-TAIL; tail -c "$1" -- "$3" 2>/dev/null | tail -n "$2"; exit 0',
                            [str(MAX_READ_BYTES + 1), str(int(lines) + 1), handle.log_path],
                            limit=2 * self.alive_timeout_s)
        head, mark, data = r.stdout.partition(b"HVS-TAIL\n")
        if not mark:
            return []
        whole = len(data) <= MAX_READ_BYTES or data[:1] in (b"\n", b"\r")
        return last_lines(data if len(data) <= MAX_READ_BYTES else data[1:], lines, whole)

    def close(self) -> None:
        """Stop the master connections (they would otherwise linger ControlPersist seconds)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            targets = [t for t, s in self._targets.items() if s.warm]
            folders = [t for t, s in self._targets.items() if s.warm and s.cleanup in (CGROUP2, CGROUP1)]
        for target in folders:     # this run's cgroup folders there, now empty
            try:
                subprocess.run([*self._base, "--", target, "sh -s"], capture_output=True, timeout=10,
                               input=(_LIB + f"set -- {shlex.quote(instance())}\n" + _CLOSE).encode())
            except (subprocess.TimeoutExpired, OSError):
                pass
        for target in targets:
            try:
                subprocess.run([*self._base, "-O", "exit", "--", target], capture_output=True,
                               timeout=10)
            except (subprocess.TimeoutExpired, OSError):
                pass
        shutil.rmtree(self._dir, ignore_errors=True)
