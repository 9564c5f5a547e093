"""The one place that builds a harvester: validated `HarvesterSettings` in, a harvester out
(replay; live with simulated, local or ssh workers on a static node list; or a Slurm cluster's
idle nodes held by pilot jobs, with workers inside the pilots). The CLI, the replay page, the
benchmarks and the tests only parse their input into settings and call `build`."""
from __future__ import annotations

import ipaddress
import logging
from dataclasses import replace
from functools import partial
from pathlib import Path
from urllib.parse import urlparse
from typing import Callable, Optional, Sequence

from .dispatchers.base import Dispatcher
from .dispatchers.simulated import SimulatedDispatcher
from .dispatchers.limits import GIB, JobLimits
from .dispatchers.workers import WorkerDispatcher
from .errors import SettingsError
from .inventory import load_inventory, local_nodes
from .nodecheck import NodeCheck, check_nodes
from .registrations import Registrations
from .service import Harvester, LiveHarvester, ReplayHarvester
from .settings import HarvesterSettings, LiveSettings, PilotSettings
from .pilots.base import Scheduler
from .pilots.hub import PilotHub
from .pilots.identity import beside as identity_beside
from .sources.base import LiveNodeSource
from .sources.static import StaticSource
from .storelock import StoreLock
from .transports.base import NodeSpec, Transport

log = logging.getLogger(__name__)


def build(settings: HarvesterSettings) -> Harvester:
    """A harvester ready to `open()`; raises SettingsError (or InputError for a bad file) with
    nothing started that would outlive the call."""
    harvester = _build(settings)
    harvester.user_max_jobs = settings.user_max_jobs
    harvester.registrations = Registrations(settings.registration_limits)
    return harvester


def _build(settings: HarvesterSettings) -> Harvester:
    if settings.live is None:
        return ReplayHarvester(settings.db, settings.replay_settings, speed=settings.speed,
                               tick_s=settings.tick, fresh=settings.fresh)
    live = settings.live
    lock = StoreLock(settings.db)
    if live.uses_pilots:
        lock.acquire()      # before the source, which adopts or cancels the pilots it finds as its own
        if settings.fresh:  # nothing of the earlier run is kept: its pilots are cancelled, not adopted
            identity_beside(settings.db).unlink(missing_ok=True)
    try:
        source, nodes, hub = node_source(live, settings.db)
    except BaseException:
        lock.release()
        raise
    dispatcher: Optional[Dispatcher] = None
    try:
        dispatcher = dispatcher_for(live, nodes, settings.db, hub)
        check_addresses(live, {n.name: source.address_of(n.name) or dispatcher.host_of(n.name) for n in nodes})
    except BaseException:
        if dispatcher is not None:
            dispatcher.close()
        source.close()
        lock.release()
        raise
    return LiveHarvester(settings.db, source, dispatcher, live.config, tick_s=settings.tick,
                         fresh=settings.fresh, require_command=live.real_workers, jpa=live.jpa,
                         slots={n.name: n.slots for n in nodes}, lock=lock,
                         maps_users=isinstance(dispatcher, WorkerDispatcher) and dispatcher.run_as is not None,
                         trust_user_commands=live.trust_user_commands, preflight=preflight_for(live, source, dispatcher, nodes))


def preflight_for(live: LiveSettings, source: LiveNodeSource, dispatcher: Dispatcher,
                  nodes: Sequence[NodeSpec]) -> Optional[Callable[[], object]]:
    """What the harvester does at its start before it offers a node: ssh nodes are checked."""
    if live.dispatcher == "ssh" and isinstance(source, StaticSource) and isinstance(dispatcher, WorkerDispatcher):
        return partial(trust_checked, source, dispatcher, live, nodes)
    return None


def trust_checked(source: StaticSource, dispatcher: WorkerDispatcher, live: LiveSettings,
                  nodes: Sequence[NodeSpec]) -> dict[str, NodeCheck]:
    """Check every ssh node before it is offered: one that fails is held out with its reason
    (until staff release it); the others' ranks bind the interface that reaches the head."""
    checks = check_nodes(dispatcher.transport, nodes, workdir=live.workdir, head=live.dial_host, listen=live.bind_host)
    for name, c in checks.items():
        if not c.ok:
            log.warning("node %s is not used: %s", name, c.line())
            source.hold_out(name, c.line())
        elif c.interface:
            dispatcher.interfaces[name] = c.interface
    return checks


def check_inventory(inventory: Path, ssh_config: Optional[Path] = None, workdir: str = "",
                    command: str = "", advertise: str = "", bind: str = "") -> dict[str, NodeCheck]:
    """`python -m app check`: the start's checks of every node of an ssh inventory, and that
    `command` (a job's interpreter) is found there; InputError for a bad inventory."""
    nodes = load_inventory(inventory)
    transport = transport_for("ssh", ssh_config)
    try:
        return check_nodes(transport, nodes, workdir=workdir, interpreter=command, head=advertise,
                           listen=bind or advertise)
    finally:
        transport.close()


def node_source(live: LiveSettings, db: Optional[Path] = None) -> tuple[LiveNodeSource, list[NodeSpec], Optional[PilotHub]]:
    """Where idle nodes come from, the nodes workers may run on, and (Slurm, PBS) the hub its
    pilots dial; a dry run has none. With a store (`db`), the hub's identity is kept beside it
    (`<db>.hub`): a restarted harvester is the hub its pilots redial."""
    if live.uses_pilots:
        from .pilots.base import SchedulerUnavailable
        from .pilots.identity import IdentityError
        from .pilots.source import PilotSource
        title = "PBS" if live.source == "pbs" else "Slurm"
        try:
            pilots = hub_settings(live)
            if db is not None and not pilots.state_file:
                pilots = replace(pilots, state_file=str(identity_beside(db)))
            source = PilotSource(pilots, scheduler_for(live.source, pilots))
        except SchedulerUnavailable as e:
            raise SettingsError("", f"cannot read {title}: {e}") from None
        except IdentityError as e:
            raise SettingsError("", str(e)) from None
        except SettingsError as e:
            raise e.within("live.slurm") from None
        return source, [NodeSpec(n, slots=source.slots_of(n)) for n in source.node_names()], source.hub
    specs = (local_nodes(live.local_nodes, live.local_slots) if live.local_nodes is not None
             else load_inventory(Path(live.inventory)))
    return StaticSource([n.name for n in specs]), specs, None


def hub_settings(live: LiveSettings) -> PilotSettings:
    """The Slurm settings with the one address story applied: pilots dial `advertise`, and the
    hub listens on `bind` (or the advertised address) unless the Slurm options said otherwise."""
    s = live.slurm
    if not (live.advertise or live.bind):
        return s
    return replace(s, hub_host=live.hub_host, advertise=s.advertise or live.dial_host)


def dispatcher_for(live: LiveSettings, nodes: Sequence[NodeSpec], db: Path,
                   hub: Optional[PilotHub] = None) -> Dispatcher:
    """What runs the jobs. Worker logs and checkpoints go beside the store (`DB.workers/`)."""
    if live.dispatcher == "simulated" or (live.uses_pilots and hub is None):
        return SimulatedDispatcher()          # a Slurm dry run never offers a node
    w = live.workers
    return WorkerDispatcher(transport_for(live.dispatcher, live.ssh_config, hub), nodes, Path(str(db) + ".workers"), report_base=live.report_url,
                            workdir=live.workdir, coordinator_host=live.dial_host,
                            coordinator_bind=live.bind_host, worker_env=live.worker_env,
                            stop_grace_s=w.stop_grace_s, vacate_grace_s=w.vacate_grace_s,
                            max_crashes=w.max_crashes, rejoin_after_s=w.rejoin_after_s, sample_s=w.sample_s,
                            crash_window_s=w.crash_window_s, heartbeat_timeout_s=w.heartbeat_timeout_s,
                            start_timeout_s=w.start_timeout_s, rendezvous_timeout_s=w.rendezvous_timeout_s,
                            run_as=live.launcher, limits=JobLimits(w.max_pids, int(w.max_checkpoint_gib * GIB)),
                            orphan_s=live.slurm.orphan_timeout_s if live.dispatcher == "pilot" else 0.0)


def check_addresses(live: LiveSettings, hosts: dict[str, Optional[str]]) -> None:
    """Refuse a loopback address for the harvester when a node is on another host (`hosts`:
    node -> where it is reached, None where not known): a pilot or worker there would dial its
    own loopback for the hub, its job's store and reports, and no job would train."""
    ours = [live.dial_host] + ([urlparse(live.report_url).hostname or ""] if live.report_url else [])
    if not any(is_loopback(h) for h in ours):
        return
    remote = [n for n, h in hosts.items() if h is not None and not is_loopback(h)]
    if remote:
        shown = ", ".join(remote[:3]) + (f" and {len(remote) - 3} more" if len(remote) > 3 else "")
        raise SettingsError("live.advertise", f"{shown} run on other hosts, which would dial their own "
                                              "loopback for the pilot hub, the jobs' stores and progress reports: set "
                                              "{live.advertise} to this host's address on their network")


def is_loopback(host: str) -> bool:
    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def scheduler_for(kind: str, pilots: PilotSettings) -> Scheduler:
    """The batch scheduler's provider for `--source` slurm or pbs."""
    if kind == "pbs":
        from .pbs.provider import PbsScheduler
        return PbsScheduler(pilots)
    from .slurm.provider import SlurmScheduler
    return SlurmScheduler(pilots)


def transport_for(kind: str, ssh_config: Optional[Path] = None, hub=None) -> Transport:
    """How a worker process is started on a node: local processes, OpenSSH, or inside the Slurm
    pilot job that holds the node (`hub`: the Slurm source's PilotHub)."""
    if kind == "local":
        from .transports.local import LocalTransport
        return LocalTransport()
    if kind == "ssh":
        from .transports.ssh import SshTransport
        return SshTransport(config=str(ssh_config) if ssh_config else None)
    if kind == "pilot" and hub is not None:
        from .pilots.transport import PilotTransport
        return PilotTransport(hub)
    raise SettingsError("dispatch", f"{kind} needs {{source}} slurm or pbs" if kind == "pilot" else
                        f"unknown dispatcher {kind!r}; choose local, ssh or pilot")
