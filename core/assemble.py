"""The one place that builds a harvester: validated `HarvesterSettings` in, a harvester out
(replay; live with simulated, local or ssh workers on a static node list; or a Slurm cluster's
idle nodes held by pilot jobs, with workers inside the pilots). The CLI, the replay page, the
benchmarks and the tests only parse their input into settings and call `build`."""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

from .dispatchers.base import Dispatcher
from .dispatchers.simulated import SimulatedDispatcher
from .dispatchers.workers import WorkerDispatcher
from .errors import SettingsError
from .inventory import load_inventory, local_nodes
from .service import Harvester, LiveHarvester, ReplayHarvester
from .settings import HarvesterSettings, LiveSettings
from .slurm.hub import PilotHub
from .sources.base import LiveNodeSource
from .sources.static import StaticSource
from .transports.base import NodeSpec, Transport


def build(settings: HarvesterSettings) -> Harvester:
    """A harvester ready to `open()`; raises SettingsError (or InputError for a bad file) with
    nothing started that would outlive the call."""
    if settings.live is None:
        return ReplayHarvester(settings.db, settings.replay_settings, speed=settings.speed,
                               tick_s=settings.tick, fresh=settings.fresh)
    live = settings.live
    source, nodes, hub = node_source(live)
    try:
        dispatcher = dispatcher_for(live, nodes, settings.db, hub)
    except BaseException:
        source.close()
        raise
    return LiveHarvester(settings.db, source, dispatcher, live.config, tick_s=settings.tick,
                         fresh=settings.fresh, require_command=live.real_workers, jpa=live.jpa)


def node_source(live: LiveSettings) -> tuple[LiveNodeSource, list[NodeSpec], Optional[PilotHub]]:
    """Where idle nodes come from, the nodes workers may run on, and (Slurm) the hub its pilots
    dial; a Slurm dry run has none."""
    if live.source == "slurm":
        from .slurm.cli import SlurmUnavailable
        from .slurm.source import SlurmSource
        try:
            source = SlurmSource(live.slurm)
        except SlurmUnavailable as e:
            raise SettingsError("", f"cannot read Slurm: {e}") from None
        except SettingsError as e:
            raise e.within("live.slurm") from None
        return source, [NodeSpec(n) for n in source.node_names()], source.hub
    specs = local_nodes(live.local_nodes) if live.local_nodes is not None else load_inventory(Path(live.inventory))
    return StaticSource([n.name for n in specs]), specs, None


def dispatcher_for(live: LiveSettings, nodes: Sequence[NodeSpec], db: Path,
                   hub: Optional[PilotHub] = None) -> Dispatcher:
    """What runs the jobs. Worker logs and checkpoints go beside the store (`DB.workers/`)."""
    if live.dispatcher == "simulated" or (live.source == "slurm" and hub is None):
        return SimulatedDispatcher()          # a Slurm dry run never offers a node
    w = live.workers
    return WorkerDispatcher(transport_for(live.dispatcher, live.ssh_config, hub), nodes,
                            Path(str(db) + ".workers"), report_base=live.report_url, workdir=live.workdir,
                            stop_grace_s=w.stop_grace_s, vacate_grace_s=w.vacate_grace_s,
                            max_crashes=w.max_crashes, rejoin_after_s=w.rejoin_after_s, sample_s=w.sample_s)


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
        from .slurm.transport import PilotTransport
        return PilotTransport(hub)
    raise SettingsError("dispatch", f"{kind} needs {{source}} slurm" if kind == "pilot" else
                        f"unknown dispatcher {kind!r}; choose local, ssh or pilot")
