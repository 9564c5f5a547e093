"""Idle nodes of a real Slurm cluster, held with preemptible pilot jobs.

The harvester never uses a node behind Slurm's back: it submits one pilot job per idle node it
wants to a low-priority partition that Slurm preempts (GraceTime=0), and a node counts as
harvested only while a pilot runs there and is connected (core/slurm/pilot_job.py); the
training job's worker runs inside that pilot. When a main job needs the node, Slurm sends the
pilot SIGTERM and the pilot's first act is to tell the hub, so the leave reaches the controller
within milliseconds (`wake`), ahead of anything else; squeue is only the backstop for a pilot
that died without a word.

A background thread reads sinfo/squeue every `poll_s` (never the live loop's thread): it finds
free nodes (state `idle` with no flag like completing or planned), submits pilots to them (each
pinned with -w, --exclusive), cancels pilots that wait too long or whose node was taken
meanwhile, and notices pilots that vanished. Pilots count as the harvester's usage in Slurm's
accounting, so it holds only as many as the jobs could use (`want`, the sum of their max nodes):
surplus pending pilots are cancelled at once, held ones no job uses after `release_grace_s`. When Slurm cannot be asked the source is `stale`:
it keeps every node its pilots hold (they run on slurmd, which does not need slurmctld) and
submits nothing until slurmctld answers again.

Restarts: the hub's port, token and certificate are kept beside the store (core/slurm/identity.py).
A pilot that loses the hub keeps its node and redials for `orphan_timeout_s`; a harvester that
finds that file adopts the running pilots squeue shows (their nodes count as held at once, and
a pilot that does not redial within `pending_timeout_s` is cancelled) instead of cancelling them.
A clean stop cancels every pilot and removes the file.

GPU nodes: a node runs one rank per GPU of its GRES (`slots_of`), and its pilot asks for all of
them (--gres=gpu:N) so that Slurm binds them to the pilot (CUDA_VISIBLE_DEVICES and the like in
its environment, which its workers inherit).
"""
from __future__ import annotations

import getpass
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Collection, Optional

from ..model import Event, EventKind
from ..sources.base import SOURCE_DRY_RUN, SOURCE_OK, SOURCE_STALE, LiveNodeSource, SourceStatus
from .hub import PilotHub, PilotLink
from . import identity
from .identity import HubIdentity
from .wire import ENV_GRACE, ENV_HUB, ENV_HUB_SHA256, ENV_ORPHAN, ENV_TOKEN
from .cli import BadJobId, SlurmCli, SlurmJob, SlurmNode, SlurmUnavailable
from .settings import SettingError, SlurmSettings

log = logging.getLogger(__name__)

PILOT_SCRIPT = """#!{python}
import sys
sys.path.insert(0, {root!r})
from core.slurm.pilot_job import main
sys.exit(main())
"""


@dataclass
class _Pilot:
    job: str
    node: str
    submitted: float            # time.monotonic() when sbatch returned (or when it said hello)
    running: bool = False       # it said hello
    releasing: bool = False     # cancelled as surplus: its node goes when it says goodbye
    adopted: bool = False       # left running by an earlier run: its node is held until it redials


class SlurmSource(LiveNodeSource):
    name = "slurm"

    def __init__(self, settings: SlurmSettings, cli: Optional[SlurmCli] = None) -> None:
        self.settings = settings
        self.cli = cli or SlurmCli(settings.conf, settings.command_timeout_s)
        self.user = getpass.getuser()
        nodes = self.cli.nodes()                      # SlurmUnavailable: cannot start without it
        self._slurm: dict[str, SlurmNode] = {n.name: n for n in nodes}
        self._names = resolve_watch(settings, nodes, self.cli)
        self._watched = set(self._names)
        self._pilots: dict[str, _Pilot] = {}          # job id -> a pilot of ours not known to be over
        self._held: dict[str, str] = {}               # node -> the pilot whose hello made it a join
        self._events: list[Event] = []
        self._would: tuple[str, ...] = ()             # dry run: what would be harvested now
        self._demand = 0                              # nodes the jobs could use (`want`)
        self._in_use: frozenset[str] = frozenset()    # nodes the jobs hold
        self._surplus_since: Optional[float] = None   # monotonic: more pilots than demand since
        self._cancelled: set[str] = set()             # pending pilots we cancelled: a late hello is stray
        self._status = SourceStatus(self.name, SOURCE_DRY_RUN if settings.dry_run else SOURCE_OK,
                                    "", time.time())
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._wake: Optional[Callable[[], None]] = None
        self._token = ""
        self._adopted: list[str] = []                 # nodes of pilots an earlier run left running
        self.hub: Optional[PilotHub] = None
        if not settings.dry_run:
            ident, restarted = self._identity()
            self._token = ident.token
            self.hub = self._listen(ident)
            if restarted:
                self._adopt_leftovers()
            else:
                self._cancel_leftovers()

    # ---- LiveNodeSource ----------------------------------------------------------------------
    def address_of(self, node: str) -> Optional[str]:
        n = self._slurm.get(node)
        return n.address if n is not None and n.address else None

    def node_names(self) -> list[str]:
        return list(self._names)

    def capacity(self) -> int:
        """Watched nodes, but never more than the pilots it may hold at once."""
        return min(len(self.node_names()), self.settings.max_pilots)

    def slots_of(self, node: str) -> int:
        """How many ranks (worker processes) the node runs: `settings.slots` when given, else
        one per GPU of its GRES, as Slurm said at start (a GPU node's job runs one rank per
        GPU); 1 for a node without GPUs."""
        if self.settings.slots:
            return self.settings.slots
        n = self._slurm.get(node)
        return max(1, n.gpus if n is not None else 0)

    def initial_idle(self) -> list[str]:
        """A node is offered once a pilot holds it, never before; after a restart, the nodes
        whose pilots the earlier run left running (they redial, or are given back after
        `pending_timeout_s`)."""
        with self._lock:
            return [n for n in self._adopted if n in self._held]

    def start(self, wake: Optional[Callable[[], None]] = None) -> None:
        self._wake = wake
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="slurm-source", daemon=True)
            self._thread.start()

    def poll(self, now: float) -> list[Event]:
        if self._thread is None:
            self.start(self._wake)
        with self._lock:
            out, self._events = self._events, []
        return out

    def want(self, nodes: int, in_use: Collection[str]) -> None:
        with self._lock:
            self._demand, self._in_use = max(0, int(nodes)), frozenset(in_use)

    def status(self) -> SourceStatus:
        st = self._status
        if st.state == SOURCE_OK:
            with self._lock:
                held = len(self._held)
                used = len(self._in_use & set(self._held))
                waiting = sum(1 for p in self._pilots.values() if not p.running)
                wanted = min(self._demand, self.settings.max_pilots)
            return SourceStatus(st.name, st.state, f"{held} node(s) held by pilots, {used} used by jobs, "
                                                   f"{wanted} wanted; {waiting} pilot(s) pending in "
                                                   f"{self.settings.partition}", st.since, held, used)
        return st

    def node_states(self) -> dict[str, str]:
        with self._lock:
            pilot_on = {p.node: p for p in self._pilots.values()}
            would = set(self._would)
        out = {}
        for name in self._names:
            n = self._slurm.get(name)
            text = f"Slurm: {n.label if n else 'unknown'}"
            p = pilot_on.get(name)
            if p is not None:
                text += f", pilot {p.job}" + (" releasing" if p.releasing else "" if p.running else
                                              " of the earlier run, redialing" if p.adopted else " pending")
            elif name in would:
                text += ", would harvest (dry run)"
            out[name] = text
        return out

    def close(self) -> None:
        """Stop watching and give every node back: cancel our pilots, close their connections."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.settings.command_timeout_s * 3 + 5)
        with self._lock:
            jobs = list(self._pilots)
        try:
            self.cli.cancel(jobs)
        except (SlurmUnavailable, BadJobId) as e:
            log.warning("could not cancel pilots %s (%s); a restarted harvester adopts them, or they end "
                        "after the orphan timeout", jobs, e)
        else:
            if self.settings.state_file:       # nothing left to redial: the next start is a new hub
                Path(self.settings.state_file).unlink(missing_ok=True)
        if self.hub is not None:
            self.hub.close()

    # ---- pilots talking ----------------------------------------------------------------------
    def _on_hello(self, link: PilotLink) -> None:
        with self._lock:
            p = self._pilots.get(link.job)
            if p is None:                      # its hello came before sbatch returned its id
                p = self._pilots[link.job] = _Pilot(link.job, link.node, time.monotonic())
            adopted = p.adopted and p.node == link.node and self._held.get(link.node) == link.job
            p.node, p.running, p.adopted = link.node, True, False
            stray = not adopted and (link.node not in self._watched or link.node in self._held
                                     or link.job in self._cancelled)
            if stray:
                self._pilots.pop(link.job, None)
            elif adopted:
                log.info("pilot %s on %s redialed with %d worker(s)", link.job, link.node, len(link.workers))
            else:
                self._held[link.node] = link.job
                self._events.append(Event(time.time(), EventKind.NODE_JOIN, node=link.node,
                                          detail=f"pilot {link.job} holds it"))
        if stray:
            log.warning("pilot %s on %s is not needed there; cancelling it", link.job, link.node)
            self._cancel_quietly([link.job])
            return
        self._poke()

    def _on_leave(self, link: PilotLink, why: str) -> None:
        with self._lock:
            p = self._pilots.get(link.job)
            if p is not None and p.node == link.node:
                del self._pilots[link.job]
            left = self._release(link.node, link.job, why)
        if left:
            self._poke()
        if not link.leaving and not self._stop.is_set():
            self._cancel_quietly([link.job])   # lost contact: make sure the node goes back

    def _release(self, node: str, job: str, why: str) -> bool:
        """The node stops being harvested (under the lock). True if it was."""
        if self._held.get(node) != job:
            return False
        del self._held[node]
        self._events.append(Event(time.time(), EventKind.NODE_LEAVE, node=node, detail=why))
        return True

    def _poke(self) -> None:
        if self._wake is not None:
            self._wake()

    # ---- watching Slurm ----------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            try:
                self.poll_slurm()
            except Exception:             # never let the watcher die: the next poll tries again
                log.exception("reading Slurm failed")
            self._stop.wait(max(0.0, self.settings.poll_s - (time.monotonic() - t0)))

    def poll_slurm(self) -> None:
        """One round: read sinfo and squeue, then act on what changed."""
        asked = time.monotonic()
        with self._lock:
            known = {j for j, p in self._pilots.items() if p.submitted < asked}
        try:
            nodes = self.cli.nodes()
            jobs = [] if self.settings.dry_run else self.cli.jobs(self.settings.pilot_name, self.user)
        except SlurmUnavailable as e:
            self._set_status(SOURCE_STALE, f"cannot read Slurm: {e}")
            return
        self._slurm = {n.name: n for n in nodes}
        if self.settings.dry_run:
            self._dry_run()
            return
        self._set_status(SOURCE_OK, "")
        self._check_pilots({j.id: j for j in jobs}, known)
        self._trim()
        self._submit()

    def _check_pilots(self, jobs: dict[str, SlurmJob], known: set[str]) -> None:
        """The backstop: pilots that ended without a word; and pilots to cancel."""
        cancel, dropped, left = [], [], False
        now = time.monotonic()
        with self._lock:
            for jid, p in list(self._pilots.items()):
                j = jobs.get(jid)
                if (j is None and jid in known) or (j is not None and j.ended):
                    del self._pilots[jid]
                    left |= self._release(p.node, jid, f"pilot {jid} {j.state.lower() if j else 'is gone'} (squeue)")
                    dropped.append(jid)
                elif j is not None and not p.running:
                    node = self._slurm.get(p.node)
                    taken = j.state == "PENDING" and (node is None or not node.free)
                    if taken or now - p.submitted > self.settings.pending_timeout_s:
                        cancel.append(jid)
                        del self._pilots[jid]
                        if p.adopted:
                            left |= self._release(p.node, jid, f"pilot {jid} of the earlier run did not redial")
            self._cancelled &= {jid for jid, j in jobs.items() if not j.ended}
        if left:
            self._poke()
        for jid in dropped:           # Slurm says it is over: if it is still connected, hang up
            link = self.hub.link_of_job(jid) if self.hub is not None else None
            if link is not None:
                link.wire.close()
        if cancel:
            log.info("cancelling pilot(s) %s: their node was taken before they started, or they "
                     "did not connect within %g s", ", ".join(cancel), self.settings.pending_timeout_s)
            self._cancel_quietly(cancel)

    def free_nodes(self) -> list[str]:
        """Watched nodes Slurm has idle and we hold no pilot on, in machine order."""
        with self._lock:
            taken = {p.node for p in self._pilots.values()} | set(self._held)
        return [n for n in self._names if n not in taken and self._slurm.get(n) is not None
                and self._slurm[n].free]

    def _trim(self) -> None:
        """Cancel the pilots beyond what the jobs could use: pending ones at once (newest first),
        held ones no job uses once the surplus has lasted `release_grace_s` (demand often
        returns within minutes, and a pilot goes back through Slurm's queue)."""
        now = time.monotonic()
        with self._lock:
            active = [p for p in self._pilots.values() if not p.releasing]
            surplus = len(active) - min(self.settings.max_pilots, self._demand)
            if surplus <= 0:
                self._surplus_since = None
                return
            pending = [p for p in reversed(active) if not p.running and not p.adopted][:surplus]
            for p in pending:
                del self._pilots[p.job]
                self._cancelled.add(p.job)
            surplus -= len(pending)
            held: list[_Pilot] = []
            if surplus <= 0:
                self._surplus_since = None
            elif self._surplus_since is None:
                self._surplus_since = now
            elif now - self._surplus_since >= self.settings.release_grace_s:
                order = {n: i for i, n in enumerate(self._names)}
                idle = sorted((p for p in active if p.running and p.node not in self._in_use),
                              key=lambda p: -order.get(p.node, 0))
                held = idle[:surplus]
                for p in held:
                    p.releasing = True
                self._surplus_since = None
        cancel = [p.job for p in pending + held]
        if cancel:
            log.info("cancelling %d pilot(s) no job can use (%d pending, %d holding an unused node): %s",
                     len(cancel), len(pending), len(held), ", ".join(cancel))
            self._cancel_quietly(cancel)

    def _submit(self) -> None:
        s = self.settings
        with self._lock:
            active = sum(1 for p in self._pilots.values() if not p.releasing)
            room = min(s.max_pilots - len(self._pilots), self._demand - active)
        free = self.free_nodes()[:max(0, min(room, s.submit_batch))]
        for node in free:
            try:
                job = self.cli.submit(self._sbatch_options(node), self._script(), self._pilot_env())
            except SlurmUnavailable as e:
                log.warning("could not submit a pilot to %s: %s", node, e)
                return
            with self._lock:
                self._pilots.setdefault(job, _Pilot(job, node, time.monotonic()))

    def _dry_run(self) -> None:
        would = tuple(self.free_nodes()[:self.settings.max_pilots])
        with self._lock:
            changed, self._would = would != self._would, would
        if changed:
            log.info("dry run: would harvest %d node(s) with pilots in %s: %s", len(would),
                     self.settings.partition, ", ".join(would) or "none")
        self._set_status(SOURCE_DRY_RUN, f"would harvest {len(would)} node(s)" +
                         (f": {', '.join(would[:20])}" + (" ..." if len(would) > 20 else "") if would else ""))

    def _set_status(self, state: str, detail: str) -> None:
        old = self._status
        if old.state == state and old.detail == detail:
            return
        since = old.since if old.state == state else time.time()
        if state != old.state:
            (log.warning if state == SOURCE_STALE else log.info)(
                "Slurm source %s%s", state, f": {detail}" if detail else "")
        self._status = SourceStatus(self.name, state, detail, since)

    # ---- pilot jobs --------------------------------------------------------------------------
    def _sbatch_options(self, node: str) -> list[str]:
        s = self.settings
        opts = ["--partition", s.partition, "--job-name", s.pilot_name, "--nodelist", node, "--nodes", "1",
                "--ntasks", "1", "--exclusive", "--time", str(s.time_limit_min), "--chdir", s.workdir,
                "--output", f"{s.log_dir}/pilot-%j.log" if s.log_dir else "/dev/null",
                "--export", "ALL", "--no-requeue"]
        known = self._slurm.get(node)
        if known is not None and known.gpus:
            opts += ["--gres", f"gpu:{known.gpus}"]
        if s.qos:
            opts += ["--qos", s.qos]
        if s.account:
            opts += ["--account", s.account]
        return opts

    def _script(self) -> str:
        return PILOT_SCRIPT.format(python=self.settings.python, root=self.settings.workdir)

    def _pilot_env(self) -> dict[str, str]:
        assert self.hub is not None
        port = self.hub.address[1]
        return {ENV_HUB: f"{self.settings.dial_host}:{port}", ENV_HUB_SHA256: self.hub.fingerprint,
                ENV_TOKEN: self._token, ENV_GRACE: str(self.settings.worker_grace_s),
                ENV_ORPHAN: str(self.settings.orphan_timeout_s)}

    def _identity(self) -> tuple[HubIdentity, bool]:
        """The hub's port, token and certificate: those kept beside the store if an earlier run
        left them (True: pilots of that run may be alive and redial), else new ones."""
        path = Path(self.settings.state_file) if self.settings.state_file else None
        ident = identity.load(path) if path is not None else None
        return (ident, True) if ident is not None else (HubIdentity.new(), False)

    def _listen(self, ident: HubIdentity) -> PilotHub:
        """The hub, on the kept port unless the settings name one (then the earlier run's
        pilots cannot redial and are given back after `pending_timeout_s`)."""
        s = self.settings
        port = s.hub_port or ident.port

        def hub(port: int) -> PilotHub:
            return PilotHub(ident.token, self._on_hello, self._on_leave, s.hub_host, port,
                            max_connections=s.hub_connection_cap, identity=(ident.cert_pem, ident.key_pem))
        try:
            h = hub(port)
        except OSError as e:
            if s.hub_port or not port:
                raise
            log.warning("cannot listen on port %d again (%s): pilots of the earlier run cannot redial", port, e)
            h = hub(0)
        if s.state_file:
            identity.save(Path(s.state_file), ident.with_port(h.address[1]))
        return h

    def _adopt_leftovers(self) -> None:
        """After a restart: the running pilots of the earlier run (same name, same user, on a
        watched node) keep their nodes and are waited for, for `pending_timeout_s`; pending
        ones are cancelled (they hold nothing yet, and their node may be taken)."""
        try:
            jobs = [j for j in self.cli.jobs(self.settings.pilot_name, self.user) if not j.ended]
        except SlurmUnavailable:
            return
        now, cancel = time.monotonic(), []
        with self._lock:
            for j in jobs:
                if j.state == "RUNNING" and j.nodes in self._watched and j.nodes not in self._held:
                    self._pilots[j.id] = _Pilot(j.id, j.nodes, now, adopted=True)
                    self._held[j.nodes] = j.id
                    self._adopted.append(j.nodes)
                else:
                    cancel.append(j.id)
        if self._adopted:
            log.info("adopting %d pilot(s) of the earlier run; they redial: %s", len(self._adopted),
                     ", ".join(self._pilots[self._held[n]].job for n in self._adopted))
        if cancel:
            log.info("cancelling %d pilot(s) of the earlier run that hold no node: %s", len(cancel), ", ".join(cancel))
            self._cancel_quietly(cancel)

    def _cancel_leftovers(self) -> None:
        try:
            old = [j.id for j in self.cli.jobs(self.settings.pilot_name, self.user) if not j.ended]
        except SlurmUnavailable:
            return
        if old:
            log.info("cancelling %d pilot(s) of an earlier run: %s", len(old), ", ".join(old))
            self._cancel_quietly(old)

    def _cancel_quietly(self, jobs: list[str]) -> None:
        try:
            self.cli.cancel(jobs)
        except (SlurmUnavailable, BadJobId) as e:
            log.warning("could not cancel %s: %s", ", ".join(jobs), e)


def resolve_watch(settings: SlurmSettings, nodes: list[SlurmNode], cli: SlurmCli) -> list[str]:
    """The nodes to watch, in Slurm's order: those of `settings.watch` (partitions, node names,
    hostlists), or every node of the pilots' partition; all of them must be in that partition."""
    in_partition = [n.name for n in nodes if settings.partition in n.partitions]
    if not in_partition:
        names = sorted({p for n in nodes for p in n.partitions})
        raise SettingError("partition", f"Slurm has no partition {settings.partition!r} with nodes "
                                        f"(it has {', '.join(names) or 'none'})")
    if not settings.watch:
        return in_partition
    partitions = {p for n in nodes for p in n.partitions}
    known = {n.name for n in nodes}
    wanted: set[str] = set()
    for item in settings.watch:
        if item in partitions:
            wanted |= {n.name for n in nodes if item in n.partitions}
        elif item in known:
            wanted.add(item)
        elif "[" in item:
            try:
                names = cli.hostnames(item)
            except SlurmUnavailable as e:
                raise SettingError("watch", f"cannot expand {item!r}: {e}") from None
            unknown = [n for n in names if n not in known]
            if unknown:
                raise SettingError("watch", f"{item!r} names node(s) Slurm does not have: {', '.join(unknown[:5])}")
            wanted |= set(names)
        else:
            raise SettingError("watch", f"Slurm has no partition or node named {item!r}")
    outside = sorted(wanted - set(in_partition))
    if outside:
        raise SettingError("watch", f"{', '.join(outside[:5])} not in partition {settings.partition!r}: "
                                    f"no pilot could run there")
    return [n for n in in_partition if n in wanted]
