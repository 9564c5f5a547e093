"""Restart-based jobs (`launcher: torchrun`): unmodified scripts that follow torchrun's contract.

Such a script imports nothing of ours, so a membership change cannot be a regroup: every change
of the job's nodes stops the running *generation* (SIGTERM to every rank, SIGKILL after the job's
`stop_grace_seconds`, time the script uses to checkpoint) and starts a new one on the new node set
with torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,
MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_RUN_ID) and a per-job
HARVEST_CHECKPOINT_DIR that outlives generations. Progress is the last line of rank 0's output
matching the job's `progress_pattern` (group 1 = the job's cumulative samples). A restart may step
progress back to the checkpoint; those samples and the time to the new generation's first progress
line are the rescale's measured cost (a PauseSample for the profiler).

`RestartJobs` is mechanism only, driven by `WorkerDispatcher` (which owns the transport, the
thread pool and the event queue it shares with runtime jobs).
"""
from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

from .. import failures, patterns
from . import blame
from . import rendezvous
from ..failures import Failure
from ..model import Event, EventKind, Job, PauseSample, RateSample
from ..runtime import ranks
from ..transports.base import Handle, NodeSpec, StartError, Transport, TransportError

ENV_CHECKPOINT_DIR = "HARVEST_CHECKPOINT_DIR"
PORTS = range(29500, 30500)        # MASTER_PORT of a remote rank 0 (a generation's own choice)
TAIL_LINES = 40
RENDEZVOUS_EVERY_S = 5.0           # how often a generation's store is read until its group formed


def checkpoint_dir(logdir: Path, job_id: str) -> Path:
    """Where a job's checkpoints go (HARVEST_CHECKPOINT_DIR): one directory that outlives its
    generations and workers."""
    return logdir / job_id / "checkpoint"


@dataclass
class _Gen:
    """One generation: the processes started together on one node set."""
    number: int
    nodes: list[str]
    handles: dict[str, Handle] = field(default_factory=dict)     # worker key -> process
    started_at: float = 0.0
    first_progress_at: Optional[float] = None
    first_progress: Optional[float] = None
    master: tuple[str, int] = ("", 0)   # MASTER_ADDR, MASTER_PORT: where rank 0 serves its store
    formed: bool = False                # its ranks' process group formed (rendezvous.py)
    probing: bool = False               # its store is being read
    probe_at: float = 0.0               # monotonic: not read again before this


@dataclass
class _RestartRun:
    job: Job
    checkpoint_dir: Path
    target: list[str] = field(default_factory=list)
    gen: Optional[_Gen] = None
    restarts: int = 0
    samples: float = 0.0              # the job's progress: the last matching line (may step back)
    best: float = 0.0                 # the most it ever reached
    lost_samples: float = 0.0
    progress_at: float = 0.0          # when a progress line last changed
    stop_at: Optional[float] = None   # when the last generation was told to stop (a rescale)
    stop_kind: str = ""               # "up" | "down" of that rescale
    stop_rate: float = 0.0            # samples/s before it
    before: float = 0.0               # progress when it was told to stop
    rate: float = 0.0
    meter: Optional[tuple[float, float, int]] = None   # (time, samples, generation)
    losses: list[float] = field(default_factory=list)   # when ranks were lost (the crash budget's)
    last_line: str = ""               # rank 0's last line of output
    ended: bool = False
    applying: threading.Lock = field(default_factory=threading.Lock)


class RestartJobs:
    """The restart-based jobs of one WorkerDispatcher (see the module docstring)."""

    def __init__(self, transport: Transport, specs: dict[str, NodeSpec], logdir: Path,
                 launch: Callable[[Job, NodeSpec, dict[str, str], str], Handle],
                 base_env: Callable[[], dict[str, str]], submit: Callable, post: Callable[[Event], None],
                 lost: Callable[[str, str, Failure], None], progress_timeout_s: float = 600.0,
                 sample_s: float = 5.0, start_timeout_s: float = 300.0,
                 interfaces: Optional[dict[str, str]] = None, rendezvous_timeout_s: float = 60.0) -> None:
        """`launch(job, node, env, log_path)` starts one rank (the dispatcher's: as the job's
        account where it has one); `transport` polls and stops them. A generation with no
        progress line within `start_timeout_s`, or none for `progress_timeout_s` after its
        first, fails the job with rank 0's last line. `interfaces`: per node, what its ranks
        give gloo (GLOO_SOCKET_IFNAME) where the site does not: a script of its own binds the
        interface that reaches the head, whatever its host name resolves to. A generation whose
        ranks formed no process group within `rendezvous_timeout_s` (read from rank 0's store,
        `_watch_rendezvous`) fails the job naming the ranks that never arrived (0: not watched).
        `lost(job_id, node, failure)` is the dispatcher's; an exception after the job's first
        progress is said to be one during training on the way (`_lose`)."""
        self.transport, self.specs, self.logdir, self.launch = transport, specs, logdir, launch
        self.base_env, self.submit, self.post, self._lost_to = base_env, submit, post, lost
        self.lost = self._lose
        self.progress_timeout_s = progress_timeout_s
        self.rendezvous_timeout_s = rendezvous_timeout_s
        self.start_timeout_s = start_timeout_s
        self.interfaces = interfaces if interfaces is not None else {}
        self.sample_s = sample_s
        self.life = 1                 # the harvester's start number, in every log's name
        self.runs: dict[str, _RestartRun] = {}
        self._lock = threading.RLock()
        self._samples: list = []

    # ---- what the dispatcher forwards ---------------------------------------------------------
    def resize(self, job: Job, nodes: Sequence[str], now: float) -> None:
        with self._lock:
            run = self.runs.get(job.id)
            if run is None:
                run = self.runs[job.id] = _RestartRun(job, checkpoint_dir(self.logdir, job.id),
                                                      samples=job.samples_done,   # resumed, resubmitted: not 0
                                                      progress_at=time.monotonic())
            if list(nodes) == run.target:
                return
            if run.gen is not None and run.gen.handles:
                run.stop_at, run.before, run.stop_rate = time.monotonic(), run.samples, run.rate
                run.stop_kind = "up" if len(nodes) > len(run.target) else "down"
            run.target = list(nodes)
        self.submit(self._apply, run)

    def vacate(self, job: Job, lost: Sequence[str], now: float) -> None:
        run = self.runs.get(job.id)
        if run is not None:
            self.resize(job, [n for n in run.target if n not in set(lost)], now)

    def stop(self, job: Job) -> None:
        with self._lock:
            run = self.runs.pop(job.id, None)
        if run is None:
            return
        job.samples_done = max(job.samples_done, run.samples)
        job.story = {"samples_done": run.samples, "lost_samples": run.lost_samples, "restart_count": run.restarts,
                     "last_output": run.last_line}
        run.ended = True
        run.target = []
        self.submit(self._apply, run)

    def progress(self, job: Job) -> float:
        run = self.runs.get(job.id)
        return run.samples if run is not None else job.samples_done

    def rate(self, job: Job) -> float:
        run = self.runs.get(job.id)
        return run.rate if run is not None else 0.0

    def status(self, job_id: str) -> Optional[dict]:
        run = self.runs.get(job_id)
        if run is None:
            return None
        gen = run.gen
        members = list(gen.handles) if gen else []
        return {"launcher": "torchrun", "generation": gen.number if gen else 0,
                "restart_count": run.restarts, "members": members, "world_size": len(members),
                "nodes": len(gen.nodes) if gen and gen.handles else 0, "regrouping": run.stop_at is not None,
                "samples_done": run.samples, "lost_samples": run.lost_samples,
                "progressing": bool(gen and gen.handles and gen.first_progress_at is not None),
                "last_output": run.last_line,
                "committed_step": None, "loss": None, "lost": [], "last_rescale": None}

    def keyed_handles(self, job_id: str) -> list[tuple[str, Handle]]:
        """The job's running ranks, rank 0 first."""
        run = self.runs.get(job_id)
        return list(run.gen.handles.items()) if run is not None and run.gen is not None else []

    def samples(self) -> list:
        with self._lock:
            out, self._samples = self._samples, []
        return out

    def handles(self) -> list[tuple[_RestartRun, str, Handle]]:
        return [(run, k, h) for run in list(self.runs.values()) if run.gen is not None and not run.ended
                for k, h in list(run.gen.handles.items())]

    # ---- generations ------------------------------------------------------------------------------
    def _apply(self, run: _RestartRun) -> None:
        """Stop the running generation, start one on the latest target (one at a time per job)."""
        with run.applying:
            old = run.gen
            if old is not None and old.handles and old.nodes == run.target and not run.ended:
                return
            if old is not None and old.handles:
                hs = list(old.handles.values())
                old.handles = {}
                self.transport.stop_many(hs, run.job.stop_grace_seconds)
                self._read_progress(run, hs[0])
            if run.ended or not run.target:
                run.gen = None if run.ended else run.gen
                return
            self._start(run, list(run.target))

    def _start(self, run: _RestartRun, nodes: list[str]) -> None:
        number = (run.gen.number + 1) if run.gen is not None else 0
        gen = _Gen(number, nodes, started_at=time.monotonic())
        keys = [k for n in nodes for k in ranks.keys_of(n, self.specs[n].slots)]
        master = self.transport.host_of(self.specs[nodes[0]]) or "127.0.0.1"
        port = _free_port() if _loopback(master) else PORTS[(hash(run.job.id) + number) % len(PORTS)]
        gen.master = (master, port)
        common = {**self.base_env(), "MASTER_ADDR": master, "MASTER_PORT": str(port),
                  "TORCHELASTIC_RESTART_COUNT": str(number), "TORCHELASTIC_RUN_ID": run.job.id,
                  "TORCHELASTIC_MAX_RESTARTS": "0", ENV_CHECKPOINT_DIR: str(run.checkpoint_dir),
                  "HARVEST_JOB": run.job.id}
        if _loopback(master):
            common["GLOO_SOCKET_IFNAME"] = "lo"
        started: dict[str, Handle] = {}
        try:
            for key in keys:
                env = {**common, **ranks.place(keys, key).env(), "HARVEST_NODE": key}
                iface = self.interfaces.get(ranks.node_of(key))
                if iface and "GLOO_SOCKET_IFNAME" not in env:
                    env["GLOO_SOCKET_IFNAME"] = iface
                log_path = str(self.logdir / run.job.id / f"{key}-s{self.life}-g{number}.log")
                started[key] = self.launch(run.job, self.specs[ranks.node_of(key)], env, log_path)
        except (StartError, ValueError) as e:
            self.transport.stop_many(list(started.values()), 0.5)
            self.fail(run, failures.from_start_error(getattr(e, "message", str(e)), getattr(e, "node", None)))
            return
        except TransportError as e:
            self.transport.stop_many(list(started.values()), 0.5)
            unreachable = failures.named(failures.UNREACHABLE, f"cannot reach {e.node}: {e.message}", e.node)
            self.lost(run.job.id, e.node, unreachable)
            return
        gen.handles = started
        run.gen = gen
        run.restarts = number

    # ---- watching ------------------------------------------------------------------------------
    def check(self, alive: dict[Handle, Optional[bool]], silent: frozenset[str] = frozenset()) -> None:
        """Per poll: read rank 0's progress, notice the end of the job, a dead rank or a
        generation that shows no progress. `silent`: nodes whose liveness check went unanswered
        this time: nothing waits on them here (a dead host answers never)."""
        for run in list(self.runs.values()):
            gen = run.gen
            if run.ended or gen is None or not gen.handles or run.applying.locked():
                continue
            hs = list(gen.handles.items())
            if hs[0][1].node.name not in silent:
                self._read_progress(run, hs[0][1])
            if not any(h in alive for _, h in hs):
                continue          # a generation started after the check was sent: not checked yet
            dead = [(k, h) for k, h in hs if h in alive and not alive[h]]
            if not dead:
                self._check_stalled(run, gen)
                continue
            rank0_key = hs[0][0]
            rank0_dead = any(k == rank0_key for k, _ in dead)
            key, handle = next(((k, h) for k, h in dead if k == rank0_key), dead[0])
            with run.applying:
                if run.gen is not gen or not gen.handles:
                    continue
                gen.handles = {}
            if run.samples >= run.job.total_samples:     # rank 0 said the last samples: any rank may end first
                self.transport.stop_many([h for _, h in hs], run.job.stop_grace_seconds)
                run.ended = True
                self.post(Event(time.time(), EventKind.JOB_DONE, job=run.job.id))
                continue
            node = ranks.node_of(key)
            if alive.get(handle) is None:
                failure = failures.named(failures.UNREACHABLE, f"{node} did not answer its liveness checks", node)
            else:
                failure = failures.from_exit(self._tail(handle), self.transport.exit_status(handle), node)
            self.transport.stop_many([h for _, h in hs if h.node.name not in silent], 1.0)
            self.submit(self.transport.stop_many, [h for _, h in hs if h.node.name in silent], 1.0)
            if rank0_dead and failure.kind in (failures.EXITED_EARLY, failures.OTHER):
                failure.kind, failure.hint = failures.EXITED_EARLY, (
                    "rank 0 ended without an error before the job's total: the script must train until "
                    "its total samples (and print them cumulatively), or register the total it trains")
                failure.message = (f"rank 0 exited at {run.samples:,.0f} of {run.job.total_samples:,.0f} samples"
                                   + (f"; last line: {run.last_line}" if run.last_line else ""))
                self.fail(run, failure)
            elif failure.kind in failures.SETUP and run.best <= 0 and gen.first_progress_at is None:
                failure.message = f"before the job's first progress line: {failure.message}"
                self.fail(run, failure)
            else:
                for lost_node, lost_failure in [(node, failure), *self._same_error_elsewhere(hs, node, failure)]:
                    run.target = [n for n in run.target if n != lost_node]
                    self.lost(run.job.id, lost_node, lost_failure)
                if run.target and not run.ended:
                    self.submit(self._apply, run)      # the job goes on on its other nodes

    def _same_error_elsewhere(self, hs: list[tuple[str, Handle]], node: str,
                              failure: Failure) -> list[tuple[str, Failure]]:
        """The other nodes of the generation whose ranks failed with the same error of the job's
        own as `node`'s (read once the generation is stopped): a script that raises on every
        rank is one error everywhere, which fails the job at once (blame.py), not a lost node."""
        if blame.node_caused(failure) or blame.consequence(failure) or failure.kind == failures.EXITED_EARLY:
            return []
        sig, out, seen = blame.signature(failure), [], {node}
        for key, h in hs:
            other = ranks.node_of(key)
            if other in seen:
                continue
            f = failures.from_exit(self._tail(h), self.transport.exit_status(h), other)
            if blame.signature(f) == sig:
                seen.add(other)
                out.append((other, f))
        return out

    def _check_stalled(self, run: _RestartRun, gen: _Gen) -> None:
        """No progress line within `start_timeout_s` of the generation's start, or none for
        `progress_timeout_s` after: the job fails with rank 0's last line. Before the first, a
        group that has not formed within `rendezvous_timeout_s` fails it (`_watch_rendezvous`)."""
        first = gen.first_progress_at is None
        if first:
            self._watch_rendezvous(run, gen)
        since = gen.started_at if first else max(run.progress_at, gen.first_progress_at or 0.0)
        limit = self.start_timeout_s if first else self.progress_timeout_s
        if time.monotonic() - since <= limit:
            return
        what = "no progress line" if first else "no new progress line"
        self.fail(run, Failure(
            failures.NO_PROGRESS,
            f"{what} matching {run.job.progress_pattern!r} for {limit:.0f} s"
            + (f"; rank 0's last line: {run.last_line}" if run.last_line else "; rank 0 printed nothing"),
            gen.nodes[0] if gen.nodes else None,
            "rank 0 must print its cumulative samples in a line the job's progress pattern matches "
            "(flush its output, or run with PYTHONUNBUFFERED=1)" if first else failures.hint_of(failures.NO_PROGRESS),
            self._tail(next(iter(gen.handles.values()))) if gen.handles else []))

    def _watch_rendezvous(self, run: _RestartRun, gen: _Gen) -> None:
        """From `rendezvous_timeout_s` after a generation's start until its group formed or its
        first progress line, rank 0's store is read every `RENDEZVOUS_EVERY_S` on the pool (a
        read waits up to `rendezvous.read_store`'s timeout; never on the controller's thread)."""
        now = time.monotonic()
        if (self.rendezvous_timeout_s <= 0 or gen.formed or gen.probing or not gen.master[1]
                or now - gen.started_at < self.rendezvous_timeout_s or now < gen.probe_at):
            return
        gen.probing, gen.probe_at = True, now + RENDEZVOUS_EVERY_S
        self.submit(self._read_rendezvous, run, gen)

    def _read_rendezvous(self, run: _RestartRun, gen: _Gen) -> None:
        """One read of the generation's store: a group that formed is not read again; one whose
        ranks never all arrived fails the job, naming them (rendezvous.verdict)."""
        try:
            keys = list(gen.handles)
            if not keys:
                return
            view = rendezvous.read_store(*gen.master)
            if rendezvous.formed(view, len(keys)):
                gen.formed = True
                return
            host, port = gen.master
            failure = rendezvous.verdict(view, [ranks.node_of(k) for k in keys], f"{host}:{port}",
                                         time.monotonic() - gen.started_at)
        finally:
            gen.probing = False
        if failure is None or run.ended or run.gen is not gen or not gen.handles or gen.first_progress_at is not None:
            return
        rank0 = next(iter(gen.handles.values()), None)
        failure.tail = self._tail(rank0)[-failures.TAIL_KEPT:] if rank0 is not None else []
        if run.last_line:
            failure.message += f"; rank 0's last line: {run.last_line}"
        self.fail(run, failure)

    def _lose(self, job_id: str, node: str, failure: Failure) -> None:
        """A lost node, to the dispatcher (`lost`): the script's exception after the job's first
        progress is one during training (failures.raised_during), not a start error."""
        run = self.runs.get(job_id)
        if run is not None and (run.best > 0 or (run.gen is not None and run.gen.first_progress_at is not None)):
            per_step = run.job.samples_per_step
            failures.raised_during(failure, f"at step {run.samples / per_step:,.0f}" if per_step > 0
                                   else f"after {run.samples:,.0f} samples")
        self._lost_to(job_id, node, failure)

    def fail(self, run: _RestartRun, failure: Failure) -> None:
        """The job fails, once, with its named reason."""
        if run.ended:
            return
        run.ended = True
        self.post(Event(time.time(), EventKind.JOB_FAILED, job=run.job.id, node=failure.node,
                        detail=failure.line(), failure=failure.to_dict()))

    def _read_progress(self, run: _RestartRun, rank0: Handle) -> None:
        """Rank 0's last lines (at most TAIL_LINES, each bounded by the transport) and the
        progress in them; a pattern stored before RE2's rules fails the job, saying why."""
        refused = patterns.refused(run.job.progress_pattern)
        if refused:
            self.fail(run, Failure(failures.OTHER, f"its progress pattern {run.job.progress_pattern!r} cannot be "
                                   f"matched: {refused}", None, "register the job again with an RE2 pattern"))
            return
        tail = self._tail(rank0)
        lines = [line for line in tail if line.strip()]
        if lines:
            run.last_line = failures.last_line(lines)[-300:]
        value = self._last_match(run.job.progress_pattern, tail, run.job.samples_per_step)
        if value is None:
            return
        now = time.monotonic()
        gen = run.gen
        if value != run.samples:
            run.progress_at = now
        run.samples = min(value, float(run.job.total_samples))
        run.best = max(run.best, run.samples)
        if gen is not None and gen.first_progress_at is None and gen.handles:
            gen.first_progress_at, gen.first_progress = now, value
            self._rescale_measured(run, now)
        self._meter(run, now)

    def _rescale_measured(self, run: _RestartRun, now: float) -> None:
        """The first progress line of a new generation closes the rescale: its cost is the time
        from the stop to that line plus the samples it lost, at the rate before."""
        if run.stop_at is None:
            return
        assert run.gen is not None and run.gen.first_progress is not None
        lost = max(0.0, run.before - run.gen.first_progress)
        run.lost_samples += lost
        cost = now - run.stop_at + (lost / run.stop_rate if run.stop_rate > 0 else 0.0)
        with self._lock:
            self._samples.append(PauseSample(time.time(), run.job.id, run.stop_kind, cost))
        run.stop_at = None

    def _meter(self, run: _RestartRun, now: float) -> None:
        gen = run.gen
        if gen is None or not gen.handles:
            run.meter = None
            return
        if run.meter is None or run.meter[2] != gen.number:
            run.meter = (now, run.samples, gen.number)
            return
        t0, s0, _ = run.meter
        if now - t0 >= self.sample_s and run.samples > s0:
            run.rate = (run.samples - s0) / (now - t0)
            with self._lock:
                self._samples.append(RateSample(time.time(), run.job.id, len(gen.nodes), run.rate, now - t0))
            run.meter = (now, run.samples, gen.number)

    @staticmethod
    def _last_match(pattern: str, lines: list[str], per_step: float = 0.0) -> Optional[float]:
        """Group 1 of the last line matching `pattern` (RE2: linear in the lines, which the
        transport's tail bounds) that holds a finite, non-negative count: samples, or steps of
        `per_step` samples. `nan`, `inf` or `-5` are no progress (patterns.count)."""
        return patterns.last_count(pattern, lines, per_step if per_step > 0 else 1.0)

    def _tail(self, handle: Handle) -> list[str]:
        try:
            return self.transport.tail(handle, TAIL_LINES)
        except (TransportError, OSError):
            return []


def _loopback(host: str) -> bool:
    return host.startswith("127.") or host in ("localhost", "::1")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
