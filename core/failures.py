"""Why a job's worker failed, in words a user can act on: one `Failure` per failed job (kind,
node, message, what to do, the log's last lines), read from what the transport saw (a start
refused, an exit status) and from the end of the worker's log.

Pure functions on text: the dispatcher decides what a failure does to the job (a lost node, or
the job failed at once when it is a set-up error), this module only names it.
"""
from __future__ import annotations

import signal
from dataclasses import asdict, dataclass, field
from typing import Any, Optional, Sequence

from . import patterns

#: what went wrong; `SETUP` kinds are the same on every node, so retrying elsewhere cannot help
COMMAND_NOT_FOUND = "command_not_found"
NOT_EXECUTABLE = "not_executable"
WORKDIR_MISSING = "workdir_missing"
LOG_UNWRITABLE = "log_unwritable"
EXCEPTION = "exception"
RENDEZVOUS = "rendezvous"
PEER_LOST = "peer_lost"
HUNG = "hung"
OUT_OF_MEMORY = "out_of_memory"
SIGNAL = "signal"
EXIT_STATUS = "exit_status"
EXITED_EARLY = "exited_early"
NO_PROGRESS = "no_progress"
UNREACHABLE = "unreachable"
CRASHES = "crashes"
STORE_DOWN = "store_down"
LIMIT = "limit"           # over a cap of the site's on its processes or files: the job's own doing
OTHER = "other"
SETUP = frozenset({COMMAND_NOT_FOUND, NOT_EXECUTABLE, WORKDIR_MISSING, LOG_UNWRITABLE, EXCEPTION, EXIT_STATUS})
TAIL_KEPT = 20

_HINTS = {
    COMMAND_NOT_FOUND: "give the interpreter by an absolute path, or a relative one with --workdir "
                       "(ssh starts in the home folder); the command must exist on every node",
    NOT_EXECUTABLE: "the command is not executable on the node: check its mode (chmod +x) and its #! line",
    WORKDIR_MISSING: "--workdir must name a folder that exists on every node (a shared file system)",
    LOG_UNWRITABLE: "the worker log folder must be writable on the node",
    EXCEPTION: "the script raised this on start; run it by hand on one node to see the whole traceback",
    PEER_LOST: "another rank of the group died or was cut off; see that node's log",
    HUNG: "a rank stopped answering (hung, stopped or cut off from the head)",
    OUT_OF_MEMORY: "the rank ran out of memory: a smaller batch per rank, or fewer ranks per node",
    NO_PROGRESS: "the job made no step within its start timeout; its log's last lines are below",
    UNREACHABLE: "the node did not answer over ssh",
    LIMIT: "the job went over a limit this site sets on every job (its processes per node, its checkpoint "
           "folder's size): use fewer processes or smaller checkpoints, or ask the operators for more",
    STORE_DOWN: "the job's store process ended again and again, likely from something that reaches its "
                "port and floods it: keep the store port inside the cluster network (--coordinator-bind)",
}
_TRACEBACK = "Traceback (most recent call last)"
_EXC_LINE = patterns.fixed(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Failure|Timeout)\w*)(?::\s*(.*))?$")
_ADDRESS = patterns.fixed(r"remote=\[([^\]]+)\]:(\d+)|(?:^|[^\d.])((?:\d{1,3}\.){3}\d{1,3}):(\d{2,5})")
_RENDEZVOUS = patterns.fixed(r"(?i)connectFullMesh|DistStoreError|TCPStore|Connection refused|timed out waiting for clients|"
                             r"Socket Timeout|failed to connect|Gloo.*connect|NCCL.*(?:bootstrap|socket)")
_PEER = patterns.fixed(r"(?i)Connection closed by peer|Connection reset by peer|Broken pipe|remote process exited|"
                       r"ProcessGroupNCCL.*(?:Watchdog|timeout)|NCCL communicator was aborted")
_OOM = patterns.fixed(r"(?i)CUDA out of memory|OutOfMemoryError|MemoryError|Cannot allocate memory|oom-kill")
_NOT_FOUND = patterns.fixed(r"(?i)command not found|No such file or directory|can't open file")
#: lines every rank prints that say nothing about the job: c10d's and glog's own lines ("[W1129
#: 03:27:47.25 socket.cpp:1028] [c10d] The hostname of the client socket cannot be retrieved"),
#: the C++ frames c10 prints with them, Python's warnings and the source line after one, NCCL's
#: INFO lines, gloo's connection report
KNOWN_WARNINGS = patterns.fixed(
    r"^\s*\[[WI]\d{4} [\d:.]+ [^\]]*\]|^\s*\[[WI] [\w.]+:\d+\]|^\s*\[Gloo\] |\bNCCL INFO\b|"
    r"^\s*Exception raised from .* \(most recent call first\):$|^\s*frame #\d+: |^\s*<omitting python frames>$|"
    r"^\s*(?:UserWarning|FutureWarning|DeprecationWarning): ")
_PY_WARNING = patterns.fixed(r"^\S.*:\d+: \w*Warning: ")   # warnings.warn's line; the source line follows it


@dataclass
class Failure:
    kind: str
    message: str
    node: Optional[str] = None
    hint: str = ""
    tail: list[str] = field(default_factory=list)
    address: str = ""                 # rendezvous: the host:port that could not be reached

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Any) -> Optional["Failure"]:
        if not isinstance(d, dict) or not isinstance(d.get("kind"), str):
            return None
        return cls(d["kind"], str(d.get("message") or ""), d.get("node"), str(d.get("hint") or ""),
                   [str(x) for x in d.get("tail") or []][-TAIL_KEPT:], str(d.get("address") or ""))

    def line(self) -> str:
        """One line for events, the why-line and exceptions."""
        where = f" on {self.node}" if self.node else ""
        return f"{self.kind.replace('_', ' ')}{where}: {self.message}" + (f" ({self.hint})" if self.hint else "")


def hint_of(kind: str) -> str:
    """What a user does about a failure of this kind."""
    return _HINTS.get(kind, "")


def named(kind: str, message: str, node: Optional[str], tail: Sequence[str] = (), hint: str = "") -> Failure:
    return Failure(kind, message, node, hint or _HINTS.get(kind, ""), list(tail)[-TAIL_KEPT:])


def from_start_error(message: str, node: Optional[str]) -> Failure:
    """A worker the transport could not start (StartError's message)."""
    low = message.lower()
    if "no working directory" in low:
        return named(WORKDIR_MISSING, message, node)
    if "command not found" in low or "no such file" in low:
        return named(COMMAND_NOT_FOUND, message, node)
    if "permission denied" in low or "not executable" in low:
        return named(NOT_EXECUTABLE, message, node)
    if "cannot write the log" in low:
        return named(LOG_UNWRITABLE, message, node)
    return named(OTHER, message, node, hint="the worker could not be started on the node")


def rendezvous(text: str, node: Optional[str], tail: Sequence[str] = ()) -> Failure:
    """A group that could not form: name the address that failed and what to set."""
    m = _ADDRESS.search(text)
    host, port = (m.group(1) or m.group(3), m.group(2) or m.group(4)) if m else (None, None)
    if host and (host.startswith("127.") or host in ("localhost", "::1")):
        hint = (f"a rank dialled {host}: a node's own name resolves to loopback there. Fix /etc/hosts on the "
                f"nodes, or give the workers GLOO_SOCKET_IFNAME (the interface that reaches the other nodes) "
                f"through --worker-env; `python -m app check --nodes FILE` finds such nodes")
    elif host:
        hint = (f"{host}:{port} did not answer from the node: a firewall between the nodes, or the wrong "
                f"interface (GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME through --worker-env)")
    else:
        hint = "the ranks could not connect to each other or to the job's store (--advertise, firewalls)"
    failure = named(RENDEZVOUS, _last_error(text) or text.strip()[:300], node, tail, hint)
    failure.address = f"{host}:{port}" if host else ""
    return failure


def from_exit(tail: Sequence[str], exit_status: Optional[int], node: Optional[str]) -> Failure:
    """A worker that exited by itself: its log's last lines and, where the transport knows it,
    its exit status (negative: the signal that killed it)."""
    tail = [line.rstrip() for line in tail if line.strip()]
    text = "\n".join(tail)
    last = _last_error(text) or last_line(tail)
    if _OOM.search(text):
        return named(OUT_OF_MEMORY, last or "out of memory", node, tail)
    if _TRACEBACK in text:
        if _PEER.search(last):
            return named(PEER_LOST, last, node, tail)
        if _RENDEZVOUS.search(last):
            return rendezvous(last, node, tail)
        return named(EXCEPTION, last, node, tail)
    if exit_status == 127 or (exit_status is not None and exit_status > 0 and _NOT_FOUND.search(last)):
        return named(COMMAND_NOT_FOUND, last or f"exit status {exit_status}", node, tail)
    if exit_status == 126:
        return named(NOT_EXECUTABLE, last or "exit status 126", node, tail)
    if exit_status is not None and exit_status < 0:
        name = _signal_name(-exit_status)
        hint = ("SIGKILL is also what the kernel's out-of-memory killer sends: check the node's memory"
                if -exit_status == signal.SIGKILL else "something outside the job signalled it")
        return named(SIGNAL, f"killed by {name}" + (f"; last line: {last}" if last else ""), node, tail, hint)
    if exit_status is not None and exit_status > 128 and exit_status - 128 < 65:
        return named(SIGNAL, f"exit status {exit_status} ({_signal_name(exit_status - 128)})"
                      + (f"; last line: {last}" if last else ""), node, tail, "something signalled the rank")
    if exit_status:
        return named(EXIT_STATUS, f"exit status {exit_status}" + (f"; last line: {last}" if last else ""),
                      node, tail, "the script stopped with an error status; its log's last lines are below")
    if exit_status == 0:
        return named(EXITED_EARLY, "exited with status 0" + (f"; last line: {last}" if last else ""), node,
                      tail, "the script ended before the job's total samples")
    return named(OTHER, "the worker exited" + (f"; last line: {last}" if last else ""), node, tail,
                  "its log's last lines are below")


def loopback_rendezvous(failure: Failure) -> bool:
    """A group that failed to form because a rank advertised a loopback address: a set-up error
    (the node's name resolves to loopback, or gloo was told to use `lo`), not bad luck."""
    host = failure.address.rpartition(":")[0]
    return failure.kind == RENDEZVOUS and (host.startswith("127.") or host in ("localhost", "::1"))


def from_error_text(text: str, node: Optional[str] = None, tail: Sequence[str] = ()) -> Failure:
    """A failure the runtime described in words (a generation that failed, the coordinator's error)."""
    if _PEER.search(text):
        return named(PEER_LOST, _last_error(text) or text[:300], node, tail)
    if _RENDEZVOUS.search(text):
        return rendezvous(text, node, tail)
    if _OOM.search(text):
        return named(OUT_OF_MEMORY, text[:300], node, tail)
    return named(OTHER, text[:300], node, tail)


def last_line(lines: Sequence[str]) -> str:
    """The last line of output that says something: known warnings (`KNOWN_WARNINGS`, a Python
    warning with its source line) are skipped; the last line where nothing else is left."""
    kept = [line.rstrip() for line in lines if line.strip()]
    for i in range(len(kept) - 1, -1, -1):
        line = kept[i]
        if KNOWN_WARNINGS.search(line) or _PY_WARNING.search(line):
            continue
        if i > 0 and line[:1].isspace() and _PY_WARNING.search(kept[i - 1]):
            continue
        return line
    return kept[-1] if kept else ""


def raised_during(failure: Failure, where: str) -> Failure:
    """A script's exception after the job made progress (`where`: "at step 120", "after 7,680
    samples") is no start error: its hint says so. Other kinds are left as they are."""
    if failure.kind == EXCEPTION and where:
        failure.hint = (f"the script raised this during training, {where}; the traceback is in its log's "
                        f"last lines below")
    return failure


def _last_error(text: str) -> str:
    """The last line that reads like an exception ("ValueError: ..."), else ''."""
    for line in reversed(text.splitlines()):
        line = line.strip()
        m = _EXC_LINE.match(line)
        if m:
            return line[:500]
    return ""


def _signal_name(n: int) -> str:
    try:
        return signal.Signals(n).name
    except ValueError:
        return f"signal {n}"
